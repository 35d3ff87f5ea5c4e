"""Generation batches of graded groups, and DAPO's dynamic sampling that fills one step.

A generation batch is ``batch_size`` prompts x ``group_size`` samples, each prompt rendered
and each completion graded by the run's task (steps/dapo/task.py). Every
prompt of a batch is submitted before any result is awaited (the SDK returns
futures), so a batch costs about one round trip, not one per prompt. A failed
request is resubmitted a bounded number of times; a group that still fails is
reported, never silently dropped. Only the service call is retried: an error in
decoding or grading is a bug and surfaces as one.

Dynamic sampling keeps a group only if its rewards are not all equal (an
all-equal group has zero advantage everywhere and no gradient) and draws
generation batches until ``batch_size`` groups are kept; kept groups beyond
that are carried into the next step. When the keep rate seen so far says one
more batch will not fill the step, further batches are started before the
current one returns (how many is the scheduling policy's choice, steps/dapo/schedule.py):
an over-shoot's surplus is carried, which is cheaper than an extra sequential round trip
(``make bench``). Batches still in flight once the step is full are not waited for: they
are the next step's first.
"""
from __future__ import annotations

import hashlib
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from botocore.exceptions import ClientError
from sagemaker.train.training_session import SamplingParams

from steps.dapo.chat import completion_text, opens_reasoning
from steps.dapo.reward import RewardShaping, reward
from steps.dapo.task import Grade, Task
from steps.platform.billing import TokenMeter
from steps.platform.failfast import ServiceUnreachable

log = logging.getLogger(__name__)

#: Error codes meaning the session itself no longer serves (stopped, failed, gone):
#: resubmitting cannot help, so the step fails at once rather than drawing
#: generation batches of nothing until max_num_gen_batches and blaming the data.
SESSION_GONE = frozenset({"ConflictException", "ResourceNotFoundException"})


