"""Everything a search has found so far, as plain data.

The search's parts write into one ``SearchState``; ``document.build_results`` reads only
this, never the search object, so a results document can be made from any state
(partial, resumed, or built by hand in a test).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainopt.contract.protocol import TrialResult
from trainopt.decide import plan
from trainopt.decide.verdict import Decision

__all__ = ["SearchState", "TrialRecord"]


@dataclass(frozen=True)
class TrialRecord:
    """One trial the search used (run now or reused from the store), and why it was asked for."""

    id: int
    key: str
    stage: str
    knob: str
    role: str
    tag: str
    mode: str
    result: TrialResult


@dataclass
class SearchState:
    """The state of one search.

    Attributes:
        name: The spec's name.
        spec_fingerprint: Content hash of the resolved spec.
        measure: The spec's measurement settings (plain data).
        baseline_settings: The spec's baseline settings.
        planned_knobs: The knobs of the spec's search section, as written.
        out_dir: The output folder (trial logs are given relative to it).
        started: When the search started (epoch seconds).
        baseline: The baseline trial, once measured.
        diagnosis: The baseline's bottleneck (``bottleneck.diagnose``: verdict, reason, text,
            loader wait share, breakdown).
        order: The knobs in the order they are tried.
        done_knobs: The knobs decided so far.
        decisions: Every decision, in order.
        trials: Every trial used, in order.
        batch_info: The batch-size stage's probes and figures.
        final: The final check (empty until it ran).
        final_diagnosis: The recommended settings' bottleneck, from their diagnosis trial
            after the final check (same shape as ``diagnosis``); None before it, when the
            baseline's settings are recommended, or when it failed.
        final_diagnosis_error: Why the diagnosis trial failed, or None.
        training_check: The training check (``search.training_check``; empty until it ran).
        run_costs: The spec's ``run_costs`` section (plain data), or None.
        run: The production run (``Spec.run_plan`` as plain data), or None.
        world_size: Processes per trial (a step's samples are ``batch_size x grad_accum x ranks``).
        time_budget_s: The search's wall-time budget in seconds, or None.
        not_tried: Stages the time budget left out: ``{knob, stage, reason, eta_s, left_s}`` each.
        extra_families: Confirmation families beyond one per knob (a possible second batch
            pass), for the error budget.
        ran: Trials run by this process.
        reused: Trials answered from the store.
        guard: The stability guard (its record goes into the results), or None.
        machine: The machine check (``execute.machine_probe.MachineProbe``: other processes'
            load before and during the search), or None.
        warnings: Warnings for the report, in order.
    """

    name: str
    spec_fingerprint: str
    measure: dict[str, Any]
    baseline_settings: dict[str, Any]
    planned_knobs: list[str]
    out_dir: Path
    started: float = field(default_factory=time.time)
    baseline: TrialResult | None = None
    diagnosis: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    done_knobs: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)
    trials: list[TrialRecord] = field(default_factory=list)
    batch_info: dict[str, Any] = field(default_factory=dict)
    final: dict[str, Any] = field(default_factory=dict)
    final_diagnosis: dict[str, Any] | None = None
    final_diagnosis_error: str | None = None
    training_check: dict[str, Any] = field(default_factory=dict)
    run_costs: dict[str, Any] | None = None
    run: dict[str, Any] | None = None
    world_size: int = 1
    time_budget_s: float | None = None
    not_tried: list[dict[str, Any]] = field(default_factory=list)
    extra_families: int = 0
    ran: int = 0
    reused: int = 0
    guard: Any = None
    machine: Any = None
    warnings: list[str] = field(default_factory=list)

    @classmethod
    def for_spec(cls, spec: Any, out_dir: Path) -> "SearchState":
        """An empty state for a spec."""
        return cls(
            name=spec.name,
            spec_fingerprint=spec.fingerprint(),
            measure=spec.measure.model_dump(mode="json"),
            baseline_settings=dict(spec.baseline),
            planned_knobs=list(spec.search),
            out_dir=Path(out_dir),
            run_costs=spec.run_costs.model_dump(mode="json") if spec.run_costs is not None else None,
            run=spec.run_plan.model_dump(mode="json", exclude_none=True) if spec.run_plan is not None else None,
            world_size=spec.world_size,
            time_budget_s=spec.measure.time_budget,
        )

    def dropped_knobs(self) -> list[str]:
        """The knobs the training check left out of the recommendation."""
        return [d["knob"] for d in self.training_check.get("dropped", [])]

    def loader_wait(self, settings: dict[str, Any]) -> float | None:
        """The mean share of a step that the processes of ``settings`` measured so far waited for the DataLoader.

        Every session arm, probe and one-shot trial of exactly these settings counts (for
        the incumbent after a kept change, its confirmation and held-out arms too): one
        process's share scatters (0.8-1.9 % over the demo's arms of one setting), the mean
        over many does much less.
        """
        key = plan.settings_hash(settings)
        waits = [t.result.data_wait_fraction for t in self.trials
                 if t.result.ok and t.result.data_wait_fraction is not None and t.result.settings
                 and plan.settings_hash(t.result.settings) == key]
        return statistics.fmean(waits) if waits else None
