"""Screen selection: which screened candidates of one knob are confirmed, and which are screened again.

A screen is one multi-arm session of the incumbent and every candidate; it only chooses
what to confirm. The false-win guarantee does not depend on it: given the screen, each
confirmation's data are fresh pairs, so whatever the screen selects, the sequential rule's
guarantee holds (``sequential.SequentialRule``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from trainopt.decide import plan

__all__ = [
    "MAX_CONFIRM",
    "SCREEN_GATE",
    "RESCREEN_FLOOR",
    "Selection",
    "select_for_confirmation",
    "rescreen_candidates",
    "cap_selection",
]

# At most this many candidates of one knob are confirmed (they share the knob's error budget).
MAX_CONFIRM = 2
# Candidates screening below this ratio are not confirmed: a single screen session is
# noisy, so the gate sits below 1, not above it: at the interleaved noise here (screen
# log-ratio sd ~0.06) a true +10 % change screens below 0.98 about 3 % of the time, while a
# clearly slower candidate costs no confirmation.
SCREEN_GATE = 0.98
# Candidates that screened between this floor and the gate are screened once more in a fresh
# session, while fewer than MAX_CONFIRM candidates cleared the gate, and are judged by the
# geometric mean of their two screens. One screen session carries the per-process offset
# of every arm in it (the demo's incumbent processes scattered over 300-500 samples/s at
# batch 32), and a real 1.1-1.2x batch change screened at 0.92x in one run. A second,
# independent session halves the variance of the ratio the gate sees, for the price of one
# session, and only where the first one was ambiguous. The false-win guarantee is
# unaffected: whatever the screens select, each confirmation runs on fresh pairs.
RESCREEN_FLOOR = 0.90


@dataclass(frozen=True)
class Selection:
    """Which screened candidates go on to confirmation, and how the budget is shared.

    Attributes:
        indices: Candidate indices to confirm, best screen first.
        family: How many confirmations share the knob's error budget (Bonferroni);
            build each confirmation's rule with ``family=family``.
        reasons: Per candidate index, why it was or was not confirmed.
    """

    indices: list[int]
    family: int
    reasons: dict[int, str] = field(default_factory=dict)


def select_for_confirmation(ratios: Sequence[float | None], max_confirm: int = MAX_CONFIRM,
                            gate: float = SCREEN_GATE) -> Selection:
    """Choose the candidates of a multi-arm screen session to confirm.

    A single screen session is noisy (one log-ratio, sd 0.06-0.09 interleaved and 0.17
    sequential here), so demanding that a candidate *screen* above ``1 + min_speedup``
    throws away a large share of real wins before they are ever confirmed. Instead the
    best ``max_confirm`` candidates not clearly slower than the incumbent are confirmed,
    each on fresh pairs with a share of the budget. The false-win guarantee does not
    depend on the screen: given the screen, each confirmation's data are fresh, so the
    chance that any of ``J`` selected confirmations wrongly says ``improved`` is at most
    ``J * alpha / (2 J)``, whichever ``J`` the screen chose.

    Args:
        ratios: Screen throughput ratio of each candidate over the incumbent (None when
            the candidate failed).
        max_confirm: Most candidates confirmed for one knob.
        gate: Candidates screening below this ratio are not confirmed (they would very
            rarely be a win, and each confirmation costs pairs).

    Returns:
        The selection.
    """
    if max_confirm < 1:
        raise ValueError(f"max_confirm must be >= 1, got {max_confirm}")
    ranked = sorted((i for i, r in enumerate(ratios) if r is not None and r >= gate), key=lambda i: -ratios[i])
    chosen = ranked[:max_confirm]
    reasons = {}
    for i, r in enumerate(ratios):
        if r is None:
            reasons[i] = "failed in the screen"
        elif i in chosen:
            reasons[i] = f"screened at {r:.3f}x; confirmed"
        elif r < gate:
            reasons[i] = f"screened at {r:.3f}x, below the {gate:.2f}x gate"
        else:
            reasons[i] = f"screened at {r:.3f}x; {max_confirm} candidates screened faster"
    return Selection(chosen, max(1, len(chosen)), reasons)


def rescreen_candidates(ratios: Sequence[float | None], gate: float = SCREEN_GATE,
                        floor: float | None = RESCREEN_FLOOR, max_confirm: int = MAX_CONFIRM) -> list[int]:
    """Candidates to screen again: the near misses, while confirmation has room for them.

    Args:
        ratios: Each candidate's screen ratio to the incumbent (None: it failed).
        gate: The screen gate of ``select_for_confirmation``.
        floor: The lowest ratio screened again; None screens nothing again.
        max_confirm: Once this many candidates cleared the gate, a near miss could not be
            confirmed anyway.
    """
    if floor is None or sum(1 for r in ratios if r is not None and r >= gate) >= max_confirm:
        return []
    return [i for i, r in enumerate(ratios) if r is not None and floor <= r < gate]


def cap_selection(selection: Selection, ratios: Sequence[float | None], bound: float, wait: float,
                  min_speedup: float) -> Selection:
    """Confirm nothing when the loader wait bounds what loader workers can gain below the margin.

    No candidate can truly clear the margin then, so a confirmation could only find a
    false win; the selected candidates are told why they were not confirmed.

    Args:
        selection: The screen's selection.
        ratios: Each candidate's screen ratio.
        bound: The largest speedup loader workers can give (``plan.loader_gain_bound``).
        wait: The incumbent's measured share of a step spent waiting for the DataLoader.
        min_speedup: The margin a change must clear.
    """
    if not selection.indices:
        return selection
    reasons = dict(selection.reasons)
    for i in selection.indices:
        reasons[i] = (f"screened at {ratios[i]:.3f}x; not confirmed: the incumbent waited for the DataLoader "
                      f"in {wait:.1%} of each step, so loader workers can make it at most {bound:.3f}x faster "
                      f"(even at {plan.LOADER_WAIT_SAFETY:g} times that wait), below the {1 + min_speedup:.2f}x margin")
    return Selection([], 1, reasons)
