"""One knob's stage: screen every candidate, confirm the most promising, adopt it if improved.

Used by every knob, the batch size included (``batch_stage`` makes its candidates from
real memory probes first). Trials come from the ``TrialBroker``; the verdict from
``confirmation.confirm`` with the search's ``DecisionRule``.
"""

from __future__ import annotations

import statistics
from typing import Any

from trainopt import knobs, plan
from trainopt.broker import TrialBroker
from trainopt.confirmation import DecisionRule, confirm
from trainopt.decision import Decision, judge_compile
from trainopt.protocol import TrialResult

__all__ = ["SearchFailed", "KnobStage"]


class SearchFailed(Exception):
    """The search cannot go on (for example, the baseline itself fails)."""


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


class KnobStage:
    """Screens, confirms and adopts candidates for one knob at a time.

    Args:
        broker: Runs or reuses trials.
        rule: Decides each confirmation.
        min_speedup: A screen must reach ``1 + min_speedup`` to be confirmed.
        pairs: Pairs planned per confirmation (for the reason text).
        run_length_steps: For the compile judgement.
        decisions: Where decisions are appended (the search state's list).
    """

    def __init__(self, broker: TrialBroker, rule: DecisionRule, *, min_speedup: float, pairs: int, run_length_steps: int, decisions: list[Decision]):
        self.broker = broker
        self.rule = rule
        self.min_speedup = min_speedup
        self.pairs = pairs
        self.run_length_steps = run_length_steps
        self.decisions = decisions

    def run(self, incumbent: dict[str, Any], knob: str, stage: str, values: list[Any]) -> dict[str, Any]:
        """Try every value of ``knob``; return the new incumbent (the old one unless one was confirmed)."""
        runnable = []
        for settings in plan.candidates(incumbent, knob, values):
            reason = knobs.not_applicable_reason(settings, self.broker.device_type, self.broker.world_size)
            if reason:
                # Recorded, not run: a no-op on this device would only measure noise.
                self.broker.trial(settings, stage=stage, knob=knob, role="screen", tag="candidate")
                self.decisions.append(
                    Decision(knob=knob, stage=stage, from_value=incumbent[knob], to_value=settings[knob], verdict="not_applicable", reason=reason)
                )
            else:
                runnable.append(settings)
        if not runnable:
            return incumbent
        return self.screen_and_decide(incumbent, runnable, knob, stage)

    def screen_and_decide(self, incumbent: dict[str, Any], cands: list[dict[str, Any]], knob: str, stage: str) -> dict[str, Any]:
        """Screen ``cands`` against ``incumbent``, confirm the best, and return the adopted settings."""
        ref, screens = self._screen(incumbent, cands, stage, knob)
        return self._decide(incumbent, knob, stage, ref, screens)

    def _screen(self, incumbent: dict[str, Any], cands: list[dict[str, Any]], stage: str, knob: str):
        """One fresh run of the incumbent and of each candidate; point speedups only."""
        ref = self.broker.trial(incumbent, stage=stage, knob=knob, role="screen", tag="incumbent")
        if not ref.ok:
            raise SearchFailed(f"the incumbent failed while screening {knob} ({ref.status}: {ref.error}); log: {ref.log_path}")
        screens = []
        for settings in cands:
            r = self.broker.trial(settings, stage=stage, knob=knob, role="screen", tag="candidate")
            sp = (r.samples_per_s / ref.samples_per_s) if r.ok and r.samples_per_s else None
            screens.append((settings, r, sp))
        return ref, screens

    def _decide(self, incumbent: dict[str, Any], knob: str, stage: str, ref: TrialResult, screens) -> dict[str, Any]:
        """Turn screens into decisions, confirm the most promising, adopt it if improved."""
        threshold = 1.0 + self.min_speedup
        viable = [(s, r, sp) for s, r, sp in screens if sp is not None]
        best = max(viable, key=lambda t: t[2]) if viable else None
        adopted = incumbent
        for settings, r, sp in screens:
            d = Decision(
                knob=knob,
                stage=stage,
                from_value=incumbent[knob],
                to_value=settings[knob],
                verdict="",
                screen_speedup=sp,
                before_samples_per_s=ref.samples_per_s,
                after_samples_per_s=r.samples_per_s,
                before_peak_memory_bytes=ref.peak_memory_bytes,
                after_peak_memory_bytes=r.peak_memory_bytes,
            )
            if knob == "batch_size":
                d.extra["grad_accum"] = settings["grad_accum"]
            if not r.ok:
                d.verdict, d.reason = r.status, r.error or r.status
            elif best is None or settings is not best[0] or sp <= threshold:
                d.verdict = "screened-out"
                d.reason = f"screened at {sp:.3f}x; " + (
                    f"below the {threshold:.2f}x needed to confirm" if sp <= threshold else "another candidate screened faster"
                )
            else:
                # Fresh pairs only: the candidate was chosen *because* its screen looked good,
                # and reusing that run would bias the verdict upwards.
                conf = confirm(self.broker.pairs(incumbent, settings, stage=stage, knob=knob), self.rule, self.pairs)
                d.verdict, d.reason = conf.verdict, conf.reason
                if conf.interval is not None:
                    iv = conf.interval
                    d.speedup, d.ci, d.n_pairs, d.coverage = iv.speedup, [iv.low, iv.high], iv.n, iv.coverage
                    d.before_samples_per_s = _median([x.samples_per_s for x in conf.incumbent])
                    d.after_samples_per_s = _median([x.samples_per_s for x in conf.candidate])
                    d.before_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in conf.incumbent) or None
                    d.after_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in conf.candidate) or None
                    if knob == "compile":
                        # The compile time charged is the largest seen (normally the screen's,
                        # which ran with a cold compiler cache): the first production run on a
                        # new machine pays the cold cost.
                        compile_s = max(x.compile_s or 0.0 for x in [r, *conf.candidate])
                        step_inc = _median([x.step_time_s for x in conf.incumbent])
                        judge_compile(d, compile_s, step_inc, iv.low, self.run_length_steps)
                if d.verdict == "improved":
                    d.kept = True
                    adopted = settings
            self.decisions.append(d)
        return adopted


def median_rate(results: list[TrialResult]) -> float | None:
    """The median throughput of some trials (None when none measured one)."""
    return _median([r.samples_per_s for r in results])
