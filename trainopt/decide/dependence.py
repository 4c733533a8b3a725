"""Serial dependence of a confirmation's pairs, and how much it widens their interval.

The confirmation's intervals assume independent pairs. When the machine's speed for one
configuration wanders over minutes (a thermal state, a neighbour's job that lasts several
sessions), successive pairs' log-ratios share part of their noise: with lag-1
autocorrelation ``rho`` of an AR(1) series, the variance of their mean is about
``(1 + rho) / (1 - rho)`` times what independent pairs give, and an interval of the usual
width misses the truth far more often than planned (at ``rho`` 0.3 a search's false
``improved`` at the margin doubles).

``inflation`` estimates ``rho`` from the pairs themselves (their lag-1 autocorrelation,
corrected for its downward bias in short series, ``E[r1] ~ rho - (1 + 4 rho) / n``, and
taken ``RHO_MARGIN`` standard errors ``1 / sqrt(n)`` high, as a dozen pairs estimate it
only roughly) and returns the factor by which the interval's half-widths grow: the square root of the
AR(1) variance ratio at that ``rho``, the effective-sample-size correction
``n_eff = n (1 - rho) / (1 + rho)``. Negative estimates widen nothing (independent pairs
scatter around zero), and ``rho`` is capped at ``MAX_RHO`` so that one odd series cannot
make the interval useless. Plain numbers in, a number out.
"""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["lag1", "corrected_rho", "inflation", "MIN_PAIRS", "MAX_RHO", "RHO_MARGIN"]

# Fewer pairs give no usable autocorrelation (the estimate's sd is about 1/sqrt(n)).
MIN_PAIRS = 5
# Standard errors (1/sqrt(n)) added to the bias-corrected estimate. Simulated through the
# search with the guard on (benchmarks/guard_verdicts.py --cases ar1 --rhos 0.3: AR(1) drift,
# pair sd 0.06, truth at the margin, 2,500 searches), false improved at rho 0.3 is 2.3 % with
# 0.5, 2.1 % with 0.75 and 1.8 % with 1.0; a true +10 % at pair sd 0.09 reaches best.yaml in
# 91.0 %, 90.3 % and 89.3 % of 300 searches (benchmarks/search_verdicts.py). 0.75 keeps both
# the 2.5 % bound and the 90 % power. A measured series of 240 A/A sessions of this design
# showed no dependence (lag-1 -0.02, benchmarks/data/aa-series.json), so on a quiet machine
# this margin is a price paid for drift that may come, not for drift seen.
RHO_MARGIN = 0.75
# The largest lag-1 autocorrelation credited: a factor of sqrt(1.6 / 0.4) = 2 at most.
MAX_RHO = 0.6


def lag1(x: Sequence[float]) -> float | None:
    """The lag-1 autocorrelation of ``x`` (None for fewer than ``MIN_PAIRS`` values or no spread)."""
    n = len(x)
    if n < MIN_PAIRS:
        return None
    mean = sum(x) / n
    d = [v - mean for v in x]
    var = sum(v * v for v in d)
    if var <= 0:
        return None
    return sum(d[i] * d[i + 1] for i in range(n - 1)) / var


def corrected_rho(x: Sequence[float]) -> float:
    """The lag-1 autocorrelation credited: bias removed, ``RHO_MARGIN`` standard errors high, in ``[0, MAX_RHO]``.

    The sample lag-1 autocorrelation of an AR(1) series of ``n`` values is low by about
    ``(1 + 4 rho) / n`` (Marriott and Pope 1954); solving ``r1 = rho - (1 + 4 rho) / n`` for
    ``rho`` gives ``(n r1 + 1) / (n - 4)``.
    """
    r1 = lag1(x)
    if r1 is None:
        return 0.0
    n = len(x)
    rho = (n * r1 + 1.0) / (n - 4.0) + RHO_MARGIN / math.sqrt(n)
    return min(MAX_RHO, max(0.0, rho))


def inflation(x: Sequence[float]) -> float:
    """The factor (>= 1) by which an interval from pairs ``x`` is widened for their serial dependence."""
    rho = corrected_rho(x)
    return math.sqrt((1.0 + rho) / (1.0 - rho))
