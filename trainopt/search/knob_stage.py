"""One knob's stage: screen every candidate, confirm the most promising, adopt it if improved.

Used by every knob, the batch size included (``batch_stage`` makes its candidates from
real memory probes first). The screen is one session of the incumbent and every
candidate (with several slots: up to one session per slot, the candidates split between
them), and a second one for the near misses while confirmation has room; each
confirmation is a series of fresh two-arm sessions decided by
``sequential.SequentialRule`` through ``confirmation.confirm``; sessions come from the
``TrialBroker``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from trainopt.contract.protocol import TrialResult
from trainopt.decide import plan
from trainopt.decide.confirmation import Confirmation, Pair, confirm
from trainopt.decide.sequential import (
    Selection,
    SequentialRule,
    holdout_estimate,
    holdout_pairs,
    select_for_confirmation,
)
from trainopt.decide.verdict import Decision, judge_compile
from trainopt.knobs import catalog as knobs
from trainopt.search.broker import SessionAsk, TrialBroker

# At most this many candidates of one knob are confirmed (they share the knob's error budget).
MAX_CONFIRM = 2
# Candidates screening below this ratio are not confirmed: a single screen session is
# noisy, so the gate sits below 1, not above it: at the interleaved noise here (screen
# log-ratio sd ~0.06) a true +10 % change screens below 0.98 about 3 % of the time, while a
# clearly slower candidate costs no confirmation.
SCREEN_GATE = 0.98
# Candidates that screened between this floor and the gate are screened once more in a fresh
# session, while fewer than MAX_CONFIRM candidates cleared the gate, and are judged by the
# geometric mean of their two screens. One screen session carries the per-process offset
# of every arm in it (the demo's incumbent processes scattered over 300-500 samples/s at
# batch 32), and a real 1.1-1.2x batch change screened at 0.92x in one run. A second,
# independent session halves the
# variance of the ratio the gate sees, for the price of one session, and only where the
# first one was ambiguous. The false-win guarantee is unaffected: whatever the screens
# select, each confirmation runs on fresh pairs.
RESCREEN_FLOOR = 0.90

__all__ = ["SearchFailed", "KnobStage", "rescreen_candidates", "MAX_CONFIRM", "SCREEN_GATE", "RESCREEN_FLOOR"]


class SearchFailed(Exception):
    """The search cannot go on (for example, the baseline itself fails)."""


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


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def rescreen_candidates(ratios: list[float | None], gate: float = SCREEN_GATE,
                        floor: float | None = RESCREEN_FLOOR, max_confirm: int = MAX_CONFIRM) -> list[int]:
    """Candidates to screen again: the near misses, while confirmation has room for them.

    Args:
        ratios: Each candidate's screen ratio to the incumbent (None: it failed).
        gate: The screen gate of ``select_for_confirmation``.
        floor: The lowest ratio screened again; None screens nothing again.
        max_confirm: Once this many candidates cleared the gate, a near miss could not be
            confirmed anyway.
    """
    if floor is None or sum(1 for r in ratios if r is not None and r >= gate) >= max_confirm:
        return []
    return [i for i, r in enumerate(ratios) if r is not None and floor <= r < gate]


class KnobStage:
    """Screens, confirms and adopts candidates for one knob at a time.

    Args:
        broker: Runs or reuses trials and sessions.
        measure: The spec's measure section (the rule's settings).
        run_length_steps: For the compile judgement.
        decisions: Where decisions are appended (the search state's list).
        rule: A ``DecisionRule`` for every confirmation instead of the spec's sequential rule.
    """

    def __init__(self, broker: TrialBroker, measure: Any, *, run_length_steps: int, decisions: list[Decision], rule: Any = None):
        self.rule = rule
        self.broker = broker
        self.measure = measure
        self.pairs = measure.pairs
        self.run_length_steps = run_length_steps
        self.decisions = decisions
        # Told how many candidates a screen selected for confirmation (the search's ETA).
        self.on_selected: Any = None
        # Told (index, pairs measured, next look, look sizes) whenever a confirmation's rule
        # goes on past a look (the search's ETA).
        self.on_look: Any = None
        self._confirming = 0
        # The one-shot cold-compile trial of each compiled candidate, by settings hash.
        self.cold_compile: dict[str, TrialResult] = {}
        # Both screen ratios of each candidate screened twice, by settings hash.
        self._screened_twice: dict[str, list[float | None]] = {}
        self.rescreen_floor: float | None = RESCREEN_FLOOR
        # The incumbent arm's throughput in the search's first screen session: the baseline
        # settings (nothing is adopted before a screen), measured the way session arms are.
        self.first_screen_rate: float | None = None
        # Fresh pairs of the baseline against each kept change's settings, measured by its
        # held-out sessions, by (baseline hash, candidate hash), with the stability guard's
        # flags raised while they ran and what they were: a final check of exactly that
        # comparison reuses them (``Search._final_check``).
        self.held_out: dict[tuple[str, str], tuple[list[Pair], list[str], str]] = {}
        # The first kept change, while its held-out figure waits for the held-out sessions
        # of a later kept change or for the end of the search (``finish``).
        self.deferred: DeferredHoldout | None = None

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
        ref, screens = self._screen(incumbent, cands, stage, knob)
        wait = self.loader_wait(incumbent)
        bound = plan.loader_gain_bound(knob, incumbent, wait)
        if bound is not None and bound >= 1.0 + self.measure.min_speedup:
            bound = None
        again = [] if bound is not None else rescreen_candidates([sp for _, _, sp in screens], SCREEN_GATE,
                                                                   self.rescreen_floor, MAX_CONFIRM)
        if again:
            _, second = self._screen(incumbent, [screens[i][0] for i in again], stage, knob, tag="rescreen")
            for i, (_, r2, sp2) in zip(again, second):
                settings, r, sp = screens[i]
                both = [sp, sp2]
                if not r2.ok or sp2 is None:
                    # Failing when run again is a failure, however it screened the first time.
                    screens[i] = (settings, r2, None)
                else:
                    screens[i] = (settings, r, math.sqrt(sp * sp2))
                self._screened_twice[plan.settings_hash(settings)] = both
        return self._decide(incumbent, knob, stage, ref, screens, self.broker.unstable[n0:],
                            cap=(bound, wait) if bound is not None else None)

    def loader_wait(self, settings: dict[str, Any]) -> float | None:
        """The mean share of a step that the processes of ``settings`` measured so far waited for the DataLoader.

        Every session arm, probe and one-shot trial of exactly these settings counts (for
        the incumbent after a kept change, its confirmation and held-out arms too): one
        process's share scatters (0.8-1.9 % over the demo's arms of one setting), the mean
        over many does much less.
        """
        key = plan.settings_hash(settings)
        waits = [t.result.data_wait_fraction for t in self.broker.state.trials
                 if t.result.ok and t.result.data_wait_fraction is not None and t.result.settings
                 and plan.settings_hash(t.result.settings) == key]
        return statistics.fmean(waits) if waits else None

    def _screen(self, incumbent: dict[str, Any], cands: list[dict[str, Any]], stage: str, knob: str,
                tag: str = "screen"):
        """Point speedups of every candidate from sessions with the incumbent.

        One session of the incumbent and every candidate; with several slots, the
        candidates are split over up to one session per slot, each with its own copy of the
        incumbent (a candidate's ratio is always to the incumbent of its own session), and
        the sessions run side by side. Returns the first session's incumbent arm and, per
        candidate, (settings, arm, ratio).
        """
        n = max(1, min(int(getattr(self.broker.executor, "slots", 1) or 1), len(cands)))
        groups = [cands[g * len(cands) // n:(g + 1) * len(cands) // n] for g in range(n)]
        # One session keeps the plain tag, so a one-slot search stores what it always did.
        asks = [SessionAsk([incumbent, *group], stage, knob, "screen", tag if n == 1 else f"{tag}{g}")
                for g, group in enumerate(groups)]
        sessions = self.broker.sessions(asks)
        screens = []
        for group, session in zip(groups, sessions):
            ref = session.arms[0]
            if not ref.ok:
                raise SearchFailed(f"the incumbent failed while screening {knob} ({ref.status}: {ref.error}); "
                                   f"log: {ref.log_path}")
            if self.first_screen_rate is None:
                self.first_screen_rate = ref.samples_per_s
            screens += [(settings, session.arms[i + 1], session.ratio(i + 1, 0)) for i, settings in enumerate(group)]
        return sessions[0].arms[0], screens

    def _confirm(self, incumbent: dict[str, Any], settings: dict[str, Any], knob: str, stage: str, family: int) -> Confirmation:
        rule = self.rule or SequentialRule.from_measure(self.measure, family=family)
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

    def _holdout(self, incumbent: dict[str, Any], settings: dict[str, Any], knob: str, stage: str):
        """Fresh pairs measured after an ``improved`` verdict, for an unbiased speedup (None if one failed).

        Every held-out session also serves the final check, so each runs with no other
        session beside it, as the final check's do. Against the baseline itself (the first
        kept change, measured at the end of the search unless a later change is kept: see
        ``DeferredHoldout``) its pairs are the final check's. After an earlier kept change,
        each session has the baseline as a third arm: the candidate against the incumbent
        gives the held-out speedup, the incumbent against the baseline the first kept
        change's (when the incumbent is exactly that change), and the candidate against the
        baseline, in the same fresh sessions, is the final check if no later change is
        kept (six three-arm sessions instead of six more two-arm ones; when a later change
        is kept, the third arms served only the first change's figure).
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
                self._held_out_figure(first, [Pair(candidate=s.arms[0], incumbent=s.arms[2]) for s in sessions], unstable,
                                      f"the incumbent and baseline arms of the held-out sessions of {knob}={settings[knob]}")
        if not all(p.candidate.ok and p.incumbent.ok for p in pairs):
            return None, pairs
        if against_baseline:
            self.held_out[(plan.settings_hash(incumbent), plan.settings_hash(settings))] = (
                pairs, unstable, f"the held-out pairs of {knob}={settings[knob]}, the only kept change, so they compared "
                                 "exactly these settings with the baseline")
        elif all(s.arms[2].ok for s in sessions):
            self.held_out[(plan.settings_hash(baseline), plan.settings_hash(settings))] = (
                [Pair(candidate=s.arms[1], incumbent=s.arms[2]) for s in sessions], unstable,
                f"the baseline arms of the held-out sessions of {knob}={settings[knob]}, the last kept change: "
                "the same fresh sessions compared these settings with the baseline")
        logs = [math.log(p.candidate.samples_per_s / p.incumbent.samples_per_s) for p in pairs]
        return holdout_estimate(logs, self.measure.confidence, self.measure.interval), pairs

    def _held_out_figure(self, first: DeferredHoldout, pairs: list[Pair], unstable: list[str], label: str) -> None:
        """The first kept change's held-out figure from a later kept change's sessions."""
        d = first.decision
        logs = [math.log(p.candidate.samples_per_s / p.incumbent.samples_per_s) for p in pairs]
        d.extra.pop("holdout_pending", None)
        d.reason = first.reason
        self._after_holdout(d, holdout_estimate(logs, self.measure.confidence, self.measure.interval), pairs, label)
        if unstable:
            d.extra["unstable"] = "; ".join(filter(None, [d.extra.get("unstable"), *unstable]))

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
        keep = self._after_holdout(d, *self._holdout(first.baseline, first.settings, first.knob, first.stage))
        own = self.broker.unstable[n0:]
        if own:
            d.extra["unstable"] = "; ".join(filter(None, [d.extra.get("unstable"), *own]))
        if keep:
            return incumbent
        d.kept = False
        return dict(first.baseline)

    def _decide(self, incumbent: dict[str, Any], knob: str, stage: str, ref: TrialResult, screens,
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
        selection = select_for_confirmation([sp for _, _, sp in screens], MAX_CONFIRM, SCREEN_GATE)
        if cap is not None and selection.indices:
            bound, wait = cap
            reasons = dict(selection.reasons)
            for i in selection.indices:
                reasons[i] = (f"screened at {screens[i][2]:.3f}x; not confirmed: the incumbent waited for the DataLoader "
                              f"in {wait:.1%} of each step, so loader workers can make it at most {bound:.3f}x faster "
                              f"(even at {plan.LOADER_WAIT_SAFETY:g} times that wait), below the "
                              f"{1 + self.measure.min_speedup:.2f}x margin")
            selection = Selection([], 1, reasons)
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
            twice = self._screened_twice.get(plan.settings_hash(settings))
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
        """Confirm one candidate on fresh pairs, then measure its held-out speedup.

        Fills in ``d``; returns whether it is an improvement to adopt (improved, and it did
        not fail in its held-out pairs).
        """
        # Fresh pairs only: the candidate was chosen *because* its screen looked good,
        # and reusing that run would bias the verdict upwards.
        conf = self._confirm(incumbent, settings, knob, stage, family)
        d.verdict, d.reason = conf.verdict, conf.reason
        d.extra["confirmed_with"] = family
        if conf.interval is None:
            # A failure, or a futility stop at a look that may claim nothing: the pairs
            # measured, without an interval (the reason carries the estimate).
            d.n_pairs = sum(1 for c in conf.candidate if c.ok)
            return False
        iv = conf.interval
        d.speedup, d.ci, d.n_pairs, d.coverage = iv.speedup, [iv.low, iv.high], iv.n, iv.coverage
        d.extra["decision_interval"] = {"speedup": iv.speedup, "ci": [iv.low, iv.high], "n_pairs": iv.n}
        self._figures(d, conf.incumbent, conf.candidate)
        if knob == "compile":
            # The compile time charged is the largest seen (normally the cold-compile
            # trial's): the first production run on a new machine pays the cold cost.
            cold = self.cold_compile.get(plan.settings_hash(settings))
            compile_s = max(x.compile_s or 0.0 for x in [r, *conf.candidate, *([cold] if cold else [])])
            step_inc = _median([x.step_time_s for x in conf.incumbent])
            judge_compile(d, compile_s, step_inc, iv.low, self.run_length_steps)
        if d.verdict != "improved":
            return False
        if plan.settings_hash(incumbent) == plan.settings_hash(self.broker.spec.baseline) and self.deferred is None:
            # The first kept change: its held-out pairs are the final check's if no later
            # change is kept, and a later kept change's held-out sessions measure it against
            # the baseline anyway (their third arm), so measuring them now would be
            # measuring them twice whenever a later change is kept.
            self.deferred = DeferredHoldout(d, dict(incumbent), dict(settings), knob, stage, d.reason)
            d.extra["holdout_pending"] = True
            d.reason += "; held-out estimate to come (from a later kept change's held-out sessions, or at the end)"
            return True
        return self._after_holdout(d, *self._holdout(incumbent, settings, knob, stage))

    def _after_holdout(self, d: Decision, est, held: list[Pair], label: str = "") -> bool:
        """Fill in the held-out figure (``label``: where its pairs come from); returns whether the change may still be kept."""
        failed = next((p.candidate for p in held if not p.candidate.ok), None)
        if failed is not None:
            # A candidate that fails when measured again is not shipped, however fast it was.
            d.verdict, d.reason = failed.status, f"{d.reason}; then failed in a held-out pair: {failed.error}"
            return False
        if est is None:
            d.reason += "; an incumbent arm failed in the held-out pairs, so the figure is the deciding interval's (may run high)"
            return True
        d.speedup, d.ci, d.coverage = est.speedup, [est.low, est.high], est.coverage
        d.extra["holdout"] = {"speedup": est.speedup, "ci": [est.low, est.high], "n_pairs": est.n}
        self._figures(d, [p.incumbent for p in held], [p.candidate for p in held])
        d.reason += f"; held-out estimate {est.speedup:.3f}x [{est.low:.3f}, {est.high:.3f}] over {est.n} fresh pairs"
        if label:
            d.reason += f" ({label})"
        return True

    @staticmethod
    def _figures(d: Decision, inc: list[TrialResult], cand: list[TrialResult]) -> None:
        d.before_samples_per_s = _median([x.samples_per_s for x in inc])
        d.after_samples_per_s = _median([x.samples_per_s for x in cand])
        d.before_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in inc) or None
        d.after_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in cand) or None


def median_rate(results: list[TrialResult]) -> float | None:
    """The median throughput of some trials (None when none measured one)."""
    return _median([r.samples_per_s for r in results])
