"""What runs while what waits: the overlap of one DAPO step with the next.

The loop (steps/dapo/loop.py) says what a step does; a :class:`Schedule` says when each part is waited on:

- A checkpoint step's ``save_state`` is queued behind its update and awaited only after the next
  step's sampling (or at the end); ``checkpoint.json`` is written then, so it only ever names a state
  that exists. A failed step still writes it on the way out if that save finished.
- With ``max_steps_off_policy: 1`` the next step's sampling runs while a step trains, on the weights
  the step trained from (as verl's one-step-off-policy recipe and tinker-cookbook's async mode do).
  Each group carries the step of the weights that sampled it; the train line logs how many steps
  off-policy a step trained, and no group is trained more than ``OFF_POLICY_LIMIT`` steps off-policy.
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


@dataclass(frozen=True)
class Policy:
    """How much runs at once. :meth:`from_config` is the product's; the two switches exist for
    ``make bench``'s sequential baseline (the loop before any overlap)."""

    max_inflight_gen_batches: int = 4
    max_steps_off_policy: int = 0
    carry_surplus: bool = True  # False: kept groups beyond batch_size are dropped, not trained next step
    save_behind: bool = True  # False: a checkpoint's save_state is awaited before the next step samples

    @classmethod
    def from_config(cls, cfg: DapoConfig) -> "Policy":
        return cls(cfg.max_inflight_gen_batches, cfg.max_steps_off_policy)

    def batches_to_launch(self, need: int, in_flight: int, batch_size: int, keep_rate: float, budget: int) -> int:
        """How many new generation batches to start now.

        Enough that, at the observed keep rate, the batches in flight are expected to fill the
        remaining ``need``, within ``max_inflight_gen_batches`` and the cap's ``budget``; at least
        one when nothing is in flight and groups are still needed.
        """
        if need <= 0 or budget <= 0:
            return 0
        expected_per_batch = max(keep_rate, 1e-3) * batch_size
        wanted = math.ceil(need / expected_per_batch) - in_flight
        floor = 1 if in_flight == 0 else 0
        return max(floor, min(wanted, self.max_inflight_gen_batches - in_flight, budget))

    def sample_ahead(self, update: int, n_steps: int) -> bool:
        """Whether the step after optimizer step ``update`` samples while ``update`` trains."""
        return bool(self.max_steps_off_policy) and update < n_steps


@dataclass(frozen=True)
class Filled:
    """What dynamic sampling drew for a step, and the loop state once it was drawn."""

    batch: StepBatch
    state: LoopState


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
    clock: float = field(default_factory=time.monotonic)

    def sampled(self, fill: Callable[[], Filled]) -> Filled:
        """The next step's batch: the one sampled ahead, or ``fill()`` now. Then the previous checkpoint,
        whose save ran meanwhile, is written (or the step fails here, before training on)."""
        filled, self.ahead = self.ahead or fill(), None
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

    def trained(self, update: Update, step: int, fill_next: Callable[[], Filled]) -> tuple[Any, Any]:
        """Wait for optimizer step ``step``'s ``update``: (forward_backward output, saved sampler weights).

        When the policy samples ahead, ``fill_next()`` draws the next step's batch first, while the
        update trains, on the weights sampling now: one step older than the ones it will be trained
        from. The loop waits on one thread only, so a service can tell its waits from its work.
        """
        if self.policy.sample_ahead(step, self.n_steps):
            self.ahead = fill_next()
        return update.result()

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
        return time.monotonic() - self.clock

    @contextmanager
    def untimed(self) -> Iterator[None]:
        """Work that belongs to no step's seconds (writing a step's record, evaluating): the clock restarts after it."""
        try:
            yield
        finally:
            self.clock = time.monotonic()

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
