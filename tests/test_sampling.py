"""Generation batches and dynamic-sampling arithmetic on scripted reward patterns (no service needed)."""
from collections import deque
from types import SimpleNamespace

import pytest

from steps.dapo.loop import Overlap, carried, off_policy_limit, overlap_pays, sample_ahead
from steps.dapo.sampling import (
    SPARE_SD,
    Cursor,
    DataPosition,
    Draws,
    Filling,
    Group,
    GroupSampler,
    RewardShaping,
    Rollout,
    SamplerAt,
    batches_for,
    batches_to_launch,
    derived_seed,
)
from steps.dapo.task import Grade
from steps.gsm8k.task import GSM8K, Gsm8k
from steps.tasks import Example

NO_EVIDENCE = (0, 0)


def group(i, rewards):
    return Group(i, (0,), tuple(Rollout((1,), (-1.0,), "stop", float(r), Grade(bool(r), True, None))
                                for r in rewards))


class ScriptedBatches:
    """Stands in for the GroupSampler: each launch returns the next scripted generation batch; records launches
    in flight and the weights each sampled."""

    examples = range(1000)

    def __init__(self, batches):
        self.batches = list(batches)
        self.launched = 0
        self.max_in_flight = 0
        self.in_flight = 0
        self.steps = []  # the sampler step of each launch

    def launch(self, client, indices, seed, sampler_step=0):
        batch = self.batches[self.launched]
        self.launched += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.steps.append(sampler_step)

        def result():
            self.in_flight -= 1
            return batch

        return SimpleNamespace(result=result, futures=(), sampler_step=sampler_step)


def draws(carry=(), evidence=(0, 0), in_flight=()):
    return Draws(Cursor(DataPosition(), 0), tuple(carry), evidence, in_flight=deque(in_flight))


def collect_step(script, carry=(), batch_size=4, max_num_gen_batches=5, max_inflight=1, evidence=(0, 0),
                 in_flight=()):
    """One step's dynamic sampling on ``script``'s batches, on-policy."""
    filling = Filling(script, batch_size, max_num_gen_batches, seed=0, max_inflight=max_inflight)
    return filling.collect(draws(carry, evidence, in_flight), SamplerAt(0, None))


MIXED, RIGHT, WRONG = [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]


def test_keeps_sampling_until_the_batch_is_full_and_carries_the_surplus():
    # batch_size 4; each generation batch has 4 groups of which 3 are mixed.
    script = ScriptedBatches([[group(k, MIXED) for k in range(3)] + [group(3, WRONG)] for _ in range(5)])
    b = collect_step(script, carry=[], batch_size=4, max_num_gen_batches=5, max_inflight=1,
                     evidence=NO_EVIDENCE)
    assert len(b.kept) == 4 and not b.hit_cap
    assert b.gen_batches == 2 and len(b.sampled) == 8
    assert b.filtered == 2 and b.filtered_all_wrong == 2
    assert len(b.carry) == 2  # 6 kept, 4 used, 2 carried

    # The carried groups count first in the next step: one more batch fills it.
    nxt = collect_step(script, carry=b.carry, batch_size=4, max_num_gen_batches=5,
                       max_inflight=1, evidence=NO_EVIDENCE)
    assert nxt.kept[:2] == b.carry and nxt.gen_batches == 1 and len(nxt.carry) == 1


def test_enough_carry_needs_no_sampling():
    carry = [group(k, MIXED) for k in range(5)]
    b = collect_step(ScriptedBatches([]), carry, batch_size=4, max_num_gen_batches=3,
                     max_inflight=2, evidence=NO_EVIDENCE)
    assert b.gen_batches == 0 and b.kept == tuple(carry[:4]) and b.carry == tuple(carry[4:])


def test_cap_stops_with_what_was_kept():
    script = ScriptedBatches([[group(0, MIXED), group(1, RIGHT), group(2, WRONG), group(3, RIGHT)]] * 3)
    b = collect_step(script, carry=[], batch_size=4, max_num_gen_batches=3, max_inflight=1,
                     evidence=NO_EVIDENCE)
    assert b.hit_cap and b.gen_batches == 3 and len(b.kept) == 3
    assert b.filtered == 9 and b.filtered_all_wrong == 3


def test_failed_requests_and_empty_generation_batches_are_counted():
    script = ScriptedBatches([[None, None], [group(0, MIXED), None], [group(1, MIXED), group(2, MIXED)]])
    b = collect_step(script, carry=[], batch_size=2, max_num_gen_batches=5, max_inflight=1,
                     evidence=NO_EVIDENCE)
    assert b.empty_rollouts == 1 and b.failed_groups == 3 and b.gen_batches == 3
    assert len(b.kept) == 2 and len(b.carry) == 1


