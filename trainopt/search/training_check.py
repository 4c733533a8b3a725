"""The training check: do the recommended settings still train the same?

After the final check, the recommended settings, a reference (the baseline at the
recommended batch size and accumulation) and the reference's twin in another data order
each train ``check.training_steps`` optimizer steps from the same initial weights, in
trial processes of their own (mode ``train``); ``decide.training_check.judge`` gives the
verdict. When it is not ``same``, each suspect knob (``decide.training_check.suspects``)
is trained alone on top of the reference; the ones that fail alone are dropped (all
suspects when none fails alone: the failure then comes from their combination). The
remaining settings get a final check of their own against the baseline (their speed was
never measured as such) and are checked for training again, until a check says ``same``
or nothing is left to drop. Settings whose training check failed are never recommended.

Every run is a keyed trial, so a resumed search reuses what it already trained.
"""

from __future__ import annotations

from typing import Any

from trainopt.decide import plan
from trainopt.decide import training_check as rule
from trainopt.decide.recommendation import recommend
from trainopt.search.broker import TrialBroker
from trainopt.search.final_check import final_check
from trainopt.search.holdout import HeldOutSessions
from trainopt.search.state import SearchState

__all__ = ["TrainingCheck", "not_checked"]


def not_checked(reason: str) -> dict[str, Any]:
    """The ``training_check`` section of a search that did not check the training."""
    return {"verdict": "not_checked", "reason": reason, "rounds": [], "dropped": []}



