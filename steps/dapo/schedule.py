"""What runs while what waits: the overlap of one DAPO step with the next.

The loop (steps/dapo/loop.py) says what a step does; a :class:`Schedule` says when each part is waited on:

- A checkpoint step's ``save_state`` is queued behind its update and awaited only after the next
  step's sampling (or at the end); ``checkpoint.json`` is written then, so it only ever names a state
  that exists. A failed step still writes it on the way out if that save finished.
- With ``max_steps_off_policy: 1`` the next step's sampling runs while a step trains, on the weights
  the step trained from (as verl's one-step-off-policy recipe and tinker-cookbook's async mode do).
  Each group carries the step of the weights that sampled it; the train line logs how many steps
  off-policy a step trained, and no group is trained more than ``OFF_POLICY_LIMIT`` steps off-policy.
- With ``max_steps_off_policy: null`` (auto, the default) the run measures whether that overlap pays
  (:class:`Overlap`): step 1 and 2 sample and train one after the other, step 2 trains while step 3
  samples (the probe), and from then on the run samples ahead only if the probe step saved at least
  ``MIN_HIDDEN_SHARE`` of what an overlap can save, ``min(S, T)``, against step 2's sampling and that
  training one after the other: when sampling is the longer, the training hides under it; when training
  is, the sampling does. On GPUs that sampler and trainer share, training pauses decoding and the overlap
  cannot pay: the run goes back on-policy, as it does wherever on-policy measured faster. Step 2's sampling
  is the reference, not step 1's: step 1 starts one generation batch blind (no keep rate seen yet), so its
  time is no typical fill's (a probe at step 1 sent 5% keep runs on-policy: ``make bench``).
- A step's seconds leave evaluation out.

How much runs at once is :class:`Policy`'s: one small piece to replace when that choice changes.
``bench/loops.py`` builds its sequential baseline from one.
"""
from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from steps.config import DapoConfig
from steps.dapo import state as checkpoint
from steps.dapo.sampling import Group, StepBatch
from steps.dapo.state import LoopState

log = logging.getLogger(__name__)

#: The most optimizer steps a group is ever trained after the weights that sampled it. Surplus groups
#: carried into the next step are one step old; sampling ahead (max_steps_off_policy 1) makes a step's
#: groups one step old, and the ones it would carry two: those are dropped. The PPO ratio against the
#: sampler's logprobs (and its clip) is what makes a step-old group safe to train on.
OFF_POLICY_LIMIT = 1
#: The least share of the most an overlap can save, ``min(S, T)``, that the probe step must save for sampling
#: ahead to be kept (auto). On separate GPUs the overlap hides the shorter of sampling and training under the
#: longer, nearly all of it; on GPUs that sampler and trainer share it hides none, and the steps' sampling times
#: differ by a few seconds either way. Measured against ``min(S, T)`` rather than the whole step, so that noise
#: does not decide a short side's case (``make bench``: training x0.25 at 20% keep hides 3 s under 30 s of
#: sampling; a trainer-bound session hides its sampling under a longer training). Against the training alone
#: (before issue 30) a trainer-bound run could never pass: its saving, the sampling, is under half the training.
MIN_HIDDEN_SHARE = 0.5
#: Fresh generation batches (whose surplus is carried) cover a step's need unless the keep rate falls this many
#: binomial standard deviations short: a step that comes up short waits a whole extra round.
SPARE_SD = 2.0


def batches_for(need: int, batch_size: int, keep_rate: float, spare_sd: float) -> int:
    """The fewest generation batches whose kept groups, at ``keep_rate``, reach ``need`` even ``spare_sd``
    standard deviations below their mean (each prompt's group kept or not, independently)."""
    p = max(keep_rate, 1e-3)
    n = max(1, math.ceil(need / (p * batch_size)))
    while n * batch_size * p - spare_sd * math.sqrt(n * batch_size * p * (1 - p)) < need:
        n += 1
    return n


def overlap_pays(sampling_s: float, training_s: float, overlapped_s: float) -> bool:
    """Whether a step that trained while the next one sampled (``overlapped_s``: from its update's submit
    to both done) saved at least ``MIN_HIDDEN_SHARE`` of the most an overlap can save, the shorter of the
    two (``min(S, T)``), against an on-policy step's sampling (``sampling_s``) and the same training
    (``training_s``) one after the other. Like with like: whichever side is the bottleneck, and never when
    on-policy was as fast (a saving of zero or less)."""
    saved = sampling_s + training_s - overlapped_s
    hideable = min(sampling_s, training_s)
    return hideable > 0 and saved > 0 and saved >= MIN_HIDDEN_SHARE * hideable


