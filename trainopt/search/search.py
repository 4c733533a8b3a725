"""One-knob-at-a-time search: baseline, then per knob screen -> confirm -> adopt, then a final check.

The baseline trial also profiles where a step's time goes; its bottleneck
(``bottleneck.diagnose``) sets which stages are tried first. After the final check, the
recommended settings get one diagnosed trial of their own when they differ from the baseline.

The parts, each in its own module: the ``TrialBroker`` keys, caches and runs trials;
``KnobStage`` decides one knob, with a ``Screener`` for its screens and
``HeldOutSessions`` for the held-out figure of a kept change; ``run_batch_stage`` probes
memory first; ``confirmation.confirm`` is the pair loop behind a swappable
``DecisionRule``; ``final_check`` compares the final settings with the baseline; the
``SearchEta`` counts what is left; a ``TimeBudget`` starts a stage only when it and the
final check fit the time left; after the last knob, ``run_second_batch_pass`` searches the
batch size again when a later kept change made the first pass's out-of-memory size fit;
after the final check, ``TrainingCheck`` trains the recommended settings against a reference
and drops any kept change that makes them train differently.
Everything found goes into a plain ``SearchState``, from which ``document.build_results``
makes the results document. Every trial has a
deterministic key, so an interrupted search resumes by simply running again. Nothing here
imports torch: trials run through a ``Runner`` and come back as ``TrialResult``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from trainopt.contract.run_block import DEFAULT_RUN_STEPS
from trainopt.contract.spec import Spec
from trainopt.decide import batch as batch_mod
from trainopt.decide import bottleneck, plan
from trainopt.decide import training_check as training_rule
from trainopt.decide.run_costs import run_steps, samples_per_step
from trainopt.decide.recommendation import recommend
from trainopt.decide.verdict import Decision
from trainopt.execute.executors import SerialExecutor, SessionExecutor
from trainopt.execute.runner import Runner
from trainopt.execute.session_runners import SequentialSessionRunner
from trainopt.knobs import catalog as knobs
from trainopt.search.batch_stage import run_batch_stage, run_second_batch_pass, second_pass_reason
from trainopt.search.broker import TrialBroker
from trainopt.search.budget import TimeBudget
from trainopt.search.document import build_results
from trainopt.search.errors import SearchFailed
from trainopt.search.eta import SearchEta
from trainopt.search.final_check import final_check, final_warnings
from trainopt.search.holdout import HeldOutSessions
from trainopt.search.knob_stage import KnobStage
from trainopt.search.progress import NullProgress
from trainopt.search.state import SearchState
from trainopt.search.store import TrialStore
from trainopt.search.training_check import TrainingCheck, not_checked

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
        self.held_out = HeldOutSessions(self.broker, spec.measure)
        self.stage = KnobStage(self.broker, spec.measure, run_length_steps=run_steps(self.state.run, None, None, None, DEFAULT_RUN_STEPS),
                               decisions=self.state.decisions, rule=rule, held_out=self.held_out)
        self.eta = SearchEta(spec, self.state, self.broker, self.progress, self.held_out)
        self.stage.on_selected = self.eta.selected
        self.stage.on_look = self.eta.look
        # A second batch pass is one more family of confirmations: counted from the start.
        self.state.extra_families = 1 if batch_mod.second_pass_possible(spec.search) else 0
        self.stage.families = len(spec.search) + self.state.extra_families
        self._batch_done: int | None = None
        self.budget = TimeBudget(self.state.time_budget_s, self.state, self.eta.stage_seconds, self.eta.final_seconds)

    @property
    def ran(self) -> int:
        """Trials run by this search (not reused from the store)."""
        return self.state.ran

    def run(self) -> dict[str, Any]:
        """Run the whole search and return the results document."""
        state = self.state
        base_settings = dict(self.spec.baseline)
        self.progress.stage("baseline", "measuring the baseline")
        state.baseline = self.broker.trial(base_settings, stage="baseline", knob="baseline", role="baseline", tag="0",
                                           diagnose=True)
        if not state.baseline.ok:
            self._checkpoint(complete=False)
            raise SearchFailed(
                f"the baseline trial failed ({state.baseline.status}: {state.baseline.error}); "
                f"fix the spec's baseline or workload and run again (log: {state.baseline.log_path})"
            )
        self.broker.device_type = state.baseline.env.get("device_type", "cpu")
        # The run's length in baseline steps, now that a step's time is known (a run in hours or epochs).
        self.stage.run_length_steps = run_steps(state.run, samples_per_step(base_settings, self.spec.world_size),
                                                state.baseline.samples_per_s, state.baseline.dataset_len, DEFAULT_RUN_STEPS)
        state.diagnosis = bottleneck.diagnose(state.baseline.breakdown, state.baseline.data_wait_fraction)
        state.order = plan.knob_order(self.spec.search, self.spec.search_order, state.diagnosis["bottleneck"])
        incumbent = base_settings
        self.eta.update(0)
        for index, name in enumerate(state.order):
            self.eta.knob_index = index
            stage = knobs.KNOBS[name].stage
            if not self.budget.allows(name, stage):
                self.progress.stage(stage, f"{name}: not tried (time budget)")
            elif name == "batch_size":
                self.progress.stage(stage, name)
                incumbent = run_batch_stage(self.spec, self.stage, incumbent, state.baseline.dataset_len, state.batch_info)
                self._batch_done = len(state.decisions)
            else:
                self.progress.stage(stage, name)
                incumbent = self.stage.run(incumbent, name, stage, self.spec.search[name])
            self.eta.incumbent = incumbent
            state.done_knobs.append(name)
            self.eta.update(index + 1, reusable=len(self.held_out.reusable(base_settings, incumbent)[0]))
            self._checkpoint(complete=False)
        incumbent = self._second_batch_pass(incumbent)
        self.progress.stage("final", "final check against the baseline")
        n0 = len(self.broker.unstable)
        # The first kept change's held-out sessions, when no later kept change measured
        # it: they are the final check's pairs.
        incumbent = self.eta.incumbent = self.held_out.finish(incumbent)
        state.final = final_check(self.broker, self.held_out, base_settings, incumbent)
        if self.broker.unstable[n0:]:
            state.final["unstable"] = "; ".join(filter(None, [state.final.get("unstable"), *self.broker.unstable[n0:]]))
        state.warnings.extend(final_warnings(state, self.stage.screener.first_screen_rate))
        self._check_training()
        self._diagnose_recommended()
        return self._checkpoint(complete=True)

    def _check_training(self) -> None:
        """Whether the recommended settings still train the same (``search.training_check``)."""
        check = self.spec.check
        if not check.training:
            self.state.training_check = not_checked("check.training is false: the training was not checked")
            return
        state = self.state
        rec = recommend(state.baseline.settings, state.baseline.samples_per_s, state.decisions, state.final)
        judged = plan.settings_hash(rec.settings) != plan.settings_hash(training_rule.reference_settings(state.baseline.settings,
                                                                                                          rec.settings))
        self.eta.training_check(rec.settings, 3 if judged else 0,
                                diagnosis=plan.settings_hash(rec.settings) != plan.settings_hash(state.baseline.settings))
        self._checkpoint(complete=False)
        self.progress.stage("training", f"training check, {check.training_steps} steps a run")
        self.state.training_check = TrainingCheck(self.broker, self.held_out, self.state, check.training_steps,
                                                  self.spec.seed).run()
    def _second_batch_pass(self, incumbent: dict[str, Any]) -> dict[str, Any]:
        """The batch stage again from the incumbent, when it stopped at a memory edge and the edge fits after a later kept change."""
        state = self.state
        if self._batch_done is None:
            return incumbent
        later = [{**d.to_dict(), "from": d.from_value, "to": d.to_value} for d in state.decisions[self._batch_done:]]
        if batch_mod.memory_edge(state.batch_info.get("probes") or []) is None or batch_mod.freeing_change(later) is None:
            return incumbent
        if not self.budget.allows("batch_size", "batch (second pass)"):
            return incumbent
        freed = second_pass_reason(self.spec, self.stage, incumbent, state.batch_info, later)
        if freed is None:
            return incumbent
        self.progress.stage("batch", f"batch_size again: batch {freed['edge']} fits after {freed['knob']} {freed['to']}")
        incumbent = run_second_batch_pass(self.spec, self.stage, incumbent, state.baseline.dataset_len, state.batch_info, freed)
        self.eta.incumbent = incumbent
        self._checkpoint(complete=False)
        return incumbent

    def _diagnose_recommended(self) -> None:
        """Where a step of the recommended settings spends its time: one one-shot diagnosed trial.

        Run only when they differ from the baseline's (whose diagnosis the baseline trial
        gave). It decides nothing: a failure leaves ``final_diagnosis`` None with the reason.
        Its key is fixed by the settings, so a resumed search reuses it.
        """
        state = self.state
        base = state.baseline
        rec = recommend(base.settings, base.samples_per_s, state.decisions, state.final, dropped=state.dropped_knobs())
        if plan.settings_hash(rec.settings) == plan.settings_hash(base.settings):
            self.eta.final_diagnosis(None)
            return
        self.eta.final_diagnosis(rec.settings)
        # The final check's results are saved before a trial that decides nothing.
        self._checkpoint(complete=False)
        self.progress.stage("diagnosis", "where a step of the recommended settings spends its time")
        result = self.broker.trial(rec.settings, stage="final", knob="final", role="diagnosis", tag="0", diagnose=True)
        if not result.ok:
            state.final_diagnosis_error = f"the diagnosis trial of the recommended settings failed ({result.status}: {result.error})"
            return
        state.final_diagnosis = bottleneck.diagnose(result.breakdown, result.data_wait_fraction)

    def _checkpoint(self, complete: bool) -> dict[str, Any]:
        doc = build_results(self.state, complete=complete)
        if self.on_checkpoint:
            self.on_checkpoint(doc)
        return doc
