"""Generation batches of graded groups, and DAPO's dynamic sampling that fills one step.

A generation batch is ``batch_size`` prompts x ``group_size`` samples, each prompt rendered and each completion
graded by the run's task (steps/dapo/task.py) and rewarded here (:func:`reward`: the one place a grade becomes a
reward, so what is rewarded and what is reported as correct cannot drift apart). Every prompt of a batch is
submitted before any result is awaited (the SDK returns futures), so a batch costs about one round trip, not one
per prompt. A failed request is resubmitted a bounded number of times; a group that still fails is reported,
never silently dropped. Only the service call is retried: an error in decoding or grading is a bug and surfaces
as one.

Dynamic sampling (:meth:`Filling.collect`) keeps a group only if its rewards are not all equal (an all-equal
group has zero advantage everywhere and no gradient) and draws generation batches until ``batch_size`` groups
are kept; kept groups beyond that are carried into the next step. When the keep rate seen so far says one more
batch will not fill the step, further batches are started before the current one returns
(:func:`batches_to_launch`): an over-shoot's surplus is carried, which is cheaper than an extra sequential round
trip (``make bench``). Batches still in flight once the step is full are not waited for: they are the next
step's first. The prompts come from the seeded data order (:class:`Cursor`), passed through the selective-
rollout filter when it is on (steps/dapo/selective.py).
"""
from __future__ import annotations

import hashlib
import logging
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
from botocore.exceptions import ClientError
from sagemaker.train.training_session import SamplingParams

from steps.config.models import RewardFormat
from steps.dapo.chat import completion_text, opens_reasoning
from steps.dapo.selective import Selector
from steps.dapo.task import Grade, Task
from steps.platform.billing import TokenMeter
from steps.platform.failfast import ServiceUnreachable

log = logging.getLogger(__name__)

#: Error codes meaning the session itself no longer serves (stopped, failed, gone):
#: resubmitting cannot help, so the step fails at once rather than drawing
#: generation batches of nothing until max_num_gen_batches and blaming the data.
SESSION_GONE = frozenset({"ConflictException", "ResourceNotFoundException"})
#: The most optimizer steps a group is trained after the weights that sampled it, unless
#: ``max_steps_off_policy: 2`` allows two (steps/dapo/loop.py, ``off_policy_limit``). Surplus groups carried into
#: the next step are one step old; sampling ahead (max_steps_off_policy 1) makes a step's groups one step old,
#: and the ones it would carry two: those are dropped. The PPO ratio against the sampler's logprobs (and its
#: clip) is what makes a step-old group safe to train on.
OFF_POLICY_LIMIT = 1
#: Fresh generation batches (whose surplus is carried) cover a step's need unless the keep rate falls this many
#: binomial standard deviations short: a step that comes up short waits a whole extra round.
SPARE_SD = 2.0


# -- the reward ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RewardShaping:
    """How a grade becomes a reward: which reading pays (``strict``: committed in the instructed form, the
    default and what approval compares; ``lenient``: also an answer found some other way), and DAPO's soft
    overlong punishment (eq. 13), off while ``overlong_buffer`` is 0."""

    max_tokens: int
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0
    reward_format: RewardFormat = "strict"


def overlong_penalty(length: int, shaping: RewardShaping) -> float:
    """0 up to ``max_tokens - overlong_buffer`` tokens, then falling linearly to ``-overlong_penalty``."""
    if shaping.overlong_buffer <= 0:
        return 0.0
    start = shaping.max_tokens - shaping.overlong_buffer
    if length <= start:
        return 0.0
    if length >= shaping.max_tokens:
        return -shaping.overlong_penalty
    return -shaping.overlong_penalty * (length - start) / shaping.overlong_buffer


def reward(result: Grade, length: int, shaping: RewardShaping) -> float:
    """1 for a correct answer (under ``shaping.reward_format``), 0 otherwise, plus the overlong
    punishment of a ``length``-token completion."""
    paid = result.correct if shaping.reward_format == "strict" else result.correct_lenient
    return (1.0 if paid else 0.0) + overlong_penalty(length, shaping)


# -- graded groups ---------------------------------------------------------------------------
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
class SamplerAt:
    """A SamplingClient and the optimizer step of the weights it samples."""

    step: int
    client: Any


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


# -- the data order --------------------------------------------------------------------------
@dataclass(frozen=True)
class DataPosition:
    epoch: int = 0
    offset: int = 0


def take(n_examples: int, batch_size: int, seed: int, pos: DataPosition) -> tuple[list[int], DataPosition]:
    """The next ``batch_size`` example indices from ``pos`` (one generation batch), wrapping into new epochs.
    Each epoch is a fresh permutation drawn from ``(seed, epoch)``, so the whole order is a pure function of the
    seed and a resume needs only the position: no RNG state to pickle, no prompt seen twice in an epoch."""
    if n_examples < 1:
        raise ValueError("no training examples")
    out: list[int] = []
    epoch, offset = pos.epoch, pos.offset
    while len(out) < batch_size:
        perm = np.random.default_rng([seed, epoch]).permutation(n_examples)
        chunk = perm[offset : offset + batch_size - len(out)]
        out.extend(int(i) for i in chunk)
        offset += len(chunk)
        if offset >= n_examples:
            epoch, offset = epoch + 1, 0
    return out, DataPosition(epoch, offset)


