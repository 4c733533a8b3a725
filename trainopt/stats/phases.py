"""Where a step's time goes, as plain numbers: phase seconds in, shares of wall time out.

A profiled window (``trainopt.trial.breakdown``) adds up the seconds each phase of the
training step took; this module turns them into shares of the window's wall time that sum
to 1, the rest being ``other`` (Python between the phases, the DataLoader's bookkeeping,
anything no phase covers). It also measures how much of a time span a set of device
intervals covers, for the device's busy share. Nothing here knows about torch.
"""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["PHASES", "phase_shares", "covered_seconds"]

# The phases of one training step, in the order they run. ``data_wait``: inside ``next()`` on
# the loader; ``to_device``: host-to-device copies; ``forward``: the model and the loss;
# ``backward``: gradients (and, under DDP, their all-reduce); ``optimizer``: the update and
# resetting gradients; ``loss_read``: host reads of the loss (a device synchronization);
# ``other``: the wall time no phase covers.
PHASES = ("data_wait", "to_device", "forward", "backward", "optimizer", "loss_read", "other")


def phase_shares(seconds: Mapping[str, float], wall_s: float) -> dict[str, float]:
    """Each phase's share of ``wall_s``; ``other`` is what the named phases leave.

    The named phases are timed inside the wall-clock span, so their sum cannot exceed it
    but for clock granularity; where it does, the shares are scaled to sum to 1 and
    ``other`` is 0.

    Args:
        seconds: Seconds per named phase (any of ``PHASES`` but ``other``; missing ones are 0).
        wall_s: The wall time of the profiled steps.

    Returns:
        One share per phase of ``PHASES``, summing to 1.

    Raises:
        ValueError: A negative time, an unknown phase, or no wall time.
    """
    unknown = set(seconds) - set(PHASES[:-1])
    if unknown:
        raise ValueError(f"unknown phases {sorted(unknown)}; known: {', '.join(PHASES[:-1])}")
    if not wall_s > 0:
        raise ValueError(f"the profiled steps took no wall time ({wall_s!r} s)")
    named = {p: float(seconds.get(p, 0.0)) for p in PHASES[:-1]}
    if any(v < 0 for v in named.values()):
        raise ValueError(f"negative phase time in {named}")
    total = sum(named.values())
    scale = wall_s if total <= wall_s else total
    shares = {p: v / scale for p, v in named.items()}
    shares["other"] = max(0.0, 1.0 - sum(shares.values()))
    return shares


def covered_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """How long the union of ``(start, end)`` intervals lasts; overlaps count once.

    Used for the device's busy time: kernels on several streams may overlap, and a
    device running two kernels at once is busy once, not twice.
    """
    total, reach = 0.0, None
    for start, end in sorted((float(a), float(b)) for a, b in intervals if b > a):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total
