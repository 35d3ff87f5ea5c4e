"""Dynamic-sampling arithmetic on scripted reward patterns (no service needed)."""
import pytest

from steps.dynamic_sampling import KeepRate, batches_to_launch, collect_step
from steps.rollouts import Group, Rollout


def group(i, rewards):
    return Group(i, (0,), tuple(Rollout((1,), (-1.0,), "stop", float(r), bool(r), True) for r in rewards))


class ScriptedBatches:
    """Each launch returns the next scripted generation batch; records launches in flight."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.launched = 0
        self.max_in_flight = 0
        self.in_flight = 0

    def launch(self):
        batch = self.batches[self.launched]
        self.launched += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

        def wait():
            self.in_flight -= 1
            return batch

        return wait


MIXED, RIGHT, WRONG = [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]


def test_keeps_sampling_until_the_batch_is_full_and_carries_the_surplus():
    # batch_size 4; each generation batch has 4 groups of which 3 are mixed.
    script = ScriptedBatches([[group(k, MIXED) for k in range(3)] + [group(3, WRONG)] for _ in range(5)])
    b = collect_step(script.launch, carry=[], batch_size=4, max_gen_batches=5, max_inflight=1, keep_rate=KeepRate())
    assert len(b.kept) == 4 and not b.hit_cap
    assert b.gen_batches == 2 and b.groups_sampled == 8
    assert b.filtered == 2 and b.filtered_frac == pytest.approx(0.25)
    assert len(b.carry) == 2  # 6 kept, 4 used, 2 carried

    # The carried groups count first in the next step: one more batch fills it.
    nxt = collect_step(script.launch, carry=b.carry, batch_size=4, max_gen_batches=5, max_inflight=1, keep_rate=KeepRate())
    assert nxt.kept[:2] == b.carry and nxt.gen_batches == 1 and len(nxt.carry) == 1


def test_enough_carry_needs_no_sampling():
    carry = [group(k, MIXED) for k in range(5)]
    b = collect_step(ScriptedBatches([]).launch, carry, batch_size=4, max_gen_batches=3, max_inflight=2, keep_rate=KeepRate())
    assert b.gen_batches == 0 and b.kept == carry[:4] and b.carry == carry[4:]


def test_cap_stops_with_what_was_kept():
    script = ScriptedBatches([[group(0, MIXED), group(1, RIGHT), group(2, WRONG), group(3, RIGHT)]] * 3)
    b = collect_step(script.launch, carry=[], batch_size=4, max_gen_batches=3, max_inflight=1, keep_rate=KeepRate())
    assert b.hit_cap and b.gen_batches == 3 and len(b.kept) == 3
    assert b.filtered_frac == pytest.approx(0.75)


def test_failed_requests_and_empty_generation_batches_are_counted():
    script = ScriptedBatches([[None, None], [group(0, MIXED), None], [group(1, MIXED), group(2, MIXED)]])
    b = collect_step(script.launch, carry=[], batch_size=2, max_gen_batches=5, max_inflight=1, keep_rate=KeepRate())
    assert b.empty_rollouts == 1 and b.failed_groups == 3 and b.gen_batches == 3
    assert len(b.kept) == 2 and len(b.carry) == 1


def test_low_keep_rate_starts_batches_early_within_the_in_flight_cap():
    rate = KeepRate(kept=1, sampled=4)  # 25% seen so far
    script = ScriptedBatches([[group(0, MIXED), group(1, WRONG), group(2, WRONG), group(3, WRONG)]] * 8)
    b = collect_step(script.launch, carry=[], batch_size=4, max_gen_batches=8, max_inflight=3, keep_rate=rate)
    assert script.max_in_flight == 3
    assert b.speculative >= 2
    assert len(b.kept) == 4 and not b.hit_cap


@pytest.mark.parametrize(
    "need,in_flight,rate,budget,max_inflight,expected",
    [
        (4, 0, 1.0, 10, 4, 1),  # everything kept so far: one batch
        (4, 0, 0.25, 10, 4, 4),  # a quarter kept: four at once
        (4, 0, 0.25, 2, 4, 2),  # ... but never past the cap
        (4, 1, 0.5, 10, 4, 1),  # one in flight covers half
        (4, 2, 0.5, 10, 4, 0),  # two in flight cover it all
        (0, 0, 0.5, 10, 4, 0),  # full
        (4, 0, 0.0, 10, 2, 2),  # nothing kept yet: bounded by max_inflight
    ],
)
def test_batches_to_launch(need, in_flight, rate, budget, max_inflight, expected):
    assert batches_to_launch(need, in_flight, 4, rate, budget, max_inflight) == expected