@dataclass(frozen=True)
class Rollout:
    """One sampled completion, its grade and its reward."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    # The service's verdict: "stop" when the model ended its turn (it sampled its end-of-turn token, e.g.
    # <|im_end|>, <|return|>, <eos>), "length" when max_tokens cut it off (masked by overlong filtering).
    stop_reason: str
    reward: float
    grade: Grade


@dataclass(frozen=True)
class Group:
    """``group_size`` completions of one prompt."""

    example_index: int
    prompt: tuple[int, ...]
    rollouts: tuple[Rollout, ...]
    sampler_step: int = 0  # optimizer steps in the weights that sampled it: how off-policy it is when trained

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.rollouts]

    def is_informative(self) -> bool:
        """Rewards not all equal: the group has a non-zero advantage somewhere."""
        return len(set(self.rewards)) > 1

    def all_wrong(self) -> bool:
        return not any(r.grade.correct for r in self.rollouts)


def derived_seed(*parts: int) -> int:
    """A seed derived from others: (run seed, generation batch) -> batch seed, (batch seed, k) -> request seed.

    SamplingParams.seed is a Smithy Integer (32-bit signed) on the real API, so
    seeds are hashed into [0, 2**31 - 1] instead of multiplied out of range.
    """
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


def _session_gone(exc: Exception) -> bool:
    """Resubmitting cannot help: the session is gone, or its service does not answer at all."""
    return isinstance(exc, ServiceUnreachable) or (
        isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in SESSION_GONE)


@dataclass(frozen=True)
class GenerationBatch:
    """One generation batch in flight; :meth:`result` waits for it (None = a group whose requests failed)."""

    sampler: "GroupSampler"
    client: Any
    indices: tuple[int, ...]
    seed: int | None
    futures: tuple[Any, ...]
    sampler_step: int = 0  # the optimizer step of the weights that sample it, stamped on its groups

    def result(self) -> list[Group | None]:
        return [self.sampler.resolve(self, k) for k in range(len(self.indices))]


@dataclass
class GroupSampler:
    """Turns a task's examples into graded groups through one SamplingClient."""

    task: Task[Any]
    tokenizer: Any
    examples: Sequence[Any]
    group_size: int
    params: SamplingParams
    shaping: RewardShaping
    sample_retries: int = 2
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # session.chat_template_kwargs
    meter: TokenMeter | None = None  # counts each completed request's billable tokens (steps/platform/billing.py)

    def __post_init__(self) -> None:
        self._prompts: dict[int, tuple[int, ...]] = {}
        self._reasoning_open: dict[int, bool] = {}  # the prompt leaves a <think> block open

    def prompt(self, index: int) -> tuple[int, ...]:
        if index not in self._prompts:
            prompt = tuple(self.task.prompt(self.examples[index], self.tokenizer, self.chat_template_kwargs))
            self._prompts[index] = prompt
            self._reasoning_open[index] = opens_reasoning(self.tokenizer, prompt)
        return self._prompts[index]

    def text(self, index: int, tokens: Sequence[int]) -> str:
        """A completion of prompt ``index`` as the grader reads it (steps/dapo/chat.py)."""
        self.prompt(index)
        return completion_text(self.tokenizer, tokens, self._reasoning_open[index])

    def launch(self, client: Any, indices: Sequence[int], seed: int | None, sampler_step: int = 0) -> GenerationBatch:
        """Submit one sample request per prompt; nothing is awaited."""
        futures = tuple(self._submit(client, i, seed, k) for k, i in enumerate(indices))
        return GenerationBatch(self, client, tuple(indices), seed, futures, sampler_step)

    def _submit(self, client: Any, index: int, seed: int | None, k: int) -> Any:
        params = self.params if seed is None else self.params.model_copy(update={"seed": derived_seed(seed, k)})
        return client.sample(list(self.prompt(index)), num_samples=self.group_size, sampling_params=params)

    def resolve(self, batch: GenerationBatch, k: int) -> Group | None:
        """Wait for request ``k`` of ``batch``, resubmitting a failed one up to ``sample_retries`` times;
        grade what came back."""
        index, fut = batch.indices[k], batch.futures[k]
        for attempt in range(self.sample_retries + 1):
            try:
                response = fut.result()
            except Exception as exc:  # the SDK already retried throttling; this is a failed op
                if _session_gone(exc):
                    raise
                if attempt == self.sample_retries:
                    log.warning("sampling failed for example %d after %d attempts: %s", index, attempt + 1, exc)
                    return None
                fut = self._submit(batch.client, index, batch.seed, k)
                continue
            if self.meter is not None:  # the prompt as sent, once per request; the tokens as received
                self.meter.sampled(len(self.prompt(index)), [seq.tokens for seq in response.sequences])
            return self._group(index, response, batch.sampler_step)
        return None

    def _group(self, index: int, response: Any, sampler_step: int) -> Group:
        example = self.examples[index]
        rollouts = []
        for seq in response.sequences:
            tokens = tuple(int(t) for t in seq.tokens)
            result = self.task.grade(self.text(index, tokens), example)
            stop = seq.stop_reason.value if hasattr(seq.stop_reason, "value") else str(seq.stop_reason)
            rollouts.append(Rollout(tokens, tuple(seq.logprobs or ()), stop,
                                    reward(result, len(tokens), self.shaping), result))
        return Group(index, self.prompt(index), tuple(rollouts), sampler_step)


# -- dynamic sampling ------------------------------------------------------------------------
@dataclass(frozen=True)
class StepBatch:
    """What dynamic sampling drew for one step."""

    kept: tuple[Group, ...]  # exactly batch_size unless hit_cap
    carry: tuple[Group, ...]  # surplus kept groups for the next step
    sampled: tuple[Group, ...]  # every group sampled this step (carried-in groups excluded)
    gen_batches: int
    failed_groups: int
    empty_rollouts: int  # generation batches in which every request failed
    speculative: int  # batches started before the previous one returned
    hit_cap: bool
    in_flight: tuple["GenerationBatch", ...] = ()  # spares still running once the step was full: the next step's

    @property
    def informative(self) -> int:
        return sum(g.is_informative() for g in self.sampled)

    @property
    def filtered(self) -> int:
        return len(self.sampled) - self.informative

    @property
    def filtered_all_wrong(self) -> int:
        """Filtered groups without a single correct completion: too hard for the model (yet)."""
        return sum(not g.is_informative() and g.all_wrong() for g in self.sampled)


