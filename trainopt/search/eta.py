"""The search's ETA: how many trial processes are left, told to the progress as the search goes on."""

from __future__ import annotations

from typing import Any

from trainopt.decide import plan
from trainopt.decide.sequential import SequentialRule, holdout_pairs, typical_pairs
from trainopt.knobs import catalog as knobs
from trainopt.search.broker import TrialBroker
from trainopt.search.final_check import planned_pairs
from trainopt.search.holdout import HeldOutSessions
from trainopt.search.state import SearchState

__all__ = ["SearchEta"]


class SearchEta:
    """Counts the trial processes a search has left (``plan.search_remaining``) and tells the progress.

    Args:
        spec: The validated spec.
        state: The search's state (the knob order, the baseline's environment, the
            trials measured so far).
        broker: The search's broker (the device type and world size, once known).
        progress: Receives ``set_remaining`` (the work left, in plain arms) and, where it
            has them, ``set_expected`` (the trial processes left); its ``costs()`` (the
            prices learned from this search's trials, ``plan.ArmCosts``) price the work.
        held_out: The held-out sessions (whether the first kept change's are still owed).

    Attributes:
        knob_index: Index of the knob being decided.
        incumbent: The settings adopted so far (what every later arm holds, for the
            prices of the processes left).
    """

    def __init__(self, spec: Any, state: SearchState, broker: TrialBroker, progress: Any, held_out: HeldOutSessions):
        self.spec = spec
        self.state = state
        self.broker = broker
        self.progress = progress
        self.held_out = held_out
        self.knob_index = 0
        self.incumbent: dict[str, Any] = dict(spec.baseline)
        self._selected_now = 0

    def update(self, knobs_done: int, selected: int | None = None, reusable: int = 0,
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
        m = self.spec.measure
        holdout = holdout_pairs(m.confidence, m.interval)
        confirm = typical_pairs(SequentialRule.from_measure(m, family=2), m.max_pairs)
        order = self.state.order
        later = order[knobs_done + (1 if selected is not None else 0):]
        args = dict(
            confirm_pairs=confirm, holdout_pairs=holdout,
            final_pairs=planned_pairs(m, self.state.decisions), batch_candidates=self.spec.batch_search.max_candidates,
            skip=self._runs_nothing(later), incumbent=self.incumbent, baseline=self.spec.baseline,
            selected=selected, reusable=reusable, batch_probes=self._batch_probes(),
            pending=self.held_out.pending, screen_only=self._screen_only(later), confirming=confirming,
        )
        # Priced in plain arms at what this search's trials cost so far (the priors until measured).
        remaining = plan.search_remaining(order, knobs_done, self.spec.search, costs=self._costs(), **args)
        self.progress.set_remaining(remaining)
        # The same count with every process at one: how many trial processes are left.
        set_expected = getattr(self.progress, "set_expected", None)
        if set_expected is not None:
            set_expected(plan.search_remaining(order, knobs_done, self.spec.search, costs=plan.PROCESS_COUNT, **args))

    def _costs(self) -> dict[str, float] | None:
        """The prices the progress learned from this search's trials (None: the priors)."""
        costs = getattr(self.progress, "costs", None)
        return costs() if costs is not None else None

    def final_diagnosis(self, settings: dict[str, Any] | None) -> None:
        """After the final check: all that is left is the recommended settings' diagnosis trial, or nothing.

        Args:
            settings: The settings the diagnosis trial measures, or None when none runs.
        """
        self.progress.set_remaining(plan.arm_cost(settings, "diagnosis", self._costs()) if settings is not None else 0.0)
        set_expected = getattr(self.progress, "set_expected", None)
        if set_expected is not None:
            set_expected(1.0 if settings is not None else 0.0)

    def training_check(self, settings: dict[str, Any], runs: int, diagnosis: bool) -> None:
        """After the final check: the training check's runs are left (three, or none), then the diagnosis trial.

        A check that finds a change to drop runs more (each suspect alone, a final check of the
        rest and a second check); they are counted as they start, not guessed in advance.
        """
        costs = self._costs()
        left = runs * plan.arm_cost(settings, "training", costs)
        if diagnosis:
            left += plan.arm_cost(settings, "diagnosis", costs)
        self.progress.set_remaining(left)
        set_expected = getattr(self.progress, "set_expected", None)
        if set_expected is not None:
            set_expected(float(runs + (1 if diagnosis else 0)))

    def selected(self, count: int) -> None:
        """A knob's screen selected ``count`` candidates for confirmation."""
        self._selected_now = count
        self.update(self.knob_index, selected=count)

    def look(self, index: int, measured: int, next_look: int, looks: list[int]) -> None:
        """A confirmation's rule went on past a look: count this confirmation from where it stands."""
        self.update(self.knob_index, selected=self._selected_now, confirming=(index, measured, next_look, tuple(looks)))

    def _screen_only(self, names: list[str]) -> list[str]:
        """Knobs expected to confirm nothing (for the ETA): loader workers whose gain the incumbent's
        loader wait bounds below the margin, reduced precision on a CPU without bf16 instructions."""
        wait = self.state.loader_wait(self.incumbent)
        floor = 1.0 + self.spec.measure.min_speedup
        env = self.state.baseline.env if self.state.baseline is not None else {}
        return [n for n in names
                if ((b := plan.loader_gain_bound(n, self.incumbent, wait)) is not None and b < floor)
                or plan.expected_to_confirm_nothing(n, self.broker.device_type, env.get("cpu_flags"), self.spec.search[n])]

    def _batch_probes(self) -> int:
        """Probes the batch-size stage will likely run (more where memory can run out)."""
        capped = plan.memory_bound(self.broker.device_type, self.spec.limits.memory_gb)
        return plan.typical_batch_probes(int(self.spec.baseline.get("batch_size") or 1), self.spec.batch_search.max, capped)

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

    # ---- seconds, for the time budget ---------------------------------------------------

    def unit_s(self) -> float | None:
        """Seconds per plain arm as this search's trials have cost (None before any finished)."""
        model = getattr(self.progress, "model", None)
        return model.unit() if model is not None else None

    def stage_seconds(self, name: str) -> float | None:
        """The expected wall seconds of deciding ``name`` from the incumbent now (None: not priced yet).

        The stage's share of ``plan.remaining_trials``: its screen, its typical confirmations
        and held-out pairs, its probes or cold compiles, without the final check's pairs.
        """
        unit = self.unit_s()
        if unit is None:
            return None
        m = self.spec.measure
        arms = plan.remaining_trials(
            [name], self.spec.search, confirm_pairs=typical_pairs(SequentialRule.from_measure(m, family=2), m.max_pairs),
            holdout_pairs=holdout_pairs(m.confidence, m.interval), final_pairs=0.0,
            batch_candidates=self.spec.batch_search.max_candidates, skip=self._runs_nothing([name]),
            incumbent=self.incumbent, baseline=self.spec.baseline, batch_probes=self._batch_probes(),
            screen_only=self._screen_only([name]), costs=self._costs())
        return arms * unit

    def final_seconds(self) -> float | None:
        """The expected wall seconds of the final check (its planned pairs) and the diagnosis trial after it."""
        unit = self.unit_s()
        if unit is None:
            return None
        costs = self._costs()
        # Reserved as if a change were kept: the stage about to start may keep one.
        pairs = planned_pairs(self.spec.measure, self.state.decisions)
        arms = pairs * (plan.arm_cost(self.spec.baseline, costs=costs) + plan.arm_cost(self.incumbent, costs=costs))
        return (arms + plan.arm_cost(self.incumbent, "diagnosis", costs)) * unit
