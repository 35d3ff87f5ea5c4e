"""A step's health figures (steps/dapo/health.py): pure functions of its rollouts and the update's outputs."""
import math

import numpy as np
import pytest

from steps.dapo import health
from steps.dapo.batch import TrainSample
from steps.dapo.health import ends_in_loop, health_figures, sampler_kl
from steps.dapo.sampling import Group, Rollout, StepBatch
from steps.dapo.task import Grade

EOS = 99


# -- the repetition loop ------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", [
    [7] * 24,  # period 1: 24 repeats over the minimum span
    [1, 2, 3] + [4, 5] * 12,  # period 2 after a start that is not part of it
    [9] + [1, 2, 3, 4, 5] * 5,  # period 5: 5 repeats, 25 tokens >= 24
    list(range(8)) * 3,  # period 8: exactly 3 repeats over exactly 24 tokens
    [0] + list(range(100, 132)) * 3,  # period 32 (the longest looked for): 3 repeats, 96 tokens
])
def test_a_completion_ending_in_a_repeated_ngram_is_a_loop(tokens):
    assert ends_in_loop(tokens)
    assert ends_in_loop(tokens + [EOS], stopped=True)  # the end-of-turn token is left out of the judgment


@pytest.mark.parametrize("tokens", [
    [7] * 23,  # too short a span
    list(range(10)) * 2 + [0, 1, 2, 3],  # period 10, 24 tokens, but fewer than 3 repeats
    list(range(100, 133)) * 3,  # period 33: longer than any period looked for
    [4, 5] * 20 + [6],  # a loop the completion got out of
    [1, 2, 3],
    [],
])
def test_what_is_not_a_loop(tokens):
    assert not ends_in_loop(tokens)


def test_a_loop_with_its_end_token_counts_only_when_the_completion_stopped_itself():
    assert not ends_in_loop([7] * 30 + [EOS])  # cut off at max_tokens: the last token is text, not the end
    assert ends_in_loop([7] * 30 + [EOS], stopped=True)


def test_random_filler_of_three_words_is_not_a_loop():
    """The toy's "thinking" is uniform filler over three words: at 512 tokens it must not read as a loop."""
    rng = np.random.default_rng(0)
    assert not any(ends_in_loop(rng.integers(0, 3, 512).tolist()) for _ in range(200))


# -- the figures of one step ------------------------------------------------------------------
def rollout(tokens, logprobs, stop="stop", correct=False, formatted=True):
    return Rollout(tuple(tokens), tuple(logprobs), stop, float(correct), Grade(correct, formatted, None))


def test_health_figures_of_a_step():
    rollouts = [
        rollout([1, 2], [-0.5, -1.5], correct=True),  # 2 tokens, NLL 2
        rollout([3, 4, 5, 6], [-1.0] * 4, formatted=False),  # 4 tokens, NLL 4
        rollout([8] * 30, [-0.0] * 30, stop="length", formatted=False),  # a loop, cut off
        rollout([1, 2, 3], (), correct=True),  # no logprobs from the sampler: left out of the entropy only
    ]
    f = health_figures(rollouts)
    assert f["entropy"] == pytest.approx(6 / 36)
    assert (f["completion_tokens_p50"], f["completion_tokens_max"]) == (3.5, 30)
    assert f["completion_tokens_p95"] == pytest.approx(np.percentile([2, 4, 30, 3], 95))
    assert f["repetition_frac"] == 0.25 and f["truncated_frac"] == 0.25
    assert f["format_error_rate"] == 0.5 and f["accuracy"] == 0.5


def test_a_step_without_rollouts_has_no_figures_rather_than_zeros():
    assert all(math.isnan(v) for v in health_figures([]).values())


def test_a_step_filled_by_carried_groups_describes_the_groups_it_trains_on():
    carried = Group(0, (0,), (rollout([1], [-1.0]), rollout([2], [-2.0])))
    batch = StepBatch(kept=(carried,), carry=(), sampled=(), gen_batches=0, failed_groups=0, empty_rollouts=0,
                      speculative=0, hit_cap=False)
    assert health.step_rollouts(batch) == list(carried.rollouts)


# -- the sampler-trainer mismatch ------------------------------------------------------------------
def sample(completion_logprobs, prompt=(5, 6, 7), weight=1.0):
    n = len(completion_logprobs)
    return TrainSample(prompt, tuple(range(n)), tuple(completion_logprobs), 0.5, weight)


def output(sampled: TrainSample, completion_logprobs):
    """The loss's per-datum output as the wire carries it: TensorData over the shifted sequence."""
    return {"logprobs": {"data": [0.0] * (len(sampled.prompt) - 1) + list(completion_logprobs),
                         "dtype": "float32", "shape": [len(sampled.prompt) - 1 + len(completion_logprobs)]}}


def test_k3_is_zero_when_sampler_and_trainer_agree_and_the_textbook_value_otherwise():
    s = sample([-1.0, -2.0])
    assert sampler_kl([s], [True], [output(s, [-1.0, -2.0])]) == {"sampler_kl": 0.0}
    # log r = trainer - sampler = +0.5 and -0.5: k3 = (e^0.5 - 1 - 0.5 + e^-0.5 - 1 + 0.5) / 2
    got = sampler_kl([s], [True], [output(s, [-0.5, -2.5])])["sampler_kl"]
    assert got == pytest.approx((math.exp(0.5) + math.exp(-0.5) - 2) / 2) and got > 0


def test_k3_counts_only_trained_tokens_of_samples_the_current_weights_drew():
    fresh, stale, masked = sample([-1.0]), sample([-1.0]), sample([-1.0], weight=0.0)
    outputs = [output(fresh, [-1.2]), output(stale, [-9.0]), output(masked, [-9.0])]
    assert sampler_kl([fresh, stale, masked], [True, False, True], outputs) == {
        "sampler_kl": pytest.approx(math.exp(-0.2) - 1 + 0.2)}
    # Nothing drawn by these weights (every group carried): no figure, rather than a NaN or a false 0, and why.
    assert sampler_kl([stale], [False], [output(stale, [-9.0])]) == {"sampler_kl_note": health.ONLY_OLDER}
    assert "sampled by earlier weights" in health.ONLY_OLDER
    assert set(sampler_kl([masked], [True], [output(masked, [-9.0])])) == {"sampler_kl_note"}


def test_k3_is_left_out_with_a_reason_where_the_loss_returns_no_logprobs():
    """The real service's ForwardBackwardOutput.loss_fn_outputs documents actor/* diagnostics only."""
    s = sample([-1.0])
    for outputs in ([{"actor/pg_loss": {"data": [0.1]}}], None, []):
        assert sampler_kl([s], [True], outputs) == {"sampler_kl_note": health.NO_LOGPROBS}
