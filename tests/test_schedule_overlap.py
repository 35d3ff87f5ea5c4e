"""The auto overlap decision (steps/dapo/loop.py): the probe sampled ahead against on-policy, like with like."""
from __future__ import annotations

import pytest

from steps.dapo.loop import Overlap, overlap_pays, sample_ahead


def probe(sampling_s: float, training_s: float, overlapped_s: float) -> Overlap:
    """Steps 1 and 2 on-policy (each sampled, then trained alone), then step 2's update with step 3 sampled
    beside it: the auto decision's evidence as the loop gathers it."""
    o = Overlap().sampled(sampling_s, 32).trained(training_s, ahead=False, update_s=training_s)
    o = o.sampled(sampling_s, 32)
    assert sample_ahead(2, 10, o, None)  # step 2 is the probe
    return o.trained(overlapped_s, ahead=True, update_s=training_s, groups=32)


@pytest.mark.parametrize(
    "case,sampling,training,overlapped,ahead",
    [
        # Sampler-bound, separate GPUs: the 13 s training hides under 31 s of sampling.
        ("sampler-bound", 31.0, 13.0, 31.5, True),
        # Trainer-bound, separate GPUs: the 13 s sampling hides under 26 s of training. It saves 12.5 s, all it
        # could (min(S, T) = 13 s) but under half the training: the rule before issue 30 went on-policy, 1.19x slower.
        ("trainer-bound", 13.0, 26.0, 26.5, True),
        ("trainer-bound, little sampling", 3.0, 26.0, 26.2, True),
        # Shared GPUs: training pauses decoding, so the overlapped step takes S + T, give or take the sampling's noise.
        ("shared GPUs, sampler-bound", 31.5, 12.5, 41.9, False),
        ("shared GPUs, trainer-bound", 13.0, 26.0, 38.8, False),
        ("shared GPUs, balanced", 13.0, 12.0, 25.5, False),
        # On-policy faster (the overlapped step took longer than the two one after the other): stay on-policy.
        ("on-policy faster", 13.0, 26.0, 40.0, False),
        # A third of a short side hidden is noise, not an overlap worth groups one step old.
        ("noise on a short training", 30.0, 3.0, 32.0, False),
        ("noise on a short sampling", 3.0, 30.0, 32.0, False),
    ],
)
def test_the_probe_samples_ahead_whenever_the_overlap_saved_time_against_on_policy(case, sampling, training,
                                                                                     overlapped, ahead):
    assert overlap_pays(sampling, training, overlapped) is ahead, case
    decided = probe(sampling, training, overlapped)
    assert decided.verdict is ahead, case
    assert all(sample_ahead(u, 10, decided, None) is ahead for u in range(3, 10)), case


def test_the_saving_is_measured_against_min_of_sampling_and_training_not_the_training():
    # The most an overlap saves is the shorter side: at 0.6 of it the run samples ahead whichever side is longer.
    assert overlap_pays(10.0, 20.0, 30.0 - 6.0)
    assert overlap_pays(20.0, 10.0, 30.0 - 6.0)
    assert not overlap_pays(10.0, 20.0, 30.0 - 4.0)  # 0.4 of min(S, T)
    assert not overlap_pays(0.0, 20.0, 20.0)  # nothing to hide
