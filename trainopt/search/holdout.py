"""Held-out sessions: the unbiased figure of each kept change, from fresh pairs measured after its verdict.

The reported speedup of an ``improved`` change is inflated by the stop that decided it, so
its figure comes from further fresh pairs that took no part in the verdict
(``sequential.holdout_estimate``). Each held-out session runs with no other session beside
it, as the final check's do, so its pairs can also serve the final check:

* Against the baseline itself (the first kept change) its pairs are exactly the final
  check's comparison when no later change is kept. They are therefore measured at the end
  of the search unless a later change is kept (``DeferredHoldout``).
* After an earlier kept change each session has the baseline as a third arm: the candidate
  against the incumbent gives the held-out speedup, the incumbent against the baseline the
  first kept change's (when the incumbent is exactly that change), and the candidate
  against the baseline, in the same fresh sessions, is the final check if no later change
  is kept (six three-arm sessions instead of six more two-arm ones).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from trainopt.decide import plan
from trainopt.decide.confirmation import Pair
from trainopt.decide.recommendation import check_claim, claimed_speedup
from trainopt.decide.sequential import holdout_estimate, holdout_pairs
from trainopt.decide.verdict import Decision
from trainopt.search.broker import TrialBroker
from trainopt.search.figures import fill_figures
from trainopt.stats import intervals as stats

__all__ = ["DeferredHoldout", "HeldOutSessions"]


@dataclass
class DeferredHoldout:
    """The first kept change, whose held-out sessions are not measured yet.

    Attributes:
        decision: Its decision (kept, with the deciding interval's figures until then).
        baseline: The settings it was confirmed against: the baseline.
        settings: Its settings (the incumbent of every later knob).
        knob: Its knob.
        stage: Its stage.
        reason: Its verdict's reason before any held-out figure.
    """

    decision: Decision
    baseline: dict[str, Any]
    settings: dict[str, Any]
    knob: str
    stage: str
    reason: str = ""


class HeldOutSessions:
    """Measures the held-out sessions of kept changes, defers the first one's, and keeps them for the final check.

    Args:
        broker: Runs the sessions.
        measure: The spec's measure section (confidence and interval of the estimates).

    Attributes:
        deferred: The first kept change, while its held-out figure waits for the held-out
            sessions of a later kept change or for the end of the search (``finish``).
    """

    def __init__(self, broker: TrialBroker, measure: Any):
        self.broker = broker
        self.measure = measure
        self.deferred: DeferredHoldout | None = None
        # Fresh pairs of the baseline against each kept change's settings, measured by its
        # held-out sessions, by (baseline hash, candidate hash), with the stability guard's
        # flags raised while they ran and what they were: a final check of exactly that
        # comparison reuses them (``reusable``).
        self._comparisons: dict[tuple[str, str], tuple[list[Pair], list[str], str]] = {}

    @property
    def pending(self) -> bool:
        """Whether the first kept change's held-out sessions are still owed."""
        return self.deferred is not None

    def estimate(self, d: Decision, incumbent: dict[str, Any], settings: dict[str, Any], knob: str, stage: str) -> bool:
        """The held-out figure of a change just confirmed improved; returns whether it may be kept.

        The first kept change's is deferred (its decision is marked pending): its held-out
        pairs are the final check's if no later change is kept, and a later kept change's
        held-out sessions measure it against the baseline anyway (their third arm), so
        measuring them now would measure them twice whenever a later change is kept.
        """
        if plan.settings_hash(incumbent) == plan.settings_hash(self.broker.spec.baseline) and self.deferred is None:
            self.deferred = DeferredHoldout(d, dict(incumbent), dict(settings), knob, stage, d.reason)
            d.extra["holdout_pending"] = True
            d.reason += "; held-out estimate to come (from a later kept change's held-out sessions, or at the end)"
            return True
        return self._settle(d, *self._measure(incumbent, settings, knob, stage))

    def finish(self, incumbent: dict[str, Any]) -> dict[str, Any]:
        """Measure the held-out sessions still owed by the first kept change; return the settings to keep.

        Called once every knob is decided. When no later change was kept, the first kept
        change's held-out pairs are measured now (they are also the final check's pairs);
        a candidate that fails in them is dropped, and the baseline comes back.
        """
        first = self.deferred
        if first is None:
            return incumbent
        self.deferred = None
        d = first.decision
        d.extra.pop("holdout_pending", None)
        d.reason = first.reason
        if plan.settings_hash(incumbent) != plan.settings_hash(first.settings):
            # A later change was kept, but an arm failed in the held-out sessions that were
            # to measure this one too; the final check measures the combination itself.
            d.reason += "; an arm failed in the held-out sessions that measured it, so the figure is the deciding interval's (may run high)"
            return incumbent
        n0 = len(self.broker.unstable)
        keep = self._settle(d, *self._measure(first.baseline, first.settings, first.knob, first.stage))
        own = self.broker.unstable[n0:]
        if own:
            d.extra["unstable"] = "; ".join(filter(None, [d.extra.get("unstable"), *own]))
        if keep:
            return incumbent
        d.kept = False
        return dict(first.baseline)

    def reusable(self, base: dict[str, Any], incumbent: dict[str, Any]) -> tuple[list[Pair], list[str], str]:
        """Fresh pairs of the baseline against the final settings that the last kept change's held-out sessions measured.

        With a single kept change its held-out pairs are fresh pairs of exactly the final
        check's two settings; after an earlier kept change, the held-out sessions also ran
        the baseline. Either way they were measured after the last kept change's verdict,
        with no other session beside them, and no decision used them (a later knob that
        kept nothing decided on pairs of its own), so they serve as the final check's pairs
        (they cost 6 sessions otherwise).

        Returns:
            The reusable pairs (none when they do not apply), the stability guard's flags
            raised while they ran, and what they were.
        """
        return self._comparisons.get((plan.settings_hash(base), plan.settings_hash(incumbent)), ([], [], ""))

    def _measure(self, incumbent: dict[str, Any], settings: dict[str, Any], knob: str,
                 stage: str) -> tuple[stats.PairedInterval | None, list[Pair]]:
        """Fresh pairs measured after an ``improved`` verdict, for an unbiased speedup (None if one failed).

        After an earlier kept change each session has the baseline as a third arm (see the
        module docstring); when the incumbent is exactly the deferred first kept change,
        those arms give its figure too.
        """
        n = holdout_pairs(self.measure.confidence, self.measure.interval)
        n0 = len(self.broker.unstable)
        baseline = self.broker.spec.baseline
        against_baseline = plan.settings_hash(incumbent) == plan.settings_hash(baseline)
        nxt = self.broker.pair_sessions(incumbent, settings, stage=stage, knob=knob, role="holdout", planned=lambda i: n,
                                        exclusive=True, extra=None if against_baseline else dict(baseline))
        pairs = [nxt(i) for i in range(n)]
        unstable = self.broker.unstable[n0:]
        if not against_baseline:
            sessions = [nxt.sessions[i] for i in range(n)]  # type: ignore[attr-defined]
            first = self.deferred
            if (first is not None and plan.settings_hash(first.settings) == plan.settings_hash(incumbent)
                    and all(s.arms[0].ok and s.arms[2].ok for s in sessions)):
                self.deferred = None
                self._settle_deferred(first, [Pair(candidate=s.arms[0], incumbent=s.arms[2]) for s in sessions], unstable,
                                      f"the incumbent and baseline arms of the held-out sessions of {knob}={settings[knob]}")
        if not all(p.candidate.ok and p.incumbent.ok for p in pairs):
            return None, pairs
        if against_baseline:
            self._comparisons[(plan.settings_hash(incumbent), plan.settings_hash(settings))] = (
                pairs, unstable, f"the held-out pairs of {knob}={settings[knob]}, the only kept change, so they compared "
                                 "exactly these settings with the baseline")
        elif all(s.arms[2].ok for s in sessions):
            self._comparisons[(plan.settings_hash(baseline), plan.settings_hash(settings))] = (
                [Pair(candidate=s.arms[1], incumbent=s.arms[2]) for s in sessions], unstable,
                f"the baseline arms of the held-out sessions of {knob}={settings[knob]}, the last kept change: "
                "the same fresh sessions compared these settings with the baseline")
        logs = [math.log(p.candidate.samples_per_s / p.incumbent.samples_per_s) for p in pairs]
        return holdout_estimate(logs, self.measure.confidence, self.measure.interval), pairs

    def _settle_deferred(self, first: DeferredHoldout, pairs: list[Pair], unstable: list[str], label: str) -> None:
        """The first kept change's held-out figure from a later kept change's sessions."""
        d = first.decision
        logs = [math.log(p.candidate.samples_per_s / p.incumbent.samples_per_s) for p in pairs]
        d.extra.pop("holdout_pending", None)
        d.reason = first.reason
        self._settle(d, holdout_estimate(logs, self.measure.confidence, self.measure.interval), pairs, label)
        if unstable:
            d.extra["unstable"] = "; ".join(filter(None, [d.extra.get("unstable"), *unstable]))

    def _settle(self, d: Decision, est: stats.PairedInterval | None, held: list[Pair], label: str = "") -> bool:
        """Fill in the held-out figure (``label``: where its pairs come from); returns whether the change may still be kept."""
        failed = next((p.candidate for p in held if not p.candidate.ok), None)
        if failed is not None:
            # A candidate that fails when measured again is not shipped, however fast it was.
            d.verdict, d.reason = failed.status, f"{d.reason}; then failed in a held-out pair: {failed.error}"
            return False
        if est is None:
            d.reason += "; an incumbent arm failed in the held-out pairs, so the figure is the deciding interval's (may run high)"
            return True
        # The row's figure, interval and pair count all come from the held-out pairs; the
        # deciding ones stay in ``extra.decision_interval``.
        d.speedup, d.ci, d.n_pairs, d.coverage = est.speedup, [est.low, est.high], est.n, est.coverage
        logs = [math.log(p.candidate.samples_per_s / p.incumbent.samples_per_s) for p in held]
        d.extra["holdout"] = {"speedup": est.speedup, "ci": [est.low, est.high], "n_pairs": est.n,
                              "check": check_claim(logs, claimed_speedup([d], 1.0 + self.measure.min_speedup)).to_dict()}
        fill_figures(d, [p.incumbent for p in held], [p.candidate for p in held])
        d.reason += f"; held-out estimate {est.speedup:.3f}x [{est.low:.3f}, {est.high:.3f}] over {est.n} fresh pairs"
        if label:
            d.reason += f" ({label})"
        return True