class TrainingCheck:
    """Runs the training check of a finished search and records it in ``state.training_check``.

    Args:
        broker: Runs (or reuses) the training runs and any new final check.
        held_out: The held-out sessions (a new final check may reuse their pairs).
        state: The search's state: its decisions, final check and baseline.
        steps: Optimizer steps of each run (``check.training_steps``).
        seed: The spec's seed: the reference's data order; its twin's is ``seed + 1``.
    """

    def __init__(self, broker: TrialBroker, held_out: HeldOutSessions, state: SearchState, steps: int, seed: int):
        self.broker = broker
        self.held_out = held_out
        self.state = state
        self.steps = steps
        self.seed = seed

    def _train(self, settings: dict[str, Any], label: str, order_seed: int) -> dict[str, Any]:
        """One run: its losses and fp16 skips, or why it failed (as plain data)."""
        result = self.broker.trial(
            settings, stage="training", knob=label, role="training", tag=f"order{order_seed}/steps{self.steps}", mode="train",
            training={"steps": self.steps, "order_seed": order_seed})
        run = {"settings": settings, "order_seed": order_seed, "status": result.status, "error": result.error,
               "losses": [], "scaler_skipped": None}
        if result.ok and result.training:
            run["losses"] = list(result.training.get("losses") or [])
            run["scaler_skipped"] = result.training.get("scaler_skipped")
        return run

    def _verdict(self, ref: dict[str, Any], twin: dict[str, Any], cand: dict[str, Any]) -> rule.TrainingVerdict:
        for what, run in (("reference", ref), ("reference in another data order", twin)):
            if run["status"] != "ok":
                return rule.TrainingVerdict("inconclusive", f"the {what} run failed ({run['status']}: {run['error']})",
                                            rule.tail_steps(self.steps))
        if cand["status"] == "nonfinite" or (cand["status"] == "ok" and cand["losses"]):
            return rule.judge(ref["losses"], twin["losses"], cand["losses"], self.steps)
        return rule.TrainingVerdict("inconclusive", f"the run of these settings failed ({cand['status']}: {cand['error']})",
                                    rule.tail_steps(self.steps))

    def run(self, settings: dict[str, Any] | None = None) -> dict[str, Any]:
        """Check, drop what trains differently, check again; returns the ``training_check`` section.

        Args:
            settings: Check exactly these settings, once, and drop nothing (``trainopt verify``);
                default: the search's recommended settings, as the module docstring says.
        """
        state = self.state
        base = state.baseline
        dropped: list[dict[str, Any]] = []
        rounds: list[dict[str, Any]] = []
        section: dict[str, Any] = {"steps": self.steps, "tail_steps": rule.tail_steps(self.steps), "rounds": rounds,
                                   "dropped": dropped}
        while True:
            names = [d["knob"] for d in dropped]
            current = settings if settings is not None else recommend(
                base.settings, base.samples_per_s, state.decisions, state.final, dropped=names).settings
            reference = rule.reference_settings(base.settings, current)
            self._batch_note(section, base.settings, current)
            if plan.settings_hash(reference) == plan.settings_hash(current):
                left = ", ".join(f"{d['knob']}={d['value']}" for d in dropped)
                lead = f"with {left} left out, " if dropped else ""
                section.update(verdict="not_needed", reason=lead + self._nothing_to_judge(base.settings, current),
                               settings=current)
                break
            ref = self._train(reference, "reference", self.seed)
            twin = self._train(reference, "twin", self.seed + 1)
            cand = self._train(current, "recommended", self.seed)
            verdict = self._verdict(ref, twin, cand)
            this = {"settings": current, "reference": ref, "twin": twin, "recommended": cand, **verdict.to_dict()}
            rounds.append(this)
            section.update(verdict=verdict.verdict, reason=verdict.reason, settings=current)
            if verdict.verdict in ("same", "inconclusive") or settings is not None:
                break
            culprits = self._culprits(reference, current, ref, twin, this)
            dropped.extend(culprits)
            reduced = rule.without(current, reference, [d["knob"] for d in culprits])
            # Their speed was never measured as such: a final check of their own against the baseline.
            names = [d["knob"] for d in dropped]
            section.setdefault("final_checks", []).append(dict(state.final))
            state.final = final_check(self.broker, self.held_out, base.settings, reduced,
                                      decisions=[d for d in state.decisions if d.knob not in names])
            if state.final.get("verdict") == "unchanged":
                state.final["reason"] = (f"the training check left out every kept change ({', '.join(names)}); "
                                         f"the baseline stays")
        return section

    def _culprits(self, reference: dict[str, Any], recommended: dict[str, Any], ref: dict[str, Any],
                  twin: dict[str, Any], this: dict[str, Any]) -> list[dict[str, Any]]:
        """The suspect knobs that make the run train differently (each trained alone on the reference when
        there are several), with the reason each is dropped."""
        suspects = rule.suspects(reference, recommended)
        alone = this["alone"] = []
        verdict = this["verdict"]

        def drop(k: str, why: str) -> dict[str, Any]:
            return {"knob": k, "value": recommended[k], "reason": f"{k}={recommended[k]} is left out: {why}"}

        if len(suspects) == 1:
            return [drop(suspects[0], f"with it the settings {rule.PHRASES[verdict]} ({this['reason']})")]
        failing = []
        for k in suspects:
            run = self._train(plan.with_knob(reference, k, recommended[k]), f"alone-{k}", self.seed)
            v = self._verdict(ref, twin, run)
            alone.append({"knob": k, "value": recommended[k], "run": run, **v.to_dict()})
            if v.verdict in ("worse", "diverged"):
                failing.append(drop(k, f"with it alone the reference's settings {rule.PHRASES[v.verdict]} ({v.reason})"))
        return failing or [drop(k, f"the recommended settings {rule.PHRASES[verdict]} ({this['reason']}) and no changed "
                                   f"knob does alone, so every one that can change the numbers goes") for k in suspects]

    def _batch_note(self, section: dict[str, Any], baseline: dict[str, Any], recommended: dict[str, Any]) -> None:
        """A batch change is reported, never judged: it changes the optimisation by design."""
        changed = {k: [baseline.get(k), recommended.get(k)] for k in rule.BATCH_KNOBS if baseline.get(k) != recommended.get(k)}
        if changed:
            section["batch_change"] = {"changed": changed, "lr_hint": self.state.batch_info.get("lr_hint")}
        else:
            section.pop("batch_change", None)

    @staticmethod
    def _nothing_to_judge(baseline: dict[str, Any], recommended: dict[str, Any]) -> str:
        if plan.settings_hash(baseline) == plan.settings_hash(recommended):
            return "nothing to check: the baseline's own settings are recommended"
        return ("nothing to check: the recommended settings change only the batch size, which changes the optimisation "
                "by design (see the learning-rate hint), so the training was not compared")
