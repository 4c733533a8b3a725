"""The search's time budget: a stage starts only when its expected time and the final check's fit what is left.

Stages run in the search's order; before each one the budget compares the wall time left
with the stage's expected time (``SearchEta.stage_seconds``) plus the final check's
(``SearchEta.final_seconds``), kept in reserve so that the search always ends with a
checked recommendation. A stage that does not fit is not started and is recorded as not
tried; a later, cheaper stage may still fit. A stage once started runs to its planned end:
the budget never cuts a confirmation short, so its error bound holds.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from trainopt.search.state import SearchState

__all__ = ["TimeBudget", "NOT_TRIED"]

NOT_TRIED = "not tried (time budget)"


class TimeBudget:
    """Decides, stage by stage, whether a stage fits the time left.

    Args:
        budget_s: The budget in seconds (None: no budget, every stage starts).
        state: The search's state; stages left out go into its ``not_tried``.
        price: Expected seconds of a stage by knob name (None: not priced yet; it starts while
            time is left).
        reserve: Expected seconds of what must still follow every stage (the final check).
        clock: The time source (seconds); the budget counts from this object's creation.
    """

    def __init__(self, budget_s: float | None, state: SearchState, price: Callable[[str], float | None],
                 reserve: Callable[[], float | None], clock: Callable[[], float] = time.monotonic):
        self.budget_s = budget_s
        self.state = state
        self.price = price
        self.reserve = reserve
        self.clock = clock
        self.start = clock()

    def left_s(self) -> float | None:
        """Seconds of the budget left (None without a budget)."""
        return None if self.budget_s is None else self.budget_s - (self.clock() - self.start)

    def allows(self, knob: str, stage: str) -> bool:
        """Whether the stage deciding ``knob`` may start; when not, it is recorded as not tried."""
        left = self.left_s()
        if left is None:
            return True
        eta = self.price(knob)
        if eta is not None and eta <= 0:
            return True  # runs nothing here (no candidate applies on this device): only recorded
        # Not priced yet (no trial has finished): the stage starts while any time is left.
        need = (eta or 0.0) + (self.reserve() or 0.0)
        if need <= left and left > 0:
            return True
        self.state.not_tried.append({
            "knob": knob, "stage": stage, "reason": NOT_TRIED, "eta_s": eta, "left_s": max(0.0, left),
        })
        return False
