"""What the rest of a run costs: checkpoints and evaluation as a share of training time.

A training run does more than training steps: it saves checkpoints and evaluates. Each
costs a fixed time every N steps; as a share of the run that is ``cost / (cost + N * step)``.
This module turns one measured checkpoint save and one measured evaluation pass into that
share at the spec's frequency, and the frequency that keeps it under ``BUDGET``. Advice
only: nothing here changes a verdict. Pure functions over plain numbers.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

__all__ = ["BUDGET", "share_at", "steps_for_budget", "advise"]

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
