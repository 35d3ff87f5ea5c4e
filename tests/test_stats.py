"""steps/dapo/stats.py against published numbers: textbook examples, cited where they are used."""
from __future__ import annotations

import math
from itertools import product

import pytest

from steps.dapo import stats


# -- Wilson ---------------------------------------------------------------------------------------------------------
# Newcombe RG (1998). Two-sided confidence intervals for the single proportion: comparison of seven methods.
# Statistics in Medicine 17:857-872. Its worked examples, method 3 (the score interval without continuity
# correction), to the four decimals printed there.
@pytest.mark.parametrize(("successes", "n", "low", "high"), [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombes_worked_examples(successes, n, low, high):
    interval = stats.wilson(successes, n)
    assert (round(interval.low, 4), round(interval.high, 4)) == (low, high)


def test_wilson_is_symmetric_stays_in_the_unit_interval_and_narrows_with_n():
    assert stats.wilson(0, 0) == stats.Interval(0.0, 1.0)
    left, right = stats.wilson(3, 40), stats.wilson(37, 40)
    assert left.low == pytest.approx(1 - right.high) and left.high == pytest.approx(1 - right.low)
    assert stats.wilson(40, 40).high == 1.0 and stats.wilson(0, 40).low == 0.0
    # GSM8K's 1,319 test questions around 0.70: about +-2.5 points; 200 questions: about +-6.3.
    assert stats.wilson(923, 1319).high - stats.wilson(923, 1319).low == pytest.approx(0.049, abs=0.001)
    assert stats.wilson(140, 200).high - stats.wilson(140, 200).low == pytest.approx(0.126, abs=0.002)


# -- exact McNemar ----------------------------------------------------------------------------------------------------
def test_exact_mcnemar_p_of_armitage_and_berrys_culture_media():
    """Armitage P, Berry G (1994). Statistical Methods in Medical Research, 3rd ed., p. 127: 50 sputum specimens on
    two media, 12 grew on A only and 2 on B only. The exact (Liddell) test: P (two-sided) = 0.0129, as StatsDirect's
    manual reproduces it ("Exact matched pairs")."""
    assert round(stats.exact_mcnemar_p(12, 2), 4) == 0.0129
    assert stats.exact_mcnemar_p(2, 12) == stats.exact_mcnemar_p(12, 2)
    assert stats.exact_mcnemar_p(0, 0) == 1.0 and stats.exact_mcnemar_p(5, 5) == 1.0


# -- the paired difference --------------------------------------------------------------------------------------------
def test_paired_difference_of_agrestis_prime_minister_approval():
    """Agresti A (2002). Categorical Data Analysis, 2nd ed., section 10.1, Table 10.1: 1,600 people rated the Prime
    Minister twice; 150 approved then disapproved, 86 the reverse. The difference of the approval proportions,
    0.59 - 0.55 = 0.04, has the 95% interval (0.021, 0.059). The book's is the Wald interval; at n = 1,600 the
    exact interval agrees with it to the three decimals printed."""
    interval = stats.paired_difference(150, 86, 1600)
    assert (round(interval.low, 3), round(interval.high, 3)) == (0.021, 0.059)


def test_paired_difference_excludes_zero_exactly_when_the_exact_mcnemar_test_rejects():
    """Fay MP, Lumbard K (2021). Confidence intervals for difference in proportions for matched pairs compatible
    with exact McNemar's or sign tests. Statistics in Medicine 40:1147-1159: the central 95% interval excludes 0
    if and only if the exact McNemar test rejects at 0.05 (each tail at 0.025). Armitage and Berry's media
    (P = 0.0129) do; Bentur et al.'s airway data (P = 0.0703) do not."""
    for b, c, n in ((12, 2, 50), (1, 7, 21), (9, 2, 44), (40, 20, 160), (3, 7, 100), (30, 10, 1319)):
        interval = stats.paired_difference(b, c, n)
        rejects = stats.exact_mcnemar_p(b, c) <= 0.05
        assert (interval.low > 0 or interval.high < 0) == rejects, (b, c, n, interval)
        assert interval.low <= (b - c) / n <= interval.high


def test_paired_difference_matches_the_reference_implementation():
    """exact2x2 1.7.0's ``mcnemarExactDP`` (the authors' R code), run with tight tolerances (uniroot tol 1e-13,
    integrate rel.tol 1e-11), on its help page's example (Bentur et al. 2009, Pediatric Pulmonology 44:845-850:
    21 children, 1 discordant pair one way, 7 the other) and others; the published interface is
    mcnemarExactDP(x, m, n) with x the pairs of one way out of m discordant ones."""
    for (x, m, n), (low, high) in {
        (1, 8, 21): (-0.5454986, 0.0204495),
        (12, 14, 50): (0.0361471, 0.3549885),
        (0, 0, 20): (-0.1684335, 0.1684335),
        (20, 20, 20): (0.6209055, 1.0),
        (30, 40, 1319): (0.0050604, 0.0257398),
        (130, 260, 1319): (-0.0247494, 0.0247494),
    }.items():
        interval = stats.paired_difference(x, m - x, n)
        assert interval.low == pytest.approx(low, abs=2e-7) and interval.high == pytest.approx(high, abs=2e-7)


def test_paired_difference_edges_and_symmetry():
    # Identical answers everywhere (no discordant pair): centred on 0, never excluding it.
    same = stats.paired_difference(0, 0, 1319)
    assert same.low == pytest.approx(-same.high) and same.low < 0 < same.high
    # Swapping the models mirrors the interval.
    forward, backward = stats.paired_difference(17, 5, 120), stats.paired_difference(5, 17, 120)
    assert forward.low == pytest.approx(-backward.high) and forward.high == pytest.approx(-backward.low)
    # Every pair discordant and one way: the upper bound is 1 (exact2x2 gives 0.338019229 below).
    assert stats.paired_difference(10, 0, 10) == stats.Interval(pytest.approx(0.338019229, abs=1e-8), 1.0)
    with pytest.raises(ValueError, match="b \\+ c <= n"):
        stats.paired_difference(8, 5, 12)


# -- pass@k ----------------------------------------------------------------------------------------------------------
def test_pass_at_k_is_chen_et_als_estimator():
    """Chen M et al. (2021). Evaluating large language models trained on code, eq. 1:
    pass@k = E[1 - C(n - c, k) / C(n, k)] over problems, n samples of which c are correct."""
    for n, c, k in product(range(1, 13), range(0, 13), range(1, 13)):
        if c <= n and k <= n:
            assert stats.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert stats.pass_at_k(4, 1, 1) == 0.25  # pass@1 is the share correct
    assert stats.pass_at_k(4, 1, 4) == 1.0 and stats.pass_at_k(4, 0, 4) == 0.0  # k = n: any of them
    assert stats.pass_at_k(200, 13, 10) == pytest.approx(1 - math.comb(187, 10) / math.comb(200, 10))
    with pytest.raises(ValueError):
        stats.pass_at_k(4, 5, 1)


# -- maj@k ------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("votes", "score"), [
    ([("7", True), ("7", True), ("8", False), (None, False)], 1.0),
    ([("8", False), ("8", False), ("7", True), ("7", True), ("9", False)], 0.5),  # a tie of two: half
    ([("8", False), (None, False), (None, False), ("7", True)], 0.5),  # no-answer samples abstain
    ([(None, False), (None, False)], 0.0),  # nobody answered
    ([("9", False), ("9", False), ("7", True)], 0.0),
    ([("1", False), ("2", False), ("3", True)], pytest.approx(1 / 3)),
])
def test_majority_vote(votes, score):
    assert stats.majority_score(votes) == score


def test_the_melded_distribution_is_one_where_every_pair_went_the_other_way():
    """x = 0 of m = n discordant pairs: B is 0 and T is 1, so T(2B - 1) is -1 and P[T(2B - 1) <= delta] is 1 for
    every delta in [-1, 1] (the lower bound's early return used to hide a 0 here)."""
    for delta in (-1.0, -0.5, -1e-9, 0.0, 0.5, 1.0):
        assert stats._p_at_most(delta, 0, 10, 10) == 1.0, delta
    # A distribution function: never decreasing in delta, for the other edges and an inner case alike.
    for x, m, n in ((0, 4, 10), (10, 10, 10), (3, 10, 10), (0, 0, 10), (2, 5, 12)):
        values = [stats._p_at_most(d, x, m, n) for d in (-1.0, -0.6, -0.2, -1e-6, 0.0, 1e-6, 0.3, 0.7, 1.0)]
        assert all(0.0 <= v <= 1.0 for v in values), (x, m, n, values)
        assert all(b >= a - 1e-9 for a, b in zip(values, values[1:])), (x, m, n, values)