def test_low_keep_rate_starts_batches_early_within_the_in_flight_cap():
    script = ScriptedBatches([[group(0, MIXED), group(1, WRONG), group(2, WRONG), group(3, WRONG)]] * 8)
    b = collect_step(script, carry=[], batch_size=4, max_num_gen_batches=8, max_inflight=3,
                     evidence=(1, 4))  # 25% kept so far
    assert script.max_in_flight == 3
    assert b.speculative >= 2
    assert len(b.kept) == 4 and not b.hit_cap


@pytest.mark.parametrize(
    "need,in_flight,rate,budget,max_inflight,fresh,expected",
    [
        (4, 0, 1.0, 10, 4, True, 1),  # everything kept so far: one batch
        (4, 0, 0.25, 10, 4, True, 4),  # a quarter kept: four at once (and a spare, but for the cap)
        (4, 0, 0.25, 2, 4, True, 2),  # ... never past the budget
        (4, 1, 0.5, 10, 4, False, 1),  # sampled ahead: only what the keep rate expects, one in flight covers half
        (4, 2, 0.5, 10, 4, False, 0),  # ... two cover it all: no spare on weights about to be replaced
        (1, 0, 0.5, 10, 4, False, 1),  # ... half a batch expected: one now, not after a wait
        (0, 0, 0.5, 10, 4, True, 0),  # full
        (4, 0, 0.0, 10, 2, True, 2),  # nothing kept yet: bounded by max_inflight
    ],
)
def test_batches_to_launch(need, in_flight, rate, budget, max_inflight, fresh, expected):
    assert batches_to_launch(need, in_flight, 4, rate, budget, fresh, max_inflight) == expected


def test_derived_seeds_fit_the_apis_32_bit_integer():
    seeds = {derived_seed(run_seed, n) for run_seed in (0, 1, 2**31 - 1) for n in range(1000)}
    assert all(0 <= s <= 2**31 - 1 for s in seeds) and len(seeds) > 2990  # and distinct in practice
    assert derived_seed(1, 2) == derived_seed(1, 2) != derived_seed(2, 1)


class FailingThenAnswering:
    """A sampling client whose first request per prompt fails, the resubmission answers."""

    def __init__(self, answer: str):
        self.calls = 0
        self.answer = answer

    def sample(self, prompt, num_samples, sampling_params):
        self.calls += 1
        if self.calls == 1:
            return SimpleNamespace(result=lambda: (_ for _ in ()).throw(RuntimeError("operation failed")))
        seq = SimpleNamespace(tokens=[1, 2], logprobs=[-0.1, -0.2], stop_reason="stop")
        return SimpleNamespace(result=lambda: SimpleNamespace(sequences=[seq] * num_samples))


class Tok:
    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [0]

    def decode(self, ids, skip_special_tokens=True):
        return "#### 7"


class BrokenGrader(Gsm8k):
    def grade(self, text, example):
        raise KeyError("grader bug")


def sampler(task=GSM8K, retries=2):
    return GroupSampler(task, Tok(), [Example("q", "7")], 2, SimpleNamespace(model_copy=lambda update: None),
                        RewardShaping(512), sample_retries=retries)


def test_a_failed_request_is_resubmitted_and_graded_once():
    client = FailingThenAnswering("#### 7")
    [g] = sampler().launch(client, [0], seed=None).result()
    assert client.calls == 2 and [r.grade.correct for r in g.rollouts] == [True, True]


def test_a_grading_error_is_a_bug_not_a_failed_sample():
    client = FailingThenAnswering("#### 7")
    client.calls = 1  # answers at once
    with pytest.raises(KeyError, match="grader bug"):
        sampler(BrokenGrader()).launch(client, [0], seed=None).result()
    assert client.calls == 2  # one request: the grading error was not retried as a failed sample


# -- the default's choices: generation batches in flight, and whether to sample ahead -------------------------
@pytest.mark.parametrize(
    "need,in_flight,rate,budget,fresh,expected",
    [
        (32, 0, 1.0, 10, True, 1),  # everything kept so far: one batch
        (32, 0, 0.2, 10, True, 7),  # a fifth kept: five expected, two spares (SPARE_SD), all at once; no cap of 4
        (32, 0, 0.2, 10, False, 5),  # sampled ahead on weights about to be replaced: the five expected only
        (32, 0, 0.19, 10, False, 6),  # ... 5.3 expected, rounded up: five would come up short more often than not
        (32, 0, 0.1, 6, True, 6),  # never past max_num_gen_batches' budget
        (32, 3, 0.2, 10, True, 4),  # three in flight count
        (10, 0, 0.5, 10, True, 1),  # one batch brings 16 on average, 10 even two deviations short
    ],
)
def test_auto_inflight_launches_what_the_keep_rate_says_the_step_needs(need, in_flight, rate, budget, fresh,
                                                                        expected):
    assert batches_to_launch(need, in_flight, 32, rate, budget, fresh) == expected  # max_inflight None: auto