#: How many generation batches to start now, given (need, in_flight, batch_size, keep_rate, budget, fresh):
#: the scheduling policy's choice (:meth:`steps.dapo.schedule.Policy.batches_to_launch`).
BatchesToLaunch = Callable[[int, int, int, float, int, bool], int]


@dataclass
class Draws:
    """One step's dynamic sampling as it goes: the groups kept and sampled, the batches in flight."""

    carry: tuple[Group, ...]
    evidence: tuple[int, int]  # (informative, sampled) groups of the run before this step
    kept: list[Group] = field(default_factory=list)
    sampled: list[Group] = field(default_factory=list)
    in_flight: deque[GenerationBatch] = field(default_factory=deque)
    launched: int = 0
    failed: int = 0
    empty: int = 0
    speculative: int = 0

    def __post_init__(self) -> None:
        self.kept = list(self.carry)

    def keep_rate(self) -> float:
        """Informative groups per sampled group over the run so far, this step's included."""
        informative = self.evidence[0] + len(self.kept) - len(self.carry)
        seen = self.evidence[1] + len(self.sampled)
        return informative / seen if seen else 1.0  # no evidence yet: assume all kept, never speculate blind

    def receive(self, results: list[Group | None]) -> None:
        """Grade-filter one generation batch: keep the groups whose rewards are not all equal."""
        groups = [g for g in results if g is not None]
        self.failed += len(results) - len(groups)
        self.empty += bool(results) and not groups
        self.sampled.extend(groups)
        self.kept.extend(g for g in groups if g.is_informative())

    def step_batch(self, batch_size: int) -> StepBatch:
        # The oldest groups are trained now, the freshest carried: a carried group is a step older when trained.
        kept = sorted(self.kept, key=lambda g: g.sampler_step)
        return StepBatch(kept=tuple(kept[:batch_size]), carry=tuple(kept[batch_size:]), sampled=tuple(self.sampled),
                         gen_batches=self.launched, failed_groups=self.failed, empty_rollouts=self.empty,
                         speculative=self.speculative, hit_cap=len(kept) < batch_size,
                         in_flight=tuple(self.in_flight))


def collect_step(launch: Callable[[], GenerationBatch], carry: Sequence[Group], batch_size: int,
                 max_num_gen_batches: int, batches_to_launch: BatchesToLaunch, evidence: tuple[int, int],
                 newer_weights: Callable[[], None] | None = None, in_flight: Sequence[GenerationBatch] = (),
                 spares: bool = True) -> StepBatch:
    """Draw generation batches until ``batch_size`` groups are kept or ``max_num_gen_batches`` are drawn.

    ``evidence`` is (informative, sampled) groups of the run before this step: with this step's
    own, it is the keep rate from which ``batches_to_launch`` decides how many batches to start at once.
    ``in_flight``: the previous step's spares, still running; the step's own still running once it is
    full are returned the same way (``StepBatch.in_flight``), so a spare never delays a step.
    ``newer_weights`` (sampling ahead): waits until the update this step overlaps is done and makes
    ``launch`` sample its weights. Before it, only the batches the step is expected to need are
    started (a surplus sampled on the older weights would be too stale to carry); it is called
    before the first wait, and the spares are started on the newer weights. ``spares``: whether a
    surplus can be carried at all (not in a run's last step).
    """
    draws = Draws(tuple(carry), evidence, in_flight=deque(in_flight))
    fresh = newer_weights is None
    while True:
        need = batch_size - len(draws.kept)
        if need <= 0:
            return draws.step_batch(batch_size)
        n = batches_to_launch(need, len(draws.in_flight), batch_size, draws.keep_rate(),
                              max_num_gen_batches - draws.launched, fresh and spares)
        draws.speculative += max(0, n - (0 if draws.in_flight else 1))
        for _ in range(n):
            draws.in_flight.append(launch())
            draws.launched += 1
        if not fresh:
            newer_weights()  # type: ignore[misc]
            fresh = True
            continue
        if not draws.in_flight:
            return draws.step_batch(batch_size)
        draws.receive(draws.in_flight.popleft().result())
