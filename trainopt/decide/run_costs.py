"""What a production run costs: its hours and price at two settings, and checkpoints and evaluation.

``run_worth`` turns the spec's run (its length, the price of a device-hour) and the
search's speedup into the run's wall time at the baseline and at the recommended settings,
the hours and money saved, and when the search has paid for itself.

A training run also does more than training steps: it saves checkpoints and evaluates. Each
costs a fixed time every N steps; as a share of the run that is ``cost / (cost + N * step)``.
This module turns one measured checkpoint save and one measured evaluation pass into that
share at the spec's frequency, and the frequency that keeps it under ``BUDGET``. Advice
only: nothing here changes a verdict. Pure functions over plain numbers.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["BUDGET", "share_at", "steps_for_budget", "advise", "PER_STEPS", "samples_per_step", "run_samples", "run_steps", "run_worth"]

# The share of a run's time that a periodic cost may take before it is worth spacing out.
BUDGET = 0.05


def share_at(cost_s: float, every_steps: int, step_time_s: float) -> float:
    """The share of a run's wall time a cost of ``cost_s`` every ``every_steps`` steps takes."""
    period = every_steps * step_time_s
    return cost_s / (cost_s + period) if cost_s + period > 0 else 0.0


def steps_for_budget(cost_s: float, step_time_s: float, budget: float = BUDGET) -> int:
    """The fewest steps between two occurrences that keep the cost's share at or under ``budget``.

    From ``c / (c + N t) <= b``: ``N >= c (1 - b) / (b t)``.
    """
    if cost_s <= 0 or step_time_s <= 0:
        return 1
    return max(1, math.ceil(cost_s * (1.0 - budget) / (budget * step_time_s) - 1e-9))


def advise(measured: Mapping[str, Any] | None, spec_costs: Mapping[str, Any] | None,
           step_time_s: float | None) -> dict[str, Any] | None:
    """Each measured periodic cost, its share at the spec's frequency and the frequency within budget.

    Args:
        measured: The trial's ``run_costs`` (``checkpoint_s``, ``eval_s``, ``eval_batches``).
        spec_costs: The spec's ``run_costs`` section (``checkpoint_every_steps``,
            ``eval_every_steps``, ``eval_batches``).
        step_time_s: Seconds per optimizer step of the same settings.

    Returns:
        ``{"checkpoint": {...}, "evaluation": {...}, "budget": BUDGET}`` with, per entry that was
        measured, ``cost_s``, ``every_steps``, ``share`` and ``every_steps_for_budget``; or None
        when nothing was measured.
    """
    if not measured or not spec_costs or not step_time_s:
        return None
    out: dict[str, Any] = {"budget": BUDGET, "step_time_s": step_time_s}
    for name, cost_key, every_key in (("checkpoint", "checkpoint_s", "checkpoint_every_steps"),
                                      ("evaluation", "eval_s", "eval_every_steps")):
        cost, every = measured.get(cost_key), spec_costs.get(every_key)
        if cost is None or not every:
            continue
        share = share_at(cost, int(every), step_time_s)
        out[name] = {
            "cost_s": cost,
            "every_steps": int(every),
            "share": share,
            "every_steps_for_budget": steps_for_budget(cost, step_time_s),
            "within_budget": share <= BUDGET,
        }
        if name == "evaluation":
            out[name]["eval_batches"] = measured.get("eval_batches")
    return out if len(out) > 2 else None


# What the win is worth: the production run's wall time and price at the baseline and at
# the recommended settings. Pure arithmetic over the search's figures.

PER_STEPS = 1000


def _range(value: float, low: float | None, high: float | None) -> dict[str, float | None]:
    return {"estimate": value, "low": low, "high": high}


def samples_per_step(settings: Mapping[str, Any], world_size: int = 1) -> float:
    """Samples one optimizer step takes: ``batch_size x grad_accum x ranks``."""
    return float(settings.get("batch_size") or 1) * float(settings.get("grad_accum") or 1) * max(1, int(world_size))


def run_samples(run: Mapping[str, Any], samples_per_step: float, baseline_samples_per_s: float,
                dataset_len: int | None) -> tuple[float | None, str | None]:
    """Samples the production run processes, and why not when it cannot be known.

    A run given in steps processes ``steps`` baseline batches; in epochs, that many passes
    over the data set; in hours, what the baseline trains in that time. A run at other
    settings processes the same samples (a larger batch takes fewer, longer steps).
    """
    if run.get("steps"):
        return float(run["steps"]) * samples_per_step, None
    if run.get("epochs"):
        if not dataset_len:
            return None, "run.epochs needs the data set's length, which the baseline trial did not report"
        return float(run["epochs"]) * dataset_len, None
    if run.get("hours"):
        return float(run["hours"]) * 3600.0 * baseline_samples_per_s, None
    return None, "the run block gives no length"


