"""Confirmation: fresh, interleaved pairs of incumbent and candidate until a rule decides.

The loop is a pure function over two seams: ``next_pair(i)`` produces the i-th pair of
trial results (in production by running trials; in tests from a list), and a
``DecisionRule`` says after each pair whether to go on and, when done, the verdict. So
the rule can be swapped without touching how trials are run, and the loop is testable
without processes. The search's rule is ``sequential.SequentialRule`` (alpha spent over
planned looks). ``IntervalRule`` is the earlier rule, kept for comparison in the tests and
benchmarks: a fixed number of pairs, then more while the interval straddles a boundary,
then ``stats.verdict`` - it looks after every added pair without spending its error, so
its false-win rate exceeds its nominal level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from trainopt.contract.protocol import TrialResult
from trainopt.stats import intervals as stats

__all__ = ["Pair", "Assessment", "DecisionRule", "IntervalRule", "Confirmation", "confirm"]


@dataclass(frozen=True)
class Pair:
    """One back-to-back pair. A side is None when the other side failed first and this one never ran."""

    candidate: TrialResult | None
    incumbent: TrialResult | None


@dataclass(frozen=True)
class Assessment:
    """A rule's answer after some pairs: go on, or stop with a verdict (and its interval)."""

    done: bool
    verdict: str | None = None
    interval: stats.PairedInterval | None = None
    reason: str = ""


class DecisionRule(Protocol):
    """Decides from paired throughputs (same order, one per pair) whether to stop and what to say."""

    def assess(self, candidate: Sequence[float], incumbent: Sequence[float]) -> Assessment: ...


@dataclass(frozen=True)
class IntervalRule:
    """``pairs`` pairs, then more up to ``max_pairs`` while ``stats.needs_more_pairs``; then ``stats.verdict``."""

    pairs: int
    max_pairs: int
    confidence: float
    min_speedup: float
    method: str = "hodges-lehmann"

    @classmethod
    def from_measure(cls, measure) -> "IntervalRule":
        """The rule for a spec's ``measure`` section."""
        return cls(measure.pairs, measure.max_pairs, measure.confidence, measure.min_speedup, measure.interval)

    def assess(self, candidate: Sequence[float], incumbent: Sequence[float]) -> Assessment:
        if len(candidate) < self.pairs:
            return Assessment(done=False)
        interval = stats.paired_interval(candidate, incumbent, self.confidence, self.method)
        if stats.needs_more_pairs(interval, self.min_speedup, self.max_pairs):
            return Assessment(done=False, interval=interval)
        return Assessment(done=True, verdict=stats.verdict(interval, self.min_speedup), interval=interval)


@dataclass
class Confirmation:
    """The outcome: verdict and reason, the interval (None when a trial failed) and every run used."""

    interval: stats.PairedInterval | None
    verdict: str
    reason: str
    candidate: list[TrialResult] = field(default_factory=list)
    incumbent: list[TrialResult] = field(default_factory=list)


def confirm(next_pair: Callable[[int], Pair], rule: DecisionRule, planned_pairs: int | None = None) -> Confirmation:
    """Ask for pairs until ``rule`` is done, or a trial fails.

    A failed candidate gives its own status as the verdict (it cannot be adopted); a failed
    incumbent makes the comparison ``inconclusive``, since the candidate is not to blame.

    Args:
        next_pair: Returns the pair with index ``i`` (0, 1, ...).
        rule: Decides when to stop and the verdict.
        planned_pairs: The number of pairs planned up front; the reason says when more were added.
    """
    cand_runs: list[TrialResult] = []
    inc_runs: list[TrialResult] = []
    i = 0
    while True:
        pair = next_pair(i)
        i += 1
        cand, inc = pair.candidate, pair.incumbent
        if cand is not None and not cand.ok:
            return Confirmation(None, cand.status, f"candidate trial {cand.status}: {cand.error}", cand_runs + [cand], inc_runs)
        if inc is not None and not inc.ok:
            return Confirmation(
                None, "inconclusive", f"incumbent trial {inc.status} during confirmation: {inc.error}", cand_runs, inc_runs + [inc]
            )
        if cand is None or inc is None:
            raise ValueError(f"pair {i - 1} is missing a side though neither failed")
        cand_runs.append(cand)
        inc_runs.append(inc)
        answer = rule.assess([r.samples_per_s for r in cand_runs], [r.samples_per_s for r in inc_runs])
        if answer.done:
            if answer.verdict not in stats.VERDICTS:
                # A swapped-in rule must speak the verdicts the search and the reports know.
                raise ValueError(f"decision rule {type(rule).__name__} returned verdict {answer.verdict!r}; expected one of {stats.VERDICTS}")
            break
    iv = answer.interval
    if iv is None:
        reason = getattr(answer, "reason", "") or f"{answer.verdict} after {len(cand_runs)} pairs"
        return Confirmation(None, answer.verdict or "inconclusive", reason, cand_runs, inc_runs)
    extra = f" after adding pairs up to {iv.n}" if planned_pairs is not None and iv.n > planned_pairs else ""
    reason = f"{iv.speedup:.3f}x [{iv.low:.3f}, {iv.high:.3f}] over {iv.n} pairs{extra}"
    return Confirmation(iv, answer.verdict, reason, cand_runs, inc_runs)