@dataclass(frozen=True)
class Overlap:
    """The auto decision's evidence (``max_steps_off_policy: null``): the last on-policy sampling and the
    last training waited on alone, in the run's clock's seconds; ``verdict`` once a probe step has run."""

    sampling_s: float | None = None
    training_s: float | None = None
    verdict: bool | None = None

    def sample_ahead(self) -> bool:
        """Sample the next step ahead: the verdict, or the probe once both figures are measured."""
        if self.verdict is not None:
            return self.verdict
        return self.sampling_s is not None and self.training_s is not None

    def sampled(self, seconds: float, groups: int) -> "Overlap":
        """An on-policy fill; one that sampled nothing (carried groups filled it) says nothing."""
        return replace(self, sampling_s=seconds) if groups else self

    def trained(self, seconds: float, ahead: bool, update_s: float, groups: int = 0) -> "Overlap":
        """After a step's update (``seconds`` until it and any sampling ahead, of ``groups``, were done,
        ``update_s`` until the update was): alone, its training time; the probe (the first step sampled
        ahead that sampled something), the verdict. The probe's own training time prices the on-policy
        step it is compared with: a step's training varies with its tokens, and runs at full speed with
        sampling beside it or not."""
        if not ahead:
            return replace(self, training_s=seconds)
        if self.verdict is None and self.sample_ahead() and groups:  # (a fixed max_steps_off_policy: unmeasured)
            assert self.sampling_s is not None
            return replace(self, verdict=overlap_pays(self.sampling_s, update_s, seconds))
        return self


@dataclass(frozen=True)
class Policy:
    """How much runs at once. :meth:`from_config` is the product's; the two switches exist for
    ``make bench``'s sequential baseline (the loop before any overlap)."""

    max_inflight_gen_batches: int | None = None  # None: as many as the keep rate says the step needs
    max_steps_off_policy: int | None = None  # None: auto, measured (:class:`Overlap`)
    carry_surplus: bool = True  # False: kept groups beyond batch_size are dropped, not trained next step
    save_behind: bool = True  # False: a checkpoint's save_state is awaited before the next step samples

    @classmethod
    def from_config(cls, cfg: DapoConfig) -> "Policy":
        return cls(cfg.max_inflight_gen_batches, cfg.max_steps_off_policy)

    def batches_to_launch(self, need: int, in_flight: int, batch_size: int, keep_rate: float, budget: int,
                          fresh: bool = True) -> int:
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
        ``max_inflight_gen_batches`` when set.
        """
        if need <= 0 or budget <= 0:
            return 0
        spare_sd = SPARE_SD if fresh else 0.0  # not fresh: the expected batches only, rounded up
        wanted = batches_for(need, batch_size, keep_rate, spare_sd) - in_flight
        limit = self.max_inflight_gen_batches
        cap = budget if limit is None else min(budget, limit - in_flight)
        return max(0, min(wanted, cap))

    def sample_ahead(self, update: int, n_steps: int, overlap: Overlap) -> bool:
        """Whether the step after optimizer step ``update`` samples while ``update`` trains."""
        if update >= n_steps:
            return False
        if self.max_steps_off_policy is None:
            return overlap.sample_ahead()
        return bool(self.max_steps_off_policy)


@dataclass(frozen=True)
class Filled:
    """What dynamic sampling drew for a step, and the loop state once it was drawn."""

    batch: StepBatch
    state: LoopState
    ahead: bool = False  # sampled while the previous step trained


@dataclass(frozen=True)
class Update:
    """One optimizer step's training operations, submitted back to back so they cost one wait."""

    forward_backward: Any
    optim: Any
    save_weights: Any
    save_state: Any | None  # a checkpoint step's

    def landed(self) -> "Update":
        """Wait until the service has every operation (the SDK submits them in the background)."""
        for future in (self.forward_backward, self.optim, self.save_weights, self.save_state):
            if future is not None:
                future.operation_id  # noqa: B018 - blocks until the submit round trip is done
        return self

    def result(self) -> tuple[Any, Any]:
        """(forward_backward output, the saved sampler weights), awaited in submission order so a
        failed step raises before the save is waited on."""
        fb = self.forward_backward.result()
        self.optim.result()
        return fb, self.save_weights.result()


@dataclass(frozen=True)
class PendingCheckpoint:
    """A checkpoint whose save_state may still be running."""

    save_state: Any
    state: LoopState

    def write(self, checkpoint_dir: Path) -> str:
        """Wait for the save_state, then write checkpoint.json: it only ever names a state that exists."""
        arn = self.save_state.result().model_package_arn
        checkpoint.write(checkpoint_dir, self.state.with_saved_state(arn))
        log.info("checkpoint: step=%d state=%s", self.state.step, arn)
        return arn