def test_sampling_ahead_starts_the_spares_on_the_newer_weights_and_leaves_them_to_the_next_step():
    """Before the overlapped update is done only the expected batches start; the spares start on its weights,
    and a step full before they return leaves them running for the next step."""
    batches = [[group(k, MIXED), group(k, WRONG)] for k in range(2)]  # half kept
    newer = [[Group(k, (0,), group(k, MIXED).rollouts, sampler_step=1), group(k, WRONG)] for k in range(8)]
    script = ScriptedBatches(batches + newer)
    filling = Filling(script, batch_size=2, max_num_gen_batches=10, seed=0)
    ahead = draws(evidence=(1, 2))
    filling.launch(ahead, SamplerAt(0, None), fresh=False)  # before the update is awaited
    assert script.launched == 2  # the two expected batches (2 / (0.5 x 2)) only
    b = filling.collect(ahead, SamplerAt(1, None))  # the update done: the rest on its weights
    assert script.launched == batches_for(2, 2, 0.5, SPARE_SD) == 6 and script.steps == [0, 0, 1, 1, 1, 1]
    assert [g.sampler_step for g in b.kept] == [0, 0]
    assert len(b.in_flight) == 4  # full before they returned: they are the next step's, not waited on now
    nxt = filling.collect(draws(b.carry, (2, 4), b.in_flight), SamplerAt(1, None))
    assert [g.sampler_step for g in nxt.kept] == [1, 1]  # the spares filled it (and it started spares of its own)


@pytest.mark.parametrize(
    "sampling,training,overlapped,pays",
    [
        (13.0, 12.0, 13.5, True),  # separate GPUs, balanced: the overlapped step takes about max(S, T)
        (30.0, 3.0, 30.5, True),  # a short training, 2.5 of its 3 s hidden under the sampling
        (13.0, 12.0, 25.5, False),  # shared GPUs: training pauses decoding, the step takes S + T anyway
        (31.5, 12.5, 41.9, False),  # ... and a step that sampled a little less saves 2 s: not the training hidden
        (30.0, 3.0, 32.0, False),  # a third of a short training hidden: not worth groups one step old
        (0.0, 0.0, 0.0, False),
    ],
)
def test_overlap_pays_only_when_the_probe_hid_most_of_its_training(sampling, training, overlapped, pays):
    assert overlap_pays(sampling, training, overlapped) is pays


@pytest.mark.parametrize("overlapped,verdict", [(13.0, True), (25.0, False)])  # separate GPUs; shared
def test_auto_overlap_probes_once_both_times_are_measured_then_keeps_its_verdict(overlapped, verdict):
    last = 10
    o = Overlap()
    assert not sample_ahead(1, last, o, None)  # step 1 samples and trains alone: nothing measured yet
    o = o.sampled(13.0, 32).trained(12.0, ahead=False, update_s=12.0)
    o = o.sampled(13.0, 32)  # step 2's sampling, alone
    assert sample_ahead(2, last, o, None)  # the probe: step 2 trains while step 3 samples
    assert o.trained(5.0, ahead=True, update_s=5.0, groups=0) == o  # a probe that sampled nothing: probe again
    o = o.trained(overlapped, ahead=True, update_s=12.0, groups=32)
    assert o.verdict is verdict
    assert all(sample_ahead(u, last, o, None) is verdict for u in range(3, last))
    assert not sample_ahead(last, last, o, None)  # nothing to sample after the last step


def test_a_fixed_max_steps_off_policy_needs_no_probe():
    o = Overlap()
    assert all(sample_ahead(u, 4, o, 1) for u in (1, 2, 3))
    measured = o.sampled(1, 8).trained(1, False, 1)
    assert not any(sample_ahead(u, 4, measured, 0) for u in (1, 2))
    assert o.trained(5.0, ahead=True, update_s=5.0, groups=8) == o  # sampling ahead unmeasured decides nothing


def test_staleness_two_trains_the_groups_staleness_one_drops():
    """max_steps_off_policy 2: a surplus sampled ahead (on the weights of step u - 1, for step u + 1) is carried
    into step u + 2, two steps old; 1, 0 and auto drop it."""
    ages = [Group(i, (0,), group(i, MIXED).rollouts, sampler_step=s) for i, s in enumerate((5, 4, 3))]
    assert [off_policy_limit(Overlap(), m) for m in (None, 0, 1, 2)] == [1, 1, 1, 2]
    assert carried(ages, 7, 2) == (tuple(ages[:2]), 1)  # trained at step 7: 1, 2 and 3 steps old
    assert carried(ages, 7, 1) == (tuple(ages[:1]), 2)
