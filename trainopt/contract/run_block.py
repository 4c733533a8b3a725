"""The production run a search is for, and the search's own time budget, as spec sections.

``run:`` says how long the user's real training runs (``steps``, ``epochs`` or ``hours``
at the baseline's settings, exactly one) and, optionally, what a device-hour costs; the
search turns its speedup into hours and money saved (``trainopt.decide.run_costs``).
``measure.time_budget`` (or ``trainopt search --time-budget``) bounds the search's own wall
time: a duration such as ``20m``, ``1h30m``, ``90s`` or a number of seconds.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

__all__ = ["OptionalDuration", "RunSection", "RunCostsSection", "run_plan", "parse_duration", "run_problems", "deprecation_notes", "DEFAULT_RUN_STEPS", "DURATION_HELP"]

# The run length the compile judgement assumes when a spec says nothing about its run.
DEFAULT_RUN_STEPS = 100_000

DURATION_HELP = "a duration such as 20m, 1h30m, 90s or 1.5h, or a number of seconds"
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(h|m|s)")
_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0}


def parse_duration(value: Any) -> float:
    """Seconds in ``value``: a positive number (seconds) or text like ``20m``, ``1h30m``, ``90s``, ``1.5h``.

    Raises:
        ValueError: Naming the value and the forms allowed.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected {DURATION_HELP}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = _PART.findall(text)
            if not parts or _PART.sub("", text).strip():
                raise ValueError(f"expected {DURATION_HELP}") from None
            seconds = sum(float(n) * _UNIT[u] for n, u in parts)
    else:
        raise ValueError(f"expected {DURATION_HELP}")
    if not seconds > 0 or seconds > 366 * 24 * 3600:
        raise ValueError(f"must be more than 0 s and at most a year ({DURATION_HELP})")
    return seconds


# A spec field holding a duration: seconds once validated, None when left out.
OptionalDuration = Annotated[float | None, BeforeValidator(lambda v: None if v is None else parse_duration(v))]


class RunCostsSection(BaseModel):
    """What the rest of a run costs: a checkpoint every N steps, an evaluation every M steps.

    Measured once on the baseline (one checkpoint save, one evaluation pass) and reported
    as a share of training time with the frequency that keeps it under 5 %. Advice only.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    checkpoint_every_steps: int | None = Field(None, ge=1, le=10**12)
    eval_every_steps: int | None = Field(None, ge=1, le=10**12)
    eval_batches: int = Field(20, ge=1, le=100_000)


class RunSection(BaseModel):
    """The production run: its length (one of ``steps``, ``epochs``, ``hours``) and its price.

    Attributes:
        steps: Optimizer steps of the run at the baseline's batch (a run at other settings
            processes the same samples).
        epochs: Passes over the data set (its length comes from the baseline trial).
        hours: Wall-clock hours of the run at the baseline's settings.
        device_hour_cost: What one hour of the machine costs; without it nothing is said
            about money.
        currency: The unit of ``device_hour_cost`` (shown beside every amount).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    steps: int | None = Field(None, ge=1, le=10**12)
    epochs: float | None = Field(None, gt=0, le=10**9)
    hours: float | None = Field(None, gt=0, le=10**7)
    device_hour_cost: float | None = Field(None, ge=0, le=10**9)
    currency: str | None = Field(None, min_length=1, max_length=12)

    def length(self) -> tuple[str, float] | None:
        """``("steps" | "epochs" | "hours", value)``, the one length given."""
        for name in ("steps", "epochs", "hours"):
            value = getattr(self, name)
            if value is not None:
                return name, value
        return None


def run_problems(run: RunSection | None, run_length_steps: int | None) -> list[str]:
    """Rules between the run's fields, and between ``run`` and the deprecated ``run_length_steps``."""
    problems = []
    if run is not None:
        given = [n for n in ("steps", "epochs", "hours") if getattr(run, n) is not None]
        if len(given) != 1:
            got = f"got {' and '.join(given)}" if given else "got none"
            problems.append(f"run: give exactly one of steps, epochs, hours ({got}); e.g. run: {{steps: 100000}}")
        if run.currency is not None and run.device_hour_cost is None:
            problems.append(f"run.currency: got {run.currency!r} without run.device_hour_cost; "
                            "add what one device-hour costs, or remove currency")
        if run_length_steps is not None:
            problems.append(f"run_length_steps: got {run_length_steps} beside a run block; give the run's length once, "
                            f"as run.steps: {run_length_steps}")
    return problems


def run_plan(run: RunSection | None, run_length_steps: int | None) -> RunSection | None:
    """The production run: the ``run`` block, or the deprecated ``run_length_steps`` as ``run.steps``; None when neither."""
    if run is not None:
        return run
    return RunSection(steps=run_length_steps) if run_length_steps is not None else None


def deprecation_notes(run_length_steps: int | None) -> list[str]:
    """Notes on deprecated fields the spec still uses (valid, with the field to write instead)."""
    if run_length_steps is None:
        return []
    return [f"run_length_steps is deprecated; write run: {{steps: {run_length_steps}}} instead "
            f"(the same run length; a run block can also give device_hour_cost to price the time saved)"]
