"""The spec's ``check`` section: what is checked after the search, beyond speed."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CheckSection"]


class CheckSection(BaseModel):
    """What is checked after the search, beyond speed.

    Attributes:
        training: Train the recommended settings and a reference (the baseline at the
            recommended batch size) from the same weights on the same data, and a twin of
            the reference in another data order, and judge whether the recommended settings
            still train the same (``trainopt.decide.training_check``).
        training_steps: Optimizer steps of each of those runs; the loss is read at every one.
    """

    # As every spec section: unknown keys are refused, values frozen once validated.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    training: bool = True
    # 40: on the demo (a ResNet-18 of width 16 at batch 128 on a 2-core CPU) the check's
    # runs then cost about a tenth of the search's time (benchmarks/RESULTS.md), and the
    # planted cases that do not learn already sit far outside the yardstick by then.
    training_steps: int = Field(40, ge=8, le=1_000_000)