def run_steps(run: Mapping[str, Any] | None, samples_per_step: float | None, baseline_samples_per_s: float | None,
              dataset_len: int | None, default: int) -> int:
    """The production run's length in baseline optimizer steps (what the compile judgement weighs).

    ``default`` when there is no run block or its length cannot be converted.
    """
    if not run or not samples_per_step or not baseline_samples_per_s:
        return int(run["steps"]) if run and run.get("steps") else default
    samples, _ = run_samples(run, samples_per_step, baseline_samples_per_s, dataset_len)
    return max(1, round(samples / samples_per_step)) if samples else default


def run_worth(run: Mapping[str, Any] | None, *, baseline_samples_per_s: float | None, samples_per_step: float | None,
              dataset_len: int | None, speedup: float | None, ci: list[float] | None,
              search_s: float | None) -> dict[str, Any] | None:
    """The production run's wall time at the baseline and at the recommended settings, the time and money saved.

    Without a run block (or when its length cannot be known) the figures are for
    ``PER_STEPS`` baseline steps and say nothing about money. Time at the recommended
    settings is the baseline's over the speedup; its interval comes from the speedup's
    (a higher speedup, a shorter run). The search's own cost is its wall time on the same
    device, and it has paid for itself once the time saved per step has summed to it.

    Args:
        run: The spec's production run (``run`` block as plain data), or None.
        baseline_samples_per_s: The baseline's throughput (the figure the speedup is against).
        samples_per_step: Samples per optimizer step at the baseline (batch x accumulation x ranks).
        dataset_len: The data set's length, when known (for a run in epochs).
        speedup: The recommended settings' speedup over the baseline (None: not known yet).
        ci: Its interval ``[low, high]``, or None.
        search_s: Wall seconds the search has taken.

    Returns:
        ``basis`` (``run`` or ``per_steps``), ``steps``, ``samples``, ``baseline_step_s``,
        ``baseline_hours``, ``recommended_hours`` and ``saved_hours`` (each
        ``{estimate, low, high}``; None without a speedup), ``search_hours``,
        ``paid_back_after_steps`` (None when nothing is saved), ``money`` (``currency``,
        ``device_hour_cost``, ``baseline``, ``recommended``, ``saved``, ``search``; None
        without a cost) and ``note`` (why a run block gave no run figures); None when the
        baseline has no throughput.
    """
    if not baseline_samples_per_s or not samples_per_step or baseline_samples_per_s <= 0 or samples_per_step <= 0:
        return None
    step_s = samples_per_step / baseline_samples_per_s
    samples, note = run_samples(run, samples_per_step, baseline_samples_per_s, dataset_len) if run else (None, None)
    basis = "run" if samples else "per_steps"
    if samples is None:
        samples = PER_STEPS * samples_per_step
    base_h = samples / baseline_samples_per_s / 3600.0
    rec = saved = None
    if speedup and speedup > 0:
        lo, hi = (ci[0], ci[1]) if ci and ci[0] and ci[1] else (None, None)
        rec = _range(base_h / speedup, base_h / hi if hi else None, base_h / lo if lo else None)
        saved = _range(base_h - rec["estimate"], base_h - rec["high"] if rec["high"] is not None else None,
                       base_h - rec["low"] if rec["low"] is not None else None)
    search_h = search_s / 3600.0 if search_s is not None else None
    per_step_saved = step_s * (1.0 - 1.0 / speedup) if speedup and speedup > 1 else None
    out: dict[str, Any] = {
        "basis": basis,
        "run": dict(run) if run else None,
        "steps": samples / samples_per_step,
        "samples": samples,
        "samples_per_step": samples_per_step,
        "baseline_step_s": step_s,
        "baseline_hours": base_h,
        "recommended_hours": rec,
        "saved_hours": saved,
        "search_hours": search_h,
        "paid_back_after_steps": (math.ceil(search_s / per_step_saved)
                                  if per_step_saved and search_s is not None else None),
        "money": None,
        "note": note,
    }
    cost = run.get("device_hour_cost") if run else None
    if cost is not None and basis == "run":

        def priced(r: dict[str, float | None] | None) -> dict[str, float | None] | None:
            return None if r is None else {k: (v * cost if v is not None else None) for k, v in r.items()}

        out["money"] = {
            "currency": run.get("currency"),
            "device_hour_cost": cost,
            "baseline": base_h * cost,
            "recommended": priced(rec),
            "saved": priced(saved),
            "search": search_h * cost if search_h is not None else None,
        }
    return out
