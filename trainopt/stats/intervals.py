"""Statistics over plain numbers: steady-state cut, window summaries, paired intervals.

Nothing here knows about torch or processes, so every rule is testable in milliseconds.

The confirmation statistic is the paired log-ratio ``log(candidate / incumbent)`` of
throughputs measured back to back. Paired, because consecutive processes share the
machine's state (thermal, neighbours, caches) and the pair difference cancels most of it.
Log, because speedups multiply and the log makes them symmetric. The default interval is
the Hodges–Lehmann estimate with its Wilcoxon signed-rank confidence interval: on these
machines most runs agree within a few percent but a few are far off, and a rank interval
neither lets one wild pair fake a win nor lets it hide a real one, which a t-interval on
the mean does (one outlier inflates the standard deviation and the mean alike).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np
from scipy import stats as sps

from trainopt.stats.ranks import signed_rank_cdf

__all__ = [
    "SteadyState",
    "steady_state",
    "summarize_windows",
    "PairedInterval",
    "paired_interval",
    "verdict",
    "needs_more_pairs",
    "VERDICTS",
]

VERDICTS = ("improved", "regressed", "equivalent", "inconclusive")


@dataclass(frozen=True)
class SteadyState:
    """Where the warm-up transient ends in a series of window throughputs.

    Attributes:
        start: Index of the first window kept.
        steady: False when the series never settles (the best cut discards more than
            half of the windows), so the figure must not be reported as steady state.
    """

    start: int
    steady: bool


def steady_state(windows: Sequence[float], min_keep: int = 3) -> SteadyState:
    """Choose the warm-up cut with the MSER rule (White 1997).

    MSER picks the truncation point ``d`` that minimises the squared standard error of
    the mean of the remaining windows, ``sum((x[d:] - mean)^2) / (n - d)^2``. The windows
    are already batch means of many steps, so this is MSER on batches.

    Args:
        windows: Throughput of each timed window, in order.
        min_keep: Never keep fewer windows than this.

    Returns:
        The cut, and whether the series settled within its budget.
    """
    x = np.asarray(windows, dtype=float)
    n = len(x)
    if n <= min_keep:
        return SteadyState(0, n > 0)
    # A running median of three removes single-window spikes (another process taking the
    # core for a moment) before the cut is chosen: MSER is meant to find the warm-up
    # transient, and one spike in the middle would otherwise drag the cut past it. The
    # spike itself stays in the reported throughput.
    if n >= 3:
        padded = np.concatenate(([x[0]], x, [x[-1]]))
        x = np.median(np.stack([padded[:-2], padded[1:-1], padded[2:]]), axis=0)
    best_d, best = 0, math.inf
    for d in range(0, n - min_keep + 1):
        tail = x[d:]
        score = float(np.sum((tail - tail.mean()) ** 2)) / (len(tail) ** 2)
        if score < best - 1e-12 * max(1.0, abs(best) if math.isfinite(best) else 1.0):
            best_d, best = d, score
    return SteadyState(best_d, best_d <= n // 2)


def summarize_windows(windows: Sequence[float]) -> dict[str, float]:
    """Median, inter-quartile range and coefficient of variation of window throughputs."""
    x = np.asarray(windows, dtype=float)
    if len(x) == 0:
        return {"median": float("nan"), "iqr": float("nan"), "cv": float("nan")}
    q1, med, q3 = np.percentile(x, [25, 50, 75])
    cv = float(np.std(x, ddof=1) / np.mean(x)) if len(x) > 1 and np.mean(x) > 0 else 0.0
    return {"median": float(med), "iqr": float(q3 - q1), "cv": cv}


@dataclass(frozen=True)
class PairedInterval:
    """A speedup (candidate / incumbent) with its confidence interval.

    Attributes:
        speedup: Point estimate of the throughput ratio.
        low: Lower end of the interval on the ratio.
        high: Upper end of the interval on the ratio.
        n: Number of pairs.
        confidence: Nominal coverage.
        method: ``hodges-lehmann`` or ``t``.
        coverage: Achieved coverage (rank intervals move in discrete steps).
    """

    speedup: float
    low: float
    high: float
    n: int
    confidence: float
    method: str
    coverage: float

    def to_dict(self) -> dict:
        return asdict(self)


def _wilcoxon_rank(n: int, alpha: float) -> int:
    """The 1-based rank ``k`` of the Walsh average that bounds the interval.

    The interval is ``[W(k), W(M - k + 1)]`` with ``k`` the largest value such that
    ``P(T <= k - 1) <= alpha / 2``; 1 when even the extreme ranks do not reach it.
    """
    if n <= 60:
        cdf = signed_rank_cdf(n)
        k = 0
        while k < len(cdf) and cdf[k] <= alpha / 2:
            k += 1
        return max(k, 1)
    # Normal approximation for large n, where the exact count grows needlessly big.
    mean = n * (n + 1) / 4
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    return max(int(math.floor(mean - sps.norm.ppf(1 - alpha / 2) * sd)), 1)


def paired_interval(
    candidate: Sequence[float],
    incumbent: Sequence[float],
    confidence: float = 0.95,
    method: str = "hodges-lehmann",
) -> PairedInterval:
    """Interval for the throughput ratio candidate / incumbent from paired runs.

    Args:
        candidate: Throughputs of the candidate, one per pair.
        incumbent: Throughputs of the incumbent, in the same pair order.
        confidence: Two-sided confidence level.
        method: ``hodges-lehmann`` (Wilcoxon signed-rank interval on the Walsh averages
            of log-ratios) or ``t`` (Student t interval on the mean log-ratio).

    Returns:
        The ratio estimate and interval, back on the ratio scale.

    Raises:
        ValueError: Fewer than two pairs, unequal lengths or non-positive throughputs.
    """
    c = np.asarray(candidate, dtype=float)
    b = np.asarray(incumbent, dtype=float)
    if len(c) != len(b):
        raise ValueError(f"unequal pair lists: {len(c)} candidate vs {len(b)} incumbent")
    if len(c) < 2:
        raise ValueError(f"need at least 2 pairs, got {len(c)}")
    if np.any(c <= 0) or np.any(b <= 0) or not np.all(np.isfinite(c)) or not np.all(np.isfinite(b)):
        raise ValueError("throughputs must be positive and finite")
    r = np.log(c) - np.log(b)
    n = len(r)
    alpha = 1.0 - confidence
    if method == "t":
        mean = float(r.mean())
        se = float(r.std(ddof=1) / math.sqrt(n))
        half = float(sps.t.ppf(1 - alpha / 2, n - 1)) * se
        return PairedInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, confidence, "t", confidence)
    if method != "hodges-lehmann":
        raise ValueError(f"unknown interval method {method!r}; use hodges-lehmann or t")
    i, j = np.triu_indices(n)
    walsh = np.sort((r[i] + r[j]) / 2.0)
    m = len(walsh)
    k = _wilcoxon_rank(n, alpha)
    if n <= 60:
        cdf = signed_rank_cdf(n)
        coverage = 1.0 - 2.0 * cdf[k - 1]
    else:
        coverage = confidence
    low, high = walsh[k - 1], walsh[m - k]
    return PairedInterval(
        float(math.exp(np.median(walsh))), float(math.exp(low)), float(math.exp(high)), n, confidence, "hodges-lehmann", coverage
    )


def verdict(interval: PairedInterval, min_speedup: float) -> str:
    """Turn an interval into a decision.

    The rules are checked in this order, and the first that holds decides:

    1. ``inconclusive`` whenever the interval's achieved coverage is below its nominal
       confidence (too few pairs for a rank interval to reach it).
    2. ``improved`` iff the lower bound exceeds ``1 + min_speedup``.
    3. ``equivalent`` iff the whole interval lies within ``[1 - min_speedup, 1 + min_speedup]``.
    4. ``regressed`` iff the upper bound is below 1.
    5. otherwise ``inconclusive``.

    ``equivalent`` comes before ``regressed`` on purpose: ``min_speedup`` is the smallest
    change that matters, in either direction, so an interval such as [0.975, 0.995] is a
    real but immaterial slowdown, and is called ``equivalent`` as the README promises.
    ``regressed`` therefore means "slower, and possibly by more than ``min_speedup``".
    The two rules never disagree on adoption: neither is adopted.
    """
    if interval.coverage < interval.confidence - 1e-9:
        # Too few pairs for a rank interval to reach the asked confidence (e.g. 4 pairs give
        # at most 87.5 %): no verdict may be claimed from it yet.
        return "inconclusive"
    if interval.low > 1.0 + min_speedup:
        return "improved"
    if interval.low >= 1.0 - min_speedup and interval.high <= 1.0 + min_speedup:
        return "equivalent"
    if interval.high < 1.0:
        return "regressed"
    return "inconclusive"


def needs_more_pairs(interval: PairedInterval, min_speedup: float, max_pairs: int) -> bool:
    """True while more pairs could still change whether the candidate is adopted.

    Pairs are added while the interval straddles a decision boundary and the budget
    lasts, except once the upper bound is below ``1 + min_speedup``: then no amount of
    pairs can make the candidate ``improved`` (at this confidence), and since only
    improvements are adopted, further pairs would only refine a rejection.
    """
    if interval.n >= max_pairs or verdict(interval, min_speedup) != "inconclusive":
        return False
    return interval.high >= 1.0 + min_speedup