@dataclass
class Cursor:
    """Where a step's next generation batch is drawn from, as the step draws them: the data position, and
    the generation batches drawn over the run (the count seeds each batch's sampling requests)."""

    position: DataPosition
    drawn: int

    def next(self, n_examples: int, batch_size: int, seed: int,
             selector: Selector | None = None) -> tuple[list[int], int]:
        """The next generation batch's example indices and its sampling seed; with a ``selector``, the prompts
        it skips are passed over (they count as drawn: the epoch moves on past them)."""
        batch_seed = derived_seed(seed, self.drawn)
        if selector is None:
            indices, self.position = take(n_examples, batch_size, seed, self.position)
        else:
            indices = self._selected(n_examples, batch_size, seed, selector)
        self.drawn += 1
        return indices, batch_seed

    def _selected(self, n_examples: int, batch_size: int, seed: int, selector: Selector) -> list[int]:
        """``batch_size`` prompts the selector keeps, in data order. After an epoch's worth looked at, the rest
        are taken as they come: a batch is never left short because every prompt in sight was predicted
        all-equal. The skips are seeded per batch, so a resume skips the same."""
        rng = np.random.default_rng([seed, self.drawn, 31])
        chosen: list[int] = []
        seen = 0
        while len(chosen) < batch_size:
            candidates, self.position = take(n_examples, batch_size - len(chosen), seed, self.position)
            for index in candidates:
                seen += 1
                if seen > n_examples or selector.keep(index, rng):
                    chosen.append(index)
        return chosen


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
    in_flight: tuple[GenerationBatch, ...] = ()  # spares still running once the step was full: the next step's

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


def batches_for(need: int, batch_size: int, keep_rate: float, spare_sd: float) -> int:
    """The fewest generation batches whose kept groups, at ``keep_rate``, reach ``need`` even ``spare_sd``
    standard deviations below their mean (each prompt's group kept or not, independently)."""
    p = max(keep_rate, 1e-3)
    n = max(1, math.ceil(need / (p * batch_size)))
    while n * batch_size * p - spare_sd * math.sqrt(n * batch_size * p * (1 - p)) < need:
        n += 1
    return n


def batches_to_launch(need: int, in_flight: int, batch_size: int, keep_rate: float, budget: int,
                      fresh: bool = True, max_inflight: int | None = None) -> int:
    """How many new generation batches to start now, all at once: a batch started after the others
    return adds a whole round, the tail of its longest sequence.

    ``fresh``: the surplus of a batch started now can be carried into the next step. Then enough
    that the batches in flight fill the remaining ``need`` unless the keep rate falls ``SPARE_SD``
    standard deviations short (:func:`batches_for`). Not fresh (sampled ahead, before the update it
    overlaps is done: a carried group would be two steps old and dropped), only the batches the keep
    rate expects the step to need, rounded up: rounded down, a step came up short more often than not
    and waited a whole extra round for the spares started after the update (``make bench``, decode x2
    at 20% keep: 1.31 -> 1.21 of the critical path, the same tokens sampled). Either way at least one
    when nothing is in flight and the step needs groups. Within the cap's ``budget``, and
    ``max_inflight`` (``max_inflight_gen_batches``) when set.
    """
    if need <= 0 or budget <= 0:
        return 0
    wanted = batches_for(need, batch_size, keep_rate, SPARE_SD if fresh else 0.0) - in_flight
    cap = budget if max_inflight is None else min(budget, max_inflight - in_flight)
    return max(0, min(wanted, cap))


@dataclass
class Draws:
    """One step's dynamic sampling as it goes: where its prompts come from, the groups kept and sampled, the
    batches in flight. Mutable, and owned by the one fill that draws it."""

    cursor: Cursor
    carry: tuple[Group, ...]
    evidence: tuple[int, int]  # (informative, sampled) groups of the run before this step
    selector: Selector | None = None  # selective rollouts' filter on the prompts drawn (None: off)
    in_flight: deque[GenerationBatch] = field(default_factory=deque)
    kept: list[Group] = field(default_factory=list)
    sampled: list[Group] = field(default_factory=list)
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


@dataclass(frozen=True)
class Filling:
    """How a run's steps are filled: its group sampler and the dynamic-sampling settings."""

    groups: GroupSampler
    batch_size: int
    max_num_gen_batches: int
    seed: int
    max_inflight: int | None = None  # max_inflight_gen_batches; None: as many as the keep rate says

    def launch(self, draws: Draws, at: SamplerAt, fresh: bool = True) -> None:
        """Start the generation batches :func:`batches_to_launch` says the step needs now, on ``at``'s weights,
        every request of them on the service before any is awaited."""
        n = batches_to_launch(self.batch_size - len(draws.kept), len(draws.in_flight), self.batch_size,
                              draws.keep_rate(), self.max_num_gen_batches - draws.launched, fresh, self.max_inflight)
        draws.speculative += max(0, n - (0 if draws.in_flight else 1))
        for _ in range(n):
            indices, seed = draws.cursor.next(len(self.groups.examples), self.batch_size, self.seed, draws.selector)
            batch = self.groups.launch(at.client, indices, seed, at.step)
            for future in batch.futures:
                future.operation_id  # noqa: B018 - blocks until the submit round trip is done
            draws.in_flight.append(batch)
            draws.launched += 1

    def collect(self, draws: Draws, at: SamplerAt, spares: bool = True) -> StepBatch:
        """Draw generation batches on ``at``'s weights until ``batch_size`` groups are kept or
        ``max_num_gen_batches`` are drawn, receiving them in launch order. ``spares``: whether a surplus can be
        carried at all (not in a run's last step): then spare batches go out with the expected ones."""
        while len(draws.kept) < self.batch_size:
            self.launch(draws, at, fresh=spares)
            if not draws.in_flight:
                break
            draws.receive(draws.in_flight.popleft().result())
        return draws.step_batch(self.batch_size)