@dataclass
class Schedule:
    """One run's overlap: the batch sampled ahead, the checkpoint whose save is still running, the step clock."""

    policy: Policy
    n_steps: int
    checkpoint_dir: Path
    ahead: Filled | None = None  # the next step's batch, sampled while this one trained
    pending: PendingCheckpoint | None = None  # its save_state runs while the next step samples
    now: Callable[[], float] = time.monotonic  # the service's time as the loop sees it (make bench: simulated)
    overlap: Overlap = field(default_factory=Overlap)  # the auto decision's evidence
    clock: float = 0.0

    def __post_init__(self) -> None:
        self.clock = self.now()

    def sampled(self, fill: Callable[[], Filled]) -> Filled:
        """The next step's batch: the one sampled ahead, or ``fill()`` now (timed, for the auto overlap).
        Then the previous checkpoint, whose save ran meanwhile, is written (or the step fails here, before
        training on)."""
        filled, self.ahead = self.ahead, None
        if filled is None:
            start = self.now()
            filled = fill()
            self.overlap = self.overlap.sampled(self.now() - start, len(filled.batch.sampled))
        if self.pending:
            filled = replace(filled, state=filled.state.with_saved_state(self.pending.write(self.checkpoint_dir)))
            self.pending = None
        return filled

    def carried(self, groups: Sequence[Group], update: int) -> tuple[tuple[Group, ...], int]:
        """Surplus groups for optimizer step ``update``, and how many were dropped as too stale for it.

        A carried group is one step older than the groups sampled for its step; sampling ahead, a
        group would become two: those are dropped, so none is trained more than ``OFF_POLICY_LIMIT``
        steps off-policy.
        """
        if not self.policy.carry_surplus:
            return (), 0
        fresh = tuple(g for g in groups if update - 1 - g.sampler_step <= OFF_POLICY_LIMIT)
        return fresh, len(groups) - len(fresh)

    def trained(self, update: Update, step: int,
                fill_next: Callable[[Callable[[], tuple[Any, Any]]], Filled]) -> tuple[Any, Any]:
        """Wait for optimizer step ``step``'s ``update``: (forward_backward output, saved sampler weights).

        When the policy samples ahead, ``fill_next(update_done)`` draws the next step's batch first, while
        the update trains, on the weights sampling now: one step older than the ones it will be trained
        from (``update_done()`` waits for the update, for the fill to sample its weights once they exist).
        The loop waits on one thread only, so a service can tell its waits from its work.
        """
        ahead, start = self.policy.sample_ahead(step, self.n_steps, self.overlap), self.now()
        waited: list[float] = []  # until the update was done: its training, overlapped or not

        def update_done() -> tuple[Any, Any]:
            result = update.result()
            if not waited:
                waited.append(self.now() - start)
            return result

        if ahead:
            self.ahead = replace(fill_next(update_done), ahead=True)
        result, seconds, probed = update_done(), self.now() - start, self.overlap
        groups = len(self.ahead.batch.sampled) if ahead and self.ahead else 0
        self.overlap = probed.trained(seconds, ahead, waited[0], groups)
        if probed.verdict is None and self.overlap.verdict is not None:
            log.info("overlap: sampling %.2fs alone, training %.2fs, %.2fs both overlapped: %s", probed.sampling_s,
                     waited[0], seconds, "sampling ahead" if self.overlap.verdict else "on-policy from now on")
        return result

    def checkpoint(self, update: Update, state: LoopState) -> None:
        """Checkpoint ``state``, whose save_state was queued with ``update``: written after the next
        step's sampling (or at the end), so the save runs while the sampler works."""
        assert update.save_state is not None, "a checkpoint step queues its save_state"
        pending = PendingCheckpoint(update.save_state, state)
        if self.policy.save_behind:
            self.pending = pending
        else:
            pending.write(self.checkpoint_dir)

    def finish(self, state: LoopState) -> LoopState:
        """The run's end: its last checkpoint written, once the save is done."""
        if self.pending:
            state = state.with_saved_state(self.pending.write(self.checkpoint_dir))
            self.pending = None
        return state

    def lap(self) -> float:
        """Seconds of the step so far: since the previous step's record, or the evaluation after it."""
        return self.now() - self.clock

    @contextmanager
    def untimed(self) -> Iterator[None]:
        """Work that belongs to no step's seconds (writing a step's record, evaluating): the clock restarts after it."""
        try:
            yield
        finally:
            self.clock = self.now()

    @contextmanager
    def salvaging(self) -> Iterator[None]:
        """On the way out of a failed step: write the previous step's checkpoint if its save_state finished."""
        try:
            yield
        except Exception:
            if self.pending:
                try:
                    self.pending.write(self.checkpoint_dir)
                except Exception as exc:  # the error being raised is the one to report
                    log.warning("checkpoint of step %d not written: %s", self.pending.state.step, exc)
            raise
