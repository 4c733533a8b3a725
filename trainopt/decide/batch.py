"""Batch-size search as a pure sequence of probes.

The caller asks ``next_probe()`` for a size, runs a real training step at that size in a
fresh process, and answers with ``record(size, fits)``. No torch, no processes here, so
the exact sequence is testable with a fake oracle::

    start 32, max 1024, memory fits up to 300:
    32 fits, 64 fits, 128 fits, 256 fits, 512 fails      (grow x2)
    384 fails, 320 fails, 288 fits, 304 fails, 296 fits  (bisect on multiples of 8, to within 5 %)
    largest fitting 296, with a 10 % margin -> 264       (rounded down to a multiple of 8)

Where memory can only run out far above any batch worth trying (a CPU without a memory
cap), ``max_first`` probes the maximum first: one probe instead of a doubling ladder that
only shows what the maximum's probe shows (memory grows with the batch). If the maximum
fails after all, the same ladder follows, so the answer is the same at the cost of one
probe more::

    max_first, start 32, max 256, memory fits everything:  256 fits              (1 probe)
    max_first, start 32, max 1024, fits up to 300:          1024 fails, then as above
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainopt.contract.distributed import grad_accum_for

__all__ = ["BatchSizeSearch", "throughput_candidates", "Probe", "MEMORY_FREED", "second_pass_possible", "memory_edge",
           "freeing_change"]


@dataclass(frozen=True)
class Probe:
    """One answered probe."""

    size: int
    fits: bool


def _round_down(value: float, multiple: int) -> int:
    if value >= multiple:
        return int(value // multiple) * multiple
    return max(1, int(value))


@dataclass
class BatchSizeSearch:
    """Find the largest batch that fits: grow x2, then bisect, then keep a margin.

    Args:
        start: The incumbent batch size (probed first).
        maximum: Never probe above this.
        margin: Fraction kept free below the largest fitting size (memory varies a little
            between runs, and a production run has other allocations).
        tolerance: Bisection stops when the gap is within this fraction of the fitting size
            (or when no probe size is left between the fitting and the failing size).
        multiple: Bisection probes are multiples of this once they are at least this large
            (kernels and tensor cores prefer aligned sizes); below it, every integer.
        max_first: Probe ``maximum`` before anything else and stop if it fits; the start
            itself is then not probed (it is the incumbent, measured already).
    """

    start: int
    maximum: int
    margin: float = 0.1
    tolerance: float = 0.05
    multiple: int = 8
    max_first: bool = False
    probes: list[Probe] = field(default_factory=list)
    _fit: int | None = None
    _fail: int | None = None

    def __post_init__(self):
        if self.start < 1 or self.maximum < 1:
            raise ValueError("batch sizes must be positive")
        self.start = min(self.start, self.maximum)

    def next_probe(self) -> int | None:
        """The next size to try, or None when the search is over.

        Bisection stops when the gap between the largest fitting and the smallest failing
        size is within ``tolerance`` of the fitting size, or when no probe size lies
        strictly between them. Probe sizes are every integer below ``multiple`` and the
        multiples of ``multiple`` from there on, so at 8 and above the answer is within
        5 % or within one multiple (8) of the edge, whichever is larger; below 8 it is
        exact.
        """
        ceiling = self.max_first and self.maximum > self.start
        if not self.probes:
            return self.maximum if ceiling else self.start
        if ceiling and self._fit is None and [p.size for p in self.probes] == [self.maximum]:
            # The maximum failed: the ordinary ladder from the start.
            return self.start
        # Growing: until a failure, or (maximum probed first and failed) while the next
        # doubling stays below it; the maximum is never probed twice.
        growing = self._fail is None or (ceiling and self._fail == self.maximum and self._fit is not None
                                         and self._fit * 2 < self.maximum)
        if growing:
            if self._fit is None or self._fit >= self.maximum:
                return None
            return min(self._fit * 2, self.maximum)
        if self._fit is None:
            # Even the start did not fit: back off by halves.
            nxt = self._fail // 2
            return nxt if nxt >= 1 else None
        if self._fail - self._fit <= self.tolerance * self._fit:
            return None
        return self._nearest_probe_size(self._fit, self._fail)

    def _allowed(self, size: int) -> bool:
        return size < self.multiple or size % self.multiple == 0

    def _nearest_probe_size(self, fit: int, fail: int) -> int | None:
        """The allowed size strictly between ``fit`` and ``fail`` nearest their midpoint.

        Ties go to the smaller size. None when no allowed size lies between them.
        """
        mid = (fit + fail) / 2
        m = self.multiple
        near = {math.floor(mid), math.ceil(mid), math.floor(mid / m) * m, math.ceil(mid / m) * m}
        inside = [c for c in near if fit < c < fail and self._allowed(c)]
        if not inside:
            return None
        return min(inside, key=lambda c: (abs(c - mid), c))

    def record(self, size: int, fits: bool) -> None:
        """Answer a probe: did a full training step at ``size`` fit in memory?"""
        self.probes.append(Probe(size, fits))
        if fits:
            self._fit = size if self._fit is None else max(self._fit, size)
        else:
            self._fail = size if self._fail is None else min(self._fail, size)

    @property
    def largest_fitting(self) -> int | None:
        """The largest size that fitted (None when none did)."""
        return self._fit

    @property
    def safe_maximum(self) -> int | None:
        """The largest fitting size less the margin, rounded down to a multiple.

        The margin applies only when some size failed; when the maximum fitted, memory was
        never the limit and the maximum itself is safe.
        """
        if self._fit is None:
            return None
        if self._fail is None or self.margin == 0:
            return self._fit
        step = self.multiple if self._fit >= self.multiple else 1
        return max(1, min(self._fit, _round_down(self._fit * (1 - self.margin), step)))


def throughput_candidates(
    incumbent: int, safe_max: int, max_candidates: int = 4, effective_batch: int | None = None, world_size: int = 1
) -> list[int]:
    """Batch sizes whose throughput is worth measuring, smallest first.

    Powers of two above the incumbent up to ``safe_max``, and ``safe_max`` itself. With
    ``effective_batch`` set, only sizes that divide it (grad_accum makes up the rest).
    Larger is not always faster (cache pressure on CPUs), so several sizes are measured
    rather than assuming the largest wins.

    Args:
        incumbent: The current batch size (never a candidate).
        safe_max: The largest size to consider.
        max_candidates: At most this many, spread evenly on a log scale, the largest kept.
        effective_batch: batch_size x grad_accum x world_size must equal this, when set.
        world_size: Ranks of a data-parallel trial (``batch_size`` is per rank).
    """
    sizes = set()
    p = 1
    while p <= safe_max:
        if p > incumbent:
            sizes.add(p)
        p *= 2
    if safe_max > incumbent:
        sizes.add(safe_max)
    if effective_batch is not None:
        sizes = {s for s in sizes if grad_accum_for(effective_batch, s, world_size) is not None}
    ordered = sorted(sizes)
    if len(ordered) <= max_candidates:
        return ordered
    # Keep the largest and spread the rest evenly in log space.
    picks = {ordered[-1]}
    lo, hi = math.log(ordered[0]), math.log(ordered[-1])
    for i in range(max_candidates - 1):
        target = lo + (hi - lo) * i / max(1, max_candidates - 1)
        picks.add(min(ordered, key=lambda s: abs(math.log(s) - target)))
    return sorted(picks)[:max_candidates] if len(picks) > max_candidates else sorted(picks)


# The second batch pass. The batch size is decided first, at the baseline's precision and
# layout; a change kept later (autocast, compile, channels-last, ...) can lower the memory a
# sample takes, and then a larger batch fits than the first pass could probe. Whether it
# did is measured directly: one probe of the new incumbent at the smallest size that ran out
# of memory before. Peak figures alone cannot say it on a CPU, where a process's resident
# memory is mostly the runtime's and per-sample savings are a few per cent of it.

# A kept change whose peak, against its incumbent's at the same batch size, is at least this
# much lower is reported as lowering it: peaks of one setting differ by a few per cent
# between processes (allocator caching, loader workers sampled at window edges).
MEMORY_FREED = 0.05


def second_pass_possible(search_knobs: list[str] | tuple[str, ...] | set[str] | dict) -> bool:
    """Whether a search over these knobs may run a second batch pass (its error budget is counted from the start):
    it searches the batch size and at least one other knob."""
    return "batch_size" in search_knobs and len(search_knobs) > 1


def memory_edge(probes: list[dict]) -> int | None:
    """The smallest batch size whose probe ran out of memory, or None when memory set no limit."""
    sizes = [p["size"] for p in probes if not p.get("fits") and p.get("status") == "oom" and isinstance(p.get("size"), int)]
    return min(sizes) if sizes else None


def freeing_change(decisions: list[dict]) -> dict | None:
    """The kept change after the batch stage most likely to have freed memory, or None when none was kept.

    Args:
        decisions: The decisions made after the batch stage, as plain dicts with ``knob``,
            ``kept``, ``from``, ``to``, ``before_peak_memory_bytes`` and ``after_peak_memory_bytes``
            (the incumbent's and the candidate's peaks at the same batch size).

    Returns:
        ``{knob, from, to, before_peak_memory_bytes, after_peak_memory_bytes, ratio, lowered}``:
        the kept change with the lowest peak ratio (the last kept one when none has both
        peaks); ``lowered`` says whether its ratio is at most ``1 - MEMORY_FREED``.
    """
    best = None
    for d in decisions:
        if not d.get("kept") or d.get("knob") == "batch_size":
            continue
        before, after = d.get("before_peak_memory_bytes"), d.get("after_peak_memory_bytes")
        ratio = after / before if before and after else None
        row = {"knob": d.get("knob"), "from": d.get("from"), "to": d.get("to"), "before_peak_memory_bytes": before,
               "after_peak_memory_bytes": after, "ratio": ratio,
               "lowered": ratio is not None and ratio <= 1.0 - MEMORY_FREED}
        if best is None or (ratio is not None and (best["ratio"] is None or ratio <= best["ratio"])) or (
                ratio is None and best["ratio"] is None):
            best = row
    return best
