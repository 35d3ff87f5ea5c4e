"""The statistics of an evaluation: pure functions of counts, each checked against published numbers
(tests/test_stats.py).

- :func:`wilson`: the 95% Wilson score interval of one accuracy (Wilson 1927; Newcombe 1998's method 3).
  Unlike the Wald interval it stays inside [0, 1] and keeps its coverage near 0 and 1.
- :func:`paired_difference`: the difference of two accuracies measured on the same questions (trained
  minus base), with the exact McNemar-compatible interval of Fay & Lumbard (2021), the algorithm of
  ``mcnemarExactDP`` in the R package exact2x2 (numeric integration). Only the discordant questions
  (one model right, the other wrong) carry information about the difference; the interval excludes 0
  exactly when the exact McNemar test rejects at the same level, so "the lower bound is >= 0" and
  "the exact McNemar test says the adapter is not worse" are one statement.
- :func:`exact_mcnemar_p`: that test's two-sided p-value (a binomial test of the discordant pairs at 1/2).
- :func:`pass_at_k`: the unbiased pass@k estimator of Chen et al. (2021) from n samples with c correct.
- :func:`majority_score`: maj@k for one question: a vote over the answers its samples committed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
from scipy import integrate, optimize, special

#: The standard normal's 97.5% quantile: a two-sided 95% interval.
Z95 = 1.959963984540054
ALPHA = 0.05
#: The name evaluation.json gives the interval of the paired difference.
#: (Its characters are those a model package's metadata value admits, so the registry entry can carry it.)
PAIRED_METHOD = "exact McNemar: Fay-Lumbard 2021 melded interval - exact2x2 mcnemarExactDP"


@dataclass(frozen=True)
class Interval:
    low: float
    high: float


def wilson(successes: int, n: int, z: float = Z95) -> Interval:
    """The Wilson score interval of ``successes`` out of ``n`` (the whole of [0, 1] when n is 0)."""
    if n == 0:
        return Interval(0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return Interval(max(0.0, centre - half), min(1.0, centre + half))


def exact_mcnemar_p(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: of the b + c discordant pairs, b went one way; under no
    difference each way is a coin flip (the central and the minimum-likelihood p-values agree at 1/2)."""
    m = b + c
    if m == 0:
        return 1.0
    tail = special.bdtr(min(b, c), m, 0.5)  # P[Binomial(m, 1/2) <= min(b, c)]
    return float(min(1.0, 2 * tail))


def paired_difference(b: int, c: int, n: int, alpha: float = ALPHA) -> Interval:
    """The central 1 - ``alpha`` interval of (p_b - p_c) for ``n`` pairs, ``b`` of which only the first
    member got right and ``c`` only the second (Fay & Lumbard 2021; exact2x2's ``mcnemarExactDP``).

    Write the difference as T(2B - 1): T the share of discordant pairs, B the share of those that went
    the first way. The lower bound melds the lower confidence distributions of both (Beta laws, as in
    Clopper-Pearson): the Delta at which P[T(2B - 1) <= Delta] = alpha/2. The upper bound is the lower
    bound of the mirrored table (b and c swapped), negated.
    """
    if not (0 <= b and 0 <= c and b + c <= n):
        raise ValueError(f"need 0 <= b, c and b + c <= n, got b={b} c={c} n={n}")
    return Interval(_lower(b, b + c, n, alpha / 2), -_lower(c, b + c, n, alpha / 2))


def _lower(x: int, m: int, n: int, q: float) -> float:
    """The lower bound of the difference from x of m discordant pairs among n (exact2x2's ``lower``)."""
    if m == 0:
        return -float(special.betaincinv(1, n, 1 - q))  # -qbeta(1 - q, 1, n)
    if m == n and x == 0:  # every pair went the other way: P[T(2B - 1) <= delta] is 1 on all of [-1, 1], so
        return -1.0  # the bound is -1 (brentq would find no sign change there)
    return float(optimize.brentq(lambda delta: _p_at_most(delta, x, m, n) - q, -1.0, 1.0, xtol=1e-12))


def _p_at_most(delta: float, x: int, m: int, n: int) -> float:
    """P[T(2B - 1) <= delta] under the melded lower confidence distributions, B ~ Beta(x, m - x + 1) and
    T ~ Beta(m, n - m + 1) for delta > 0 or Beta(m + 1, n - m) for delta < 0 (the one that gives the
    larger probability: the bound is valid whichever T is); exact2x2's ``pval.1sided(alt = "greater")``."""
    if delta == 0:
        return 1.0 if x == 0 else float(special.betainc(x, m - x + 1, 0.5))
    if delta > 0:
        if m == 0 or x == 0:
            return 1.0
        return _melded(delta, x, m, (m, n - m + 1))
    if m == n:  # T is 1: P[B <= 1/2 + delta/2]
        if x == 0:  # B is 0 (Beta(0, .) is a point mass there): T(2B - 1) is -1, at most any delta >= -1
            return 1.0 if delta >= -1 else 0.0
        return float(special.betainc(x, m - x + 1, 0.5 + delta / 2))
    if x == 0:  # B is 0: P[-T <= delta] = P[T >= -delta]
        return float(special.betaincc(m + 1, n - m, -delta))
    return _melded(delta, x, m, (m + 1, n - m))


def _melded(delta: float, x: int, m: int, t_law: tuple[int, int]) -> float:
    """The integral over t of P[B <= 1/2 + delta/(2t)] times T's density. Where the bound 1/2 + delta/(2t)
    leaves [0, 1] (t below |delta|) the probability is 1 (delta > 0) or 0 (delta < 0), so that stretch
    is T's distribution function; the rest is integrated over where T has mass."""
    a, b = t_law
    lo, hi = special.betaincinv(a, b, 1e-15), special.betaincinv(a, b, 1 - 1e-15)
    start = max(lo, abs(delta))
    head = float(special.betainc(a, b, abs(delta))) if delta > 0 else 0.0
    if start >= hi:
        return head

    log_norm = float(special.betaln(a, b))

    def integrand(t: float) -> float:  # nodes lie inside (lo, hi), within (0, 1)
        bound = min(1.0, max(0.0, 0.5 + delta / (2 * t)))
        density = math.exp((a - 1) * math.log(t) + (b - 1) * math.log1p(-t) - log_norm)
        return float(special.betainc(x, m - x + 1, bound)) * density

    body, _ = integrate.quad(integrand, start, hi, epsabs=1e-13, epsrel=1e-10, limit=200)
    return min(1.0, head + body)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al. (2021), eq. 1: the chance that at least one of k samples, drawn without replacement
    from n of which c are correct, is correct: 1 - C(n - c, k) / C(n, k), as a product (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_score(votes: Iterable[tuple[str | None, bool]]) -> float:
    """maj@k of one question from its samples' (answer, correct) pairs: the most frequent answer is the
    model's. A sample without an answer (``None``) abstains; none at all scores 0. A tie between t answers
    scores 1/t if the right one is among them: the expected score of breaking the tie at random."""
    counts: dict[str, int] = {}
    right: set[str] = set()
    for answer, correct in votes:
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        if correct:
            right.add(answer)
    if not counts:
        return 0.0
    top = max(counts.values())
    leaders = [a for a, count in counts.items() if count == top]
    return sum(a in right for a in leaders) / len(leaders)
