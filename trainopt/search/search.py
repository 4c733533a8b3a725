"""One-knob-at-a-time search: baseline, then per knob screen -> confirm -> adopt, then a final check.

The parts, each in its own module: the ``TrialBroker`` keys, caches and runs trials;
``KnobStage`` screens, confirms and adopts one knob; ``run_batch_stage`` probes memory
first; ``confirmation.confirm`` is the pair loop behind a swappable ``DecisionRule``;
everything found goes into a plain ``SearchState``, from which ``results.build_results``
makes the results document. Every trial has a deterministic key, so an interrupted
search resumes by simply running again. Nothing here imports torch: trials run through
a ``Runner`` and come back as ``TrialResult``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from trainopt.contract.spec import Spec
from trainopt.decide import plan
from trainopt.decide.sequential import holdout_estimate, holdout_pairs
from trainopt.decide.verdict import Decision
from trainopt.execute.executors import SerialExecutor, SessionExecutor
from trainopt.execute.runner import Runner
from trainopt.execute.session import SequentialSessionRunner
from trainopt.knobs import catalog as knobs
from trainopt.search.batch_stage import run_batch_stage
from trainopt.search.broker import TrialBroker
from trainopt.search.knob_stage import KnobStage, SearchFailed, median_rate
from trainopt.search.progress import NullProgress
from trainopt.search.state import SearchState
from trainopt.search.store import TrialStore
from trainopt.stats import intervals as stats

__all__ = ["Search", "SearchFailed", "Decision"]


class Search:
    """Orchestrates one search over a spec.

    Args:
        spec: The validated spec.
        out_dir: The output folder (trial logs and result files go here).
        runner: Runs one trial (a subprocess in production): the baseline and the memory probes.
        store: Where finished trials are kept and looked up.
        progress: Receives progress events (stage, knob, trial, ETA).
        on_checkpoint: Called with the partial results after every decision, so that a
            search stopped at any moment leaves readable results behind.
        executor: Runs the measurement sessions (screens, confirmation pairs, the final
            check). Default: one at a time, through ``runner.run_session`` when the runner
            has one, else one fresh ``runner.run`` process per arm.
        guard: A ``stability.StabilityGuard``; None measures every session once.
        rule: A ``confirmation.DecisionRule`` for every confirmation instead of the
            spec's ``sequential.SequentialRule`` (which shares each knob's error budget
            among the candidates it confirms).
    """

    def __init__(
        self,
        spec: Spec,
        out_dir: Path,
        runner: Runner,
        store: TrialStore,
        progress: Any = None,
        on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
        executor: SessionExecutor | None = None,
        guard: Any = None,
        rule: Any = None,
    ):
        self.spec = spec
        self.progress = progress or NullProgress()
        self.on_checkpoint = on_checkpoint
        self.state = SearchState.for_spec(spec, out_dir)
        if executor is None:
            executor = SerialExecutor(runner if hasattr(runner, "run_session") else SequentialSessionRunner(runner))
        self.broker = TrialBroker(spec, out_dir, runner, store, self.state, self.progress, executor=executor, guard=guard)
        self.state.guard = guard
        self.stage = KnobStage(self.broker, spec.measure, run_length_steps=spec.run_length_steps, decisions=self.state.decisions,
                               rule=rule)
        self.stage.on_selected = self._selected
        self.stage.on_look = self._look
        self._selected_now = 0
        self._knob_index = 0
        # The settings adopted so far (what every later arm holds, for the ETA's prices).
        self._incumbent: dict[str, Any] = dict(spec.baseline)

    @property
    def ran(self) -> int:
        """Trials run by this search (not reused from the store)."""
        return self.state.ran

    def run(self) -> dict[str, Any]:
        """Run the whole search and return the results document."""
        state = self.state
        base_settings = dict(self.spec.baseline)
        self.progress.stage("baseline", "measuring the baseline")
        state.baseline = self.broker.trial(base_settings, stage="baseline", knob="baseline", role="baseline", tag="0")
        if not state.baseline.ok:
            self._checkpoint(complete=False)
            raise SearchFailed(
                f"the baseline trial failed ({state.baseline.status}: {state.baseline.error}); "
                f"fix the spec's baseline or workload and run again (log: {state.baseline.log_path})"
            )
        self.broker.device_type = state.baseline.env.get("device_type", "cpu")
        state.diagnosis = plan.diagnose(state.baseline.data_wait_fraction)
        state.order = plan.knob_order(self.spec.search, self.spec.search_order, state.diagnosis["bottleneck"])
        incumbent = base_settings
        self._update_eta(0)
        for index, name in enumerate(state.order):
            self._knob_index = index
            stage = knobs.KNOBS[name].stage
            self.progress.stage(stage, name)
            if name == "batch_size":
                incumbent = run_batch_stage(self.spec, self.stage, incumbent, state.baseline.dataset_len, state.batch_info)
            else:
                incumbent = self.stage.run(incumbent, name, stage, self.spec.search[name])
            self._incumbent = incumbent
            state.done_knobs.append(name)
            self._update_eta(index + 1, reusable=len(self._held_out_of_the_same_comparison(base_settings, incumbent)[0]))
            self._checkpoint(complete=False)
        self.progress.stage("final", "final check against the baseline")
        n0 = len(self.broker.unstable)
        # The first kept change's held-out sessions, when no later kept change measured
        # it: they are the final check's pairs.
        incumbent = self._incumbent = self.stage.finish(incumbent)
        state.final = self._final_check(base_settings, incumbent)
        if self.broker.unstable[n0:]:
            state.final["unstable"] = "; ".join(filter(None, [state.final.get("unstable"), *self.broker.unstable[n0:]]))
        self._warn()
        return self._checkpoint(complete=True)

    def _warn(self) -> None:
        """Warnings for the report: the final check against earlier measurements, unstable verdicts."""
        from trainopt.decide.stability import final_disagreement

        state = self.state
        kept = [d.to_dict() for d in state.decisions if d.kept]
        # Like with like: the baseline trial is a one-shot fresh process, the final check's
        # arms are forked from the launcher, and the two differed by 1.2-1.5x in four quiet
        # demo runs of five, on two machine types. The first screen
        # session's incumbent arm holds the baseline settings (nothing is adopted before a
        # screen) and is measured the way the final check's arms are.
        early = self.stage.first_screen_rate
        if early:
            text = final_disagreement(state.final, kept, early, baseline_label="the first screen session")
        else:
            text = final_disagreement(state.final, kept, state.baseline.samples_per_s if state.baseline else None)
        if text:
            state.warnings.append(text)
        marked = [d for d in state.decisions if d.extra.get("unstable")]
        if marked or state.final.get("unstable"):
            what = ", ".join(f"{d.knob}={d.to_value}" for d in marked) + (" the final check" if state.final.get("unstable") else "")
            state.warnings.append(
                f"the machine was unstable while measuring {what.strip(', ')} and stayed so after re-measuring; "
                "those verdicts are marked and may be wrong - run the search again on a quieter machine"
            )

    def _update_eta(self, knobs_done: int, selected: int | None = None, reusable: int = 0,
                    confirming: tuple[int, int, int, Any] | None = None) -> None:
        """Tell the progress how many trial processes are left.

        Args:
            knobs_done: Knobs decided so far.
            selected: After the current knob's screen: how many of its candidates it
                selected for confirmation (the rest of that knob is then counted from it).
            reusable: Held-out pairs the final check would reuse if no later knob kept a
                change (counted only once no knob is left that could keep one).
            confirming: While a confirmation runs, where it stands (``plan.remaining_in_knob``).
        """
        from trainopt.decide.sequential import SequentialRule, typical_pairs

        m = self.spec.measure
        holdout = holdout_pairs(m.confidence, m.interval)
        confirm = typical_pairs(SequentialRule.from_measure(m, family=2), m.max_pairs)
        order = self.state.order
        later = order[knobs_done + (1 if selected is not None else 0):]
        remaining = plan.search_remaining(
            order, knobs_done, self.spec.search, confirm_pairs=confirm, holdout_pairs=holdout,
            final_pairs=max(m.pairs, holdout), batch_candidates=self.spec.batch_search.max_candidates,
            skip=self._runs_nothing(later), incumbent=self._incumbent, baseline=self.spec.baseline,
            selected=selected, reusable=reusable, batch_probes=self._batch_probes(),
            pending=self.stage.deferred is not None, screen_only=self._screen_only(later), confirming=confirming,
        )
        self.progress.set_remaining(remaining)

    def _screen_only(self, names: list[str]) -> list[str]:
        """Knobs expected to confirm nothing (for the ETA): loader workers whose gain the incumbent's
        loader wait bounds below the margin, reduced precision on a CPU without bf16 instructions."""
        wait = self.stage.loader_wait(self._incumbent)
        floor = 1.0 + self.spec.measure.min_speedup
        env = self.state.baseline.env if self.state.baseline is not None else {}
        return [n for n in names
                if ((b := plan.loader_gain_bound(n, self._incumbent, wait)) is not None and b < floor)
                or plan.expected_to_confirm_nothing(n, self.broker.device_type, env.get("cpu_flags"), self.spec.search[n])]

    def _batch_probes(self) -> int:
        """Probes the batch-size stage will likely run (more where memory can run out)."""
        capped = plan.memory_bound(self.broker.device_type, self.spec.limits.memory_gb)
        return plan.typical_batch_probes(int(self.spec.baseline.get("batch_size") or 1), self.spec.batch_search.max, capped)

    def _selected(self, count: int) -> None:
        self._selected_now = count
        self._update_eta(self._knob_index, selected=count)

    def _look(self, index: int, measured: int, next_look: int, looks: list[int]) -> None:
        # The rule went on past a look: count this confirmation from where it stands.
        self._update_eta(self._knob_index, selected=self._selected_now, confirming=(index, measured, next_look, tuple(looks)))

    def _runs_nothing(self, names: list[str]) -> list[str]:
        """Knobs none of whose candidates apply on this device (recorded, never run)."""
        if self.broker.device_type is None:
            return []
        base = dict(self.spec.baseline)
        return [
            n for n in names if n != "batch_size" and all(
                knobs.not_applicable_reason(s, self.broker.device_type, self.broker.world_size)
                for s in plan.candidates(base, n, self.spec.search[n]))
        ]

    def _final_check(self, base: dict[str, Any], incumbent: dict[str, Any]) -> dict[str, Any]:
        """The final settings against the original baseline: a fixed number of fresh pair sessions.

        No early stop and no selection act on these pairs, so the plain interval over them
        has its nominal coverage and the speedup is unbiased; the verdict applies the same
        boundaries as every change (``stats.verdict``). Each pair runs with no other
        session beside it. When one change was kept, its held-out pairs are such pairs
        already and are used instead of measuring the same comparison again.
        """
        baseline_rate = self.state.baseline.samples_per_s
        if plan.settings_hash(base) == plan.settings_hash(incumbent):
            return {
                "settings": incumbent,
                "verdict": "unchanged",
                "reason": "no change was confirmed as an improvement; the baseline stays",
                "speedup": 1.0,
                "ci": None,
                "n_pairs": 0,
                "samples_per_s": baseline_rate,
                "baseline_samples_per_s": baseline_rate,
            }
        m = self.spec.measure
        n = max(m.pairs, holdout_pairs(m.confidence, m.interval))
        reused, unstable, label = self._held_out_of_the_same_comparison(base, incumbent)
        pairs = reused[:n]
        more = n - len(pairs)
        if more:
            nxt = self.broker.pair_sessions(base, incumbent, stage="final", knob="final", role="final",
                                            planned=lambda i: more, exclusive=True)
            pairs += [nxt(i) for i in range(more)]
        cand = [p.candidate for p in pairs]
        inc = [p.incumbent for p in pairs]
        out = {"settings": incumbent, "ci": None, "speedup": None, "n_pairs": 0,
               "samples_per_s": median_rate(cand), "baseline_samples_per_s": median_rate(inc),
               "baseline_arms_samples_per_s": [r.samples_per_s for r in inc if r.ok and r.samples_per_s]}
        failed_cand = next((r for r in cand if not r.ok), None)
        failed_inc = next((r for r in inc if not r.ok), None)
        if failed_cand is not None:
            return {**out, "verdict": failed_cand.status, "reason": f"candidate trial {failed_cand.status}: {failed_cand.error}"}
        if failed_inc is not None:
            return {**out, "verdict": "inconclusive",
                    "reason": f"incumbent trial {failed_inc.status} during the final check: {failed_inc.error}"}
        iv = holdout_estimate([math.log(c.samples_per_s / i.samples_per_s) for c, i in zip(cand, inc)], m.confidence, m.interval)
        reason = f"{iv.speedup:.3f}x [{iv.low:.3f}, {iv.high:.3f}] over {iv.n} fresh pairs"
        if reused:
            reason += f" ({label}{f'; and {more} more' if more else ''})"
            out["reused_pairs"] = n - more
        if unstable:
            out["unstable"] = "; ".join(unstable)
        return {**out, "verdict": stats.verdict(iv, m.min_speedup), "reason": reason,
                "speedup": iv.speedup, "ci": [iv.low, iv.high], "n_pairs": iv.n}

    def _held_out_of_the_same_comparison(self, base: dict[str, Any], incumbent: dict[str, Any]) -> tuple[list[Any], list[str], str]:
        """Fresh pairs of the baseline against the final settings that the last kept change's held-out sessions measured.

        With a single kept change its held-out pairs are fresh pairs of exactly the final
        check's two settings; after an earlier kept change, the held-out sessions also ran
        the baseline (``KnobStage._holdout``). Either way they were measured after the last
        kept change's verdict, with no other session beside them, and no decision used them
        (a later knob that kept nothing decided on pairs of its own), so they serve as the
        final check's pairs (they cost 6 sessions otherwise).

        Returns:
            The reusable pairs (none when they do not apply), the stability guard's flags
            raised while they ran, and what they were.
        """
        return self.stage.held_out.get((plan.settings_hash(base), plan.settings_hash(incumbent)), ([], [], ""))

    def _checkpoint(self, complete: bool) -> dict[str, Any]:
        from trainopt.outputs.results import build_results

        doc = build_results(self.state, complete=complete)
        if self.on_checkpoint:
            self.on_checkpoint(doc)
        return doc
