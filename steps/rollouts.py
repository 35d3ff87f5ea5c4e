"""Sampling groups of completions and grading them.

Every prompt of a generation batch is submitted before any result is awaited:
the SDK returns futures, so a batch costs about one round trip, not one per
prompt. A failed request is resubmitted a bounded number of times; a group
that still fails is reported, never silently dropped.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from botocore.exceptions import ClientError
from sagemaker.train.training_session import SamplingParams

from steps import gsm8k
from steps.advantages import overlong_penalty
from steps.data import Example

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rollout:
    """One sampled completion and its grade."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: str  # "stop" | "length"
    reward: float
    correct: bool
    formatted: bool


@dataclass(frozen=True)
class Group:
    """``group_size`` completions of one prompt."""

    example_index: int
    prompt: tuple[int, ...]
    rollouts: tuple[Rollout, ...]

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]


@dataclass(frozen=True)
class RewardShaping:
    max_tokens: int
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0


Grader = Callable[[str, Example], gsm8k.Grade]
#: Error codes meaning the session itself no longer serves (stopped, failed, gone):
#: resubmitting cannot help, so the step fails at once rather than drawing
#: generation batches of nothing until max_num_gen_batches and blaming the data.
SESSION_GONE = frozenset({"ConflictException", "ResourceNotFoundException"})


def _session_gone(exc: Exception) -> bool:
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in SESSION_GONE


def request_seed(batch_seed: int, k: int) -> int:
    """The sampling seed of request ``k`` of a generation batch.

    SamplingParams.seed is a Smithy Integer (32-bit signed) on the real API, so
    seeds are hashed into [0, 2**31 - 1] instead of multiplied out of range.
    """
    digest = hashlib.blake2b(f"{batch_seed}:{k}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def default_grader(text: str, example: Example) -> gsm8k.Grade:
    return gsm8k.grade(text, example.gold)


@dataclass
class GroupSampler:
    """Turns prompts into graded groups through one SamplingClient."""

    tokenizer: Any
    examples: Sequence[Example]
    group_size: int
    params: SamplingParams
    shaping: RewardShaping
    retries: int = 2
    grader: Grader = default_grader

    def __post_init__(self) -> None:
        self._prompts: dict[int, tuple[int, ...]] = {}

    def prompt(self, index: int) -> tuple[int, ...]:
        if index not in self._prompts:
            self._prompts[index] = tuple(gsm8k.render_prompt(self.tokenizer, self.examples[index].question))
        return self._prompts[index]

    def submit(self, client: Any, indices: Sequence[int], seed: int | None) -> list[Any]:
        """Submit one sample request per prompt; returns the futures, in order."""
        return [self._submit_one(client, i, seed, k) for k, i in enumerate(indices)]

    def _submit_one(self, client: Any, index: int, seed: int | None, k: int) -> Any:
        params = self.params if seed is None else self.params.model_copy(update={"seed": request_seed(seed, k)})
        return client.sample(list(self.prompt(index)), num_samples=self.group_size, sampling_params=params)

    def collect(self, client: Any, indices: Sequence[int], futures: list[Any], seed: int | None) -> list[Group | None]:
        """Wait for the futures; resubmit failures up to ``retries`` times. None = failed group."""
        groups: list[Group | None] = []
        for k, (index, fut) in enumerate(zip(indices, futures)):
            groups.append(self._resolve(client, index, fut, seed, k))
        return groups

    def _resolve(self, client: Any, index: int, fut: Any, seed: int | None, k: int) -> Group | None:
        for attempt in range(self.retries + 1):
            try:
                return self._grade(index, fut.result())
            except Exception as exc:  # the SDK already retried throttling; this is a failed op
                if _session_gone(exc):
                    raise
                if attempt == self.retries:
                    log.warning("sampling failed for example %d after %d attempts: %s", index, attempt + 1, exc)
                    return None
                fut = self._submit_one(client, index, seed, k)
        return None

    def _grade(self, index: int, response: Any) -> Group:
        example = self.examples[index]
        rollouts = []
        for seq in response.sequences:
            tokens = tuple(int(t) for t in seq.tokens)
            text = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
            grade = self.grader(text, example)
            reward = gsm8k.reward(grade) + overlong_penalty(
                len(tokens), self.shaping.max_tokens, self.shaping.overlong_buffer, self.shaping.overlong_penalty
            )
            stop = seq.stop_reason.value if hasattr(seq.stop_reason, "value") else str(seq.stop_reason)
            rollouts.append(Rollout(tokens, tuple(seq.logprobs or ()), stop, reward, grade.correct, grade.formatted))
        return Group(index, self.prompt(index), tuple(rollouts))
