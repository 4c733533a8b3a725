"""The throughput and memory figures of a decision, from the trials it rests on."""

from __future__ import annotations

import statistics

from trainopt.contract.protocol import TrialResult
from trainopt.decide.verdict import Decision

__all__ = ["median", "median_rate", "fill_figures"]


def median(values: list[float | None]) -> float | None:
    """The median of the values present (None when none is)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def median_rate(results: list[TrialResult]) -> float | None:
    """The median throughput of some trials (None when none measured one)."""
    return median([r.samples_per_s for r in results])


def fill_figures(d: Decision, inc: list[TrialResult], cand: list[TrialResult]) -> None:
    """Set a decision's before and after throughput (medians) and peak memory (maxima) from its arms."""
    d.before_samples_per_s = median([x.samples_per_s for x in inc])
    d.after_samples_per_s = median([x.samples_per_s for x in cand])
    d.before_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in inc) or None
    d.after_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in cand) or None
