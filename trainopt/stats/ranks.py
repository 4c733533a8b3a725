"""Exact Wilcoxon signed-rank kernels: the null distribution, reachable levels, Walsh-average bounds.

Under the null of log-ratios symmetric about a shift, every sign pattern of the ranks is
equally likely, so the signed-rank statistic has an exact distribution that needs no
assumption on the scale or the tails of the noise. An interval from the ``k``-th smallest
and largest Walsh averages misses the shift with probability exactly ``2 P(T <= k - 1)``;
only those discrete levels exist, and few pairs may reach none within a small budget.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

__all__ = [
    "signed_rank_cdf",
    "lower_signed_rank_cdf",
    "exact_rank_level",
    "walsh_averages",
    "rank_interval",
    "min_decidable_pairs",
]


@lru_cache(maxsize=256)
def signed_rank_cdf(n: int) -> tuple[float, ...]:
    """Exact null CDF of the Wilcoxon signed-rank statistic for ``n`` pairs.

    Counts subsets of ranks {1..n} by their sum; every subset is equally likely under
    the null of a distribution symmetric about zero.
    """
    total = n * (n + 1) // 2
    counts = np.zeros(total + 1, dtype=float)
    counts[0] = 1.0
    for rank in range(1, n + 1):
        counts[rank:] = counts[rank:] + counts[: total + 1 - rank].copy()
    cdf = np.cumsum(counts) / 2.0**n
    return tuple(float(c) for c in cdf)


@lru_cache(maxsize=64)
def lower_signed_rank_cdf(n: int) -> np.ndarray:
    """The lower half of the exact signed-rank null CDF (two-sided levels never need more)."""
    return np.asarray(signed_rank_cdf(n)[: n * (n + 1) // 4 + 1])


def exact_rank_level(n: int, budget: float) -> tuple[int, float]:
    """The widest-reaching exact signed-rank bound within a two-sided budget.

    Args:
        n: Number of pairs.
        budget: Two-sided error level the interval may have at most.

    Returns:
        ``(k, level)``: the interval ``[W(k), W(M - k + 1)]`` over the sorted Walsh
        averages misses a symmetric shift with probability exactly ``level = 2 P(T <= k-1)``,
        the largest such level not above ``budget``; ``(0, 0.0)`` when even the extreme
        Walsh averages cannot reach it.
    """
    if budget <= 0:
        return 0, 0.0
    cdf = lower_signed_rank_cdf(n)
    # cdf is increasing: the number of entries <= budget / 2 is the rank k.
    k = int(np.searchsorted(cdf, budget / 2.0 * (1 + 1e-12), side="right"))
    if k == 0:
        return 0, 0.0
    return k, 2.0 * float(cdf[k - 1])


def walsh_averages(r: np.ndarray) -> np.ndarray:
    """The sorted Walsh averages (pairwise means, each value with itself included)."""
    i, j = np.triu_indices(len(r))
    return np.sort((r[i] + r[j]) / 2.0)


def rank_interval(r: np.ndarray, k: int) -> tuple[float, float, float]:
    """Hodges-Lehmann estimate and the k-th Walsh-average bounds, on the log scale.

    ``intervals.paired_interval`` approximates the rank beyond 60 pairs; small spent
    levels need the exact rank for their guarantee, so the bounds are taken here.
    """
    walsh = walsh_averages(r)
    return float(np.median(walsh)), float(walsh[k - 1]), float(walsh[len(walsh) - k])


def min_decidable_pairs(confidence: float = 0.95, family: int = 2) -> int:
    """The fewest pairs whose exact rank interval reaches a share of the error budget.

    A confirmation sharing its knob's budget ``1 - confidence`` with ``family - 1`` others
    can claim nothing with fewer pairs (7 at 95 % with two confirmations per knob).
    """
    n = 2
    while exact_rank_level(n, (1.0 - confidence) / family)[0] == 0:
        n += 1
    return n
