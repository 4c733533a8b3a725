"""One knob's stage: screen every candidate, confirm the most promising, adopt it if improved.

Used by every knob, the batch size included (``batch_stage`` makes its candidates from
real memory probes first). A ``Screener`` runs the screens (one session of the incumbent
and every candidate, and a second one for the near misses while confirmation has room),
``decide.screen`` selects what to confirm, each confirmation is a series of fresh two-arm
sessions decided by ``sequential.SequentialRule`` through ``confirmation.confirm``, and an
improved change's figure comes from its ``HeldOutSessions``. Sessions come from the
``TrialBroker``.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainopt.contract.protocol import TrialResult
from trainopt.decide import plan
from trainopt.decide.confirmation import Confirmation, confirm
from trainopt.decide.machine import held_back
from trainopt.decide.screen import (
    MAX_CONFIRM,
    SCREEN_GATE,
    cap_selection,
    select_for_confirmation,
)
from trainopt.decide.sequential import SequentialRule, scope_family
from trainopt.decide.verdict import Decision, judge_compile
from trainopt.knobs import catalog as knobs
from trainopt.search.broker import TrialBroker
from trainopt.search.figures import fill_figures, median
from trainopt.search.holdout import HeldOutSessions
from trainopt.search.screening import Screen, Screener

__all__ = ["KnobStage"]


class KnobStage:
    """Decides one knob at a time: screens its candidates, confirms the most promising, adopts the first improved one.

    Args:
        broker: Runs or reuses trials and sessions.
        measure: The spec's measure section (the rule's settings).
        run_length_steps: For the compile judgement.
        decisions: Where decisions are appended (the search state's list).
        rule: A ``DecisionRule`` for every confirmation instead of the spec's sequential rule.
        screener: Runs the screens (default: a ``Screener`` of ``broker``).
        held_out: Measures the held-out sessions of kept changes (default: a
            ``HeldOutSessions`` of ``broker``).
    """

    def __init__(self, broker: TrialBroker, measure: Any, *, run_length_steps: int, decisions: list[Decision], rule: Any = None,
                 screener: Screener | None = None, held_out: HeldOutSessions | None = None):
        self.rule = rule
        self.broker = broker
        self.measure = measure
        self.pairs = measure.pairs
        self.run_length_steps = run_length_steps
        self.decisions = decisions
        self.screener = screener if screener is not None else Screener(broker)
        self.held_out = held_out if held_out is not None else HeldOutSessions(broker, measure)
        # Told how many candidates a screen selected for confirmation (the search's ETA).
        self.on_selected: Any = None
        # Told (index, pairs measured, next look, look sizes) whenever a confirmation's rule
        # goes on past a look (the search's ETA).
        self.on_look: Any = None
        self._confirming = 0
        # Families the search's error budget is split into under ``error_scope: search``.
        self.families = len(broker.spec.search)
        # The one-shot cold-compile trial of each compiled candidate, by settings hash.
        self.cold_compile: dict[str, TrialResult] = {}

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
        if knob == "compile":
            self._compile_cold(runnable, stage)
        return self.screen_and_decide(incumbent, runnable, knob, stage)

    def _compile_cold(self, cands: list[dict[str, Any]], stage: str) -> None:
        """Compile every compiled candidate once in a one-shot trial before the screen.

        The first compile on a machine is the cold one (tens of seconds, filling the
        compiler's on-disk cache), and a process right after a cold compile ran 15-25 %
        slower here than one that compiled from the warm cache. Paying it in a trial of its
        own keeps it out of the screen, whose arms then compile warm like every
        confirmation arm, and its compile time is the cold cost charged to the candidate.
        """
        for settings in cands:
            if settings["compile"] != "off":
                result = self.broker.trial(settings, stage=stage, knob="compile", role="cold-compile", tag="0")
                self.cold_compile[plan.settings_hash(settings)] = result

    def screen_and_decide(self, incumbent: dict[str, Any], cands: list[dict[str, Any]], knob: str, stage: str) -> dict[str, Any]:
        """Screen ``cands`` against ``incumbent``, confirm the most promising, and return the adopted settings."""
        n0 = len(self.broker.unstable)
        ref, screens = self.screener.screen(incumbent, cands, stage, knob)
        # After the screen: its incumbent arm counts towards the measured wait.
        wait = self.broker.state.loader_wait(incumbent)
        bound = plan.loader_gain_bound(knob, incumbent, wait)
        if bound is not None and bound >= 1.0 + self.measure.min_speedup:
            bound = None
        if bound is None:
            screens = self.screener.rescreen(incumbent, screens, stage, knob)
        return self._decide(incumbent, knob, stage, ref, screens, self.broker.unstable[n0:],
                            cap=(bound, wait) if bound is not None else None)

    def _confirm(self, incumbent: dict[str, Any], settings: dict[str, Any], knob: str, stage: str, family: int) -> Confirmation:
        # ``error_scope: search`` splits the error budget over the search's knobs too.
        scope = scope_family(getattr(self.measure, "error_scope", "knob"), self.families)
        rule = self.rule or SequentialRule.from_measure(self.measure, family=family * scope)
        # A rule that cannot say when it next may stop gets its pairs one at a time.
        next_look = getattr(rule, "next_look", lambda n: n + 1)
        looks = [look.n for look in getattr(rule, "looks", ())]
        index = self._confirming

        def planned(n: int) -> int:
            nxt = next_look(n)
            if n > 0 and self.on_look is not None:
                # Asked again only after the rule went on past a look.
                self.on_look(index, n, nxt, looks)
            return nxt

        pairs = self.broker.pair_sessions(incumbent, settings, stage=stage, knob=knob, role="confirm", planned=planned)
        return confirm(pairs, rule, self.pairs)

    def _decide(self, incumbent: dict[str, Any], knob: str, stage: str, ref: TrialResult, screens: list[Screen],
                screen_unstable: list[str] | None = None, cap: tuple[float, float] | None = None) -> dict[str, Any]:
        """Turn screens into decisions, confirm the most promising, adopt the first improved one.

        The screen only chooses what to confirm (the best candidates not clearly slower),
        best screen first, until one is improved: each confirmation runs on fresh pairs
        under the sequential rule, which shares the knob's error budget among the
        candidates selected. An improved change's reported speedup comes from further
        fresh pairs that took no part in the verdict. With ``cap`` (bound, measured wait:
        ``plan.loader_gain_bound`` below the margin) nothing is confirmed: no candidate
        can truly clear the margin, so a confirmation could only find a false win.
        """
        ratios = [s.ratio for s in screens]
        selection = select_for_confirmation(ratios, MAX_CONFIRM, SCREEN_GATE)
        if cap is not None:
            selection = cap_selection(selection, ratios, *cap, self.measure.min_speedup)
        if self.on_selected is not None:
            self.on_selected(len(selection.indices))
        decisions: list[Decision] = []
        for index, (settings, r, sp) in enumerate(screens):
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
            twice = self.screener.both_screens(settings)
            if twice:
                d.extra["screens"] = twice
            if screen_unstable:
                # Marked: the machine shifted during a session this verdict rests on, and
                # measuring again did not find it steady.
                d.extra["unstable"] = "; ".join(screen_unstable)
            self.decisions.append(d)
            decisions.append(d)
            if not r.ok:
                d.verdict, d.reason = r.status, r.error or r.status
            elif index not in selection.indices:
                d.verdict, d.reason = "screened-out", selection.reasons[index]
                if twice:
                    d.reason += f" (the geometric mean of two screen sessions, {twice[0]:.3f}x and {twice[1]:.3f}x)"
        # Confirmed best screen first; once one is improved, the rest are not confirmed: the
        # screen ranked them below a change already shown to be a win, and each
        # confirmation costs a dozen sessions. The error budget stays shared among all the
        # selected ones, so the guarantee holds whichever of them are confirmed.
        winner: Decision | None = None
        for index in selection.indices:
            settings, r, _ = screens[index]
            d = decisions[index]
            if winner is not None:
                d.verdict = "screened-out"
                d.reason = (f"{selection.reasons[index].split(';')[0]}; not confirmed: {knob}={winner.to_value}, "
                            "which screened faster, was confirmed improved")
                continue
            n0 = len(self.broker.unstable)
            self._confirming = selection.indices.index(index)
            if self._confirm_and_estimate(incumbent, settings, knob, stage, r, d, selection.family):
                d.kept, winner, incumbent = True, d, settings
            own = self.broker.unstable[n0:]
            if own:
                d.extra["unstable"] = "; ".join(filter(None, [d.extra.get("unstable"), *own]))
        return incumbent

    def _confirm_and_estimate(self, incumbent: dict[str, Any], settings: dict[str, Any], knob: str, stage: str,
                              r: TrialResult, d: Decision, family: int) -> bool:
        """Confirm one candidate on fresh pairs, then get its held-out speedup (``HeldOutSessions.estimate``).

        Fills in ``d``; returns whether it is an improvement to adopt (improved, and it did
        not fail in its held-out pairs).
        """
        # Fresh pairs only: the candidate was chosen *because* its screen looked good,
        # and reusing that run would bias the verdict upwards.
        conf = self._confirm(incumbent, settings, knob, stage, family)
        d.verdict, d.reason = conf.verdict, conf.reason
        d.extra["confirmed_with"] = family
        logs = [math.log(c.samples_per_s / i.samples_per_s) for c, i in zip(conf.candidate, conf.incumbent)
                if c.ok and i.ok and c.samples_per_s and i.samples_per_s]
        if len(logs) >= 2:
            # The pair noise measured here sizes the final check (``recommendation.final_pairs``).
            d.extra["pair_sd"] = {"sd": statistics.stdev(logs), "n": len(logs)}
        if conf.interval is None:
            # A failure, or a futility stop at a look that may claim nothing: the pairs
            # measured, without an interval (the reason carries the estimate).
            d.n_pairs = sum(1 for c in conf.candidate if c.ok)
            return False
        iv = conf.interval
        d.speedup, d.ci, d.n_pairs, d.coverage = iv.speedup, [iv.low, iv.high], iv.n, iv.coverage
        d.extra["decision_interval"] = {"speedup": iv.speedup, "ci": [iv.low, iv.high], "n_pairs": iv.n}
        fill_figures(d, conf.incumbent, conf.candidate)
        if knob == "compile":
            # The compile time charged is the largest seen (normally the cold-compile
            # trial's): the first production run on a new machine pays the cold cost.
            cold = self.cold_compile.get(plan.settings_hash(settings))
            compile_s = max(x.compile_s or 0.0 for x in [r, *conf.candidate, *([cold] if cold else [])])
            step_inc = median([x.step_time_s for x in conf.incumbent])
            judge_compile(d, compile_s, step_inc, iv.low, self.run_length_steps)
        if d.verdict != "improved":
            return False
        probe = self.broker.machine
        held = held_back(knob, probe is not None and bool((probe.before or {}).get("busy") or probe.busy_now))
        if held:
            d.reason = f"{d.reason}; {held}"
            d.extra["held_back"] = held
            return False
        return self.held_out.estimate(d, incumbent, settings, knob, stage)
