"""DAPO dynamic sampling: draw generation batches until `batch_size` groups are kept.

A group whose rewards are all equal carries no gradient and is dropped. Kept
groups beyond `batch_size` are carried into the next step rather than thrown
away. When the keep rate seen so far says one more generation batch will not
fill the batch, further batches are started before the current one returns
(at most `max_inflight` at once): the wasted samples of an over-shoot are
cheaper than an extra sequential round trip (measured in `make bench`).
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

from steps.advantages import is_informative
from steps.rollouts import Group

log = logging.getLogger(__name__)

# Submits one generation batch and returns a callable that waits for it.
LaunchFn = Callable[[], Callable[[], list[Group | None]]]


@dataclass(frozen=True)
class StepBatch:
    kept: list[Group]  # exactly batch_size unless hit_cap
    carry: list[Group]  # surplus kept groups for the next step
    sampled: list[Group]  # every group sampled this step (for reward stats)
    gen_batches: int
    filtered: int  # groups dropped for all-equal rewards
    filtered_all_wrong: int  # ... of which no completion was correct (too hard for the model)
    failed_groups: int
    empty_rollouts: int  # generation batches in which every request failed
    speculative: int  # batches started before the previous one returned
    hit_cap: bool

    @property
    def groups_sampled(self) -> int:
        return len(self.sampled)

    @property
    def filtered_frac(self) -> float:
        return self.filtered / len(self.sampled) if self.sampled else 0.0


@dataclass
class KeepRate:
    """Running keep rate over the whole run (kept / sampled groups)."""

    kept: int = 0
    sampled: int = 0

    def update(self, kept: int, sampled: int) -> None:
        self.kept += kept
        self.sampled += sampled

    def estimate(self) -> float:
        # Before any evidence assume every group is kept: never speculate blind.
        return self.kept / self.sampled if self.sampled else 1.0


def batches_to_launch(need: int, in_flight: int, batch_size: int, rate: float, budget: int, max_inflight: int) -> int:
    """How many new generation batches to start now.

    Enough that, at the observed keep rate, the batches in flight are expected
    to fill the remaining need, within the in-flight and cap budgets; at least
    one when nothing is in flight and groups are still needed.
    """
    if need <= 0 or budget <= 0:
        return 0
    expected_per_batch = max(rate, 1e-3) * batch_size
    wanted = math.ceil(need / expected_per_batch) - in_flight
    floor = 1 if in_flight == 0 else 0
    return max(floor, min(wanted, max_inflight - in_flight, budget))


def collect_step(
    launch: LaunchFn,
    carry: Sequence[Group],
    batch_size: int,
    max_gen_batches: int,
    max_inflight: int,
    keep_rate: KeepRate,
) -> StepBatch:
    kept: list[Group] = list(carry)
    sampled: list[Group] = []
    filtered = all_wrong = failed = empty = speculative = launched = 0
    in_flight: deque[Callable[[], list[Group | None]]] = deque()

    def top_up() -> None:
        nonlocal launched, speculative
        n = batches_to_launch(
            batch_size - len(kept), len(in_flight), batch_size, keep_rate.estimate(),
            max_gen_batches - launched, max_inflight,
        )
        if n and (in_flight or n > 1):
            speculative += n - (0 if in_flight else 1)
        for _ in range(n):
            in_flight.append(launch())
            launched += 1

    top_up()
    while in_flight:
        results = in_flight.popleft()()
        groups = [g for g in results if g is not None]
        failed += len(results) - len(groups)
        if results and not groups:
            empty += 1
        informative = [g for g in groups if is_informative(g.rewards)]
        keep_rate.update(len(informative), len(groups))
        sampled.extend(groups)
        filtered += len(groups) - len(informative)
        all_wrong += sum(1 for g in groups if not any(r.correct for r in g.rollouts))
        kept.extend(informative)
        top_up()

    hit_cap = len(kept) < batch_size
    return StepBatch(
        kept=kept[:batch_size], carry=kept[batch_size:], sampled=sampled, gen_batches=launched,
        filtered=filtered, filtered_all_wrong=all_wrong, failed_groups=failed, empty_rollouts=empty, speculative=speculative, hit_cap=hit_cap,
    )
