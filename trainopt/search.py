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

from pathlib import Path
from typing import Any, Callable

from trainopt import knobs, plan
from trainopt.batch_stage import run_batch_stage
from trainopt.broker import TrialBroker
from trainopt.confirmation import DecisionRule, IntervalRule, confirm
from trainopt.decision import Decision
from trainopt.progress import NullProgress
from trainopt.runner import Runner
from trainopt.spec import Spec
from trainopt.stages import KnobStage, SearchFailed, median_rate
from trainopt.state import SearchState
from trainopt.store import TrialStore

__all__ = ["Search", "SearchFailed", "Decision"]


class Search:
    """Orchestrates one search over a spec.

    Args:
        spec: The validated spec.
        out_dir: The output folder (trial logs and result files go here).
        runner: Runs one trial (a subprocess in production).
        store: Where finished trials are kept and looked up.
        progress: Receives progress events (stage, knob, trial, ETA).
        on_checkpoint: Called with the partial results after every decision, so that a
            search stopped at any moment leaves readable results behind.
        rule: Decides each confirmation; defaults to the spec's ``IntervalRule``.
    """

    def __init__(
        self,
        spec: Spec,
        out_dir: Path,
        runner: Runner,
        store: TrialStore,
        progress: Any = None,
        on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
        rule: DecisionRule | None = None,
    ):
        self.spec = spec
        self.progress = progress or NullProgress()
        self.on_checkpoint = on_checkpoint
        self.state = SearchState.for_spec(spec, out_dir)
        self.broker = TrialBroker(spec, out_dir, runner, store, self.state, self.progress)
        self.rule = rule or IntervalRule.from_measure(spec.measure)
        self.stage = KnobStage(
            self.broker, self.rule, min_speedup=spec.measure.min_speedup, pairs=spec.measure.pairs,
            run_length_steps=spec.run_length_steps, decisions=self.state.decisions,
        )

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
            stage = knobs.KNOBS[name].stage
            self.progress.stage(stage, name)
            if name == "batch_size":
                incumbent = run_batch_stage(self.spec, self.stage, incumbent, state.baseline.dataset_len, state.batch_info)
            else:
                incumbent = self.stage.run(incumbent, name, stage, self.spec.search[name])
            state.done_knobs.append(name)
            self._update_eta(index + 1)
            self._checkpoint(complete=False)
        self.progress.stage("final", "final check against the baseline")
        state.final = self._final_check(base_settings, incumbent)
        return self._checkpoint(complete=True)

    def _update_eta(self, knobs_done: int) -> None:
        self.progress.set_remaining(
            plan.remaining_trials(
                self.state.order[knobs_done:], self.spec.search, self.spec.measure.pairs, self.spec.batch_search.max_candidates
            )
        )

    def _final_check(self, base: dict[str, Any], incumbent: dict[str, Any]) -> dict[str, Any]:
        """The final settings against the original baseline, with the same rule as every change."""
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
        conf = confirm(self.broker.pairs(base, incumbent, stage="final", knob="final"), self.rule, self.spec.measure.pairs)
        iv = conf.interval
        return {
            "settings": incumbent,
            "verdict": conf.verdict,
            "reason": conf.reason,
            "speedup": iv.speedup if iv else None,
            "ci": [iv.low, iv.high] if iv else None,
            "n_pairs": iv.n if iv else 0,
            "samples_per_s": median_rate(conf.candidate),
            "baseline_samples_per_s": median_rate(conf.incumbent),
        }

    def _checkpoint(self, complete: bool) -> dict[str, Any]:
        from trainopt.results import build_results

        doc = build_results(self.state, complete=complete)
        if self.on_checkpoint:
            self.on_checkpoint(doc)
        return doc
