"""The verdict on one change, and the compile judgement that can overrule an improvement.

Plain data and pure functions: nothing here runs a trial.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Decision", "judge_compile"]


@dataclass
class Decision:
    """The verdict on changing one knob from the incumbent's value to a candidate's."""

    knob: str
    stage: str
    from_value: Any
    to_value: Any
    verdict: str
    reason: str = ""
    speedup: float | None = None
    ci: list[float] | None = None
    n_pairs: int = 0
    coverage: float | None = None
    screen_speedup: float | None = None
    before_samples_per_s: float | None = None
    after_samples_per_s: float | None = None
    before_peak_memory_bytes: int | None = None
    after_peak_memory_bytes: int | None = None
    kept: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge_compile(
    decision: Decision, compile_s: float, incumbent_step_s: float | None, low: float, run_length_steps: int
) -> None:
    """Compile counts as improved only if its per-step gain repays the compile time.

    The gain is taken at the interval's lower bound, so the judgement holds at the same
    confidence as the verdict. Updates ``decision`` in place: the figures go to ``extra``,
    and an ``improved`` verdict that does not repay becomes ``inconclusive``.

    Args:
        decision: The compile decision, already holding its confirmation verdict.
        compile_s: The compile time to charge (the largest seen: the cold one).
        incumbent_step_s: The incumbent's step time.
        low: The lower bound of the confirmed speedup interval.
        run_length_steps: How long production training runs.
    """
    gain = incumbent_step_s * (1.0 - 1.0 / low) if (incumbent_step_s and low > 1.0) else 0.0
    break_even = compile_s / gain if gain > 0 else None
    decision.extra.update(compile_s=compile_s, break_even_steps=break_even, run_length_steps=run_length_steps)
    if decision.verdict == "improved" and (break_even is None or break_even > run_length_steps):
        decision.verdict = "inconclusive"
        decision.reason += (
            f"; compile takes {compile_s:.1f} s and repays it only after "
            f"{'never' if break_even is None else f'{break_even:,.0f}'} steps, beyond run_length_steps "
            f"{run_length_steps:,}"
        )
