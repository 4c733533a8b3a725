"""Live progress for long searches: stage, knob, trial, elapsed time and ETA.

The search only emits events; how they are shown (a rich progress bar on a terminal,
plain lines in a log, nothing in tests) is decided here.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

__all__ = ["NullProgress", "ConsoleProgress", "format_duration"]


def format_duration(seconds: float | None) -> str:
    """``1h02m``, ``3m05s`` or ``42s``; ``?`` when unknown."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{s:02d}s"
    return f"{s}s"


class NullProgress:
    """Accepts every event and shows nothing."""

    def stage(self, stage: str, detail: str) -> None: ...
    def set_remaining(self, trials: float) -> None: ...
    def trial_started(self, **info: Any) -> None: ...
    def trial_finished(self, result: Any, wall_s: float | None = None, cost: float = 1.0) -> None: ...
    def trial_reused(self, cost: float = 1.0) -> None: ...
    def close(self) -> None: ...


class ConsoleProgress(NullProgress):
    """Progress on stderr: a live rich line on a terminal, one plain line per trial otherwise.

    The ETA is the estimated number of remaining trials times the median wall time of the
    last ``RECENT`` trials run in this session (reused trials cost nothing and are not
    counted); an arm of a session costs its share of the search's wall time for the batch
    it ran in, so arms that ran side by side on several slots are not counted twice.
    Recent, not all: a trial's cost follows the incumbent, and once a larger batch or a
    compiled model is adopted every later arm costs several times an early one.
    The median, not the mean: one very slow candidate (bf16 on a CPU without bf16 units)
    says nothing about the cost of the arms after it.

    Counts and walls are in plain arms: a trial the plan knows to be dearer (a compile
    arm, the cold-compile trial) comes with its ``cost``, counts down that many, and
    enters the median as its wall divided by it, so the price of a plain arm is not
    raised by the arms that were priced higher already.
    """

    RECENT = 16

    def __init__(self, quiet: bool = False, stream=None):
        from rich.console import Console

        self.quiet = quiet
        self.console = Console(file=stream or sys.stderr, highlight=False)
        self.live = self.console.is_terminal and not quiet
        self.start = time.monotonic()
        self.walls: list[float] = []
        # None until the search has a plan: the baseline trial finishes before the plan
        # knows how many trials follow, and "ETA 0s" there would be a wrong figure.
        self.remaining: float | None = None
        self.done = 0
        self.reused = 0
        self.current = ""
        self.stage_name = ""
        self._status = self.console.status("") if self.live else None
        if self._status:
            self._status.start()

    def _eta(self) -> float | None:
        if not self.walls or self.remaining is None:
            return None
        return self.remaining * statistics.median(self.walls[-self.RECENT:])

    def _line(self) -> str:
        return (
            f"[{self.stage_name}] {self.current}  trial {self.done + 1}"
            f"  elapsed {format_duration(time.monotonic() - self.start)}"
            f"  ETA {format_duration(self._eta())}"
            + (f"  ({self.reused} reused)" if self.reused else "")
        )

    def stage(self, stage: str, detail: str) -> None:
        self.stage_name = stage
        if not self.quiet and not self.live:
            self.console.print(f"== {stage}: {detail}")

    def set_remaining(self, trials: float) -> None:
        self.remaining = trials

    def trial_started(self, **info: Any) -> None:
        self.current = f"{info.get('knob')} {info.get('role')} {info.get('detail', '')}".strip()
        if self._status:
            self._status.update(self._line())

    def trial_finished(self, result: Any, wall_s: float | None = None, cost: float = 1.0) -> None:
        """One trial (or one arm of a session, with its share ``wall_s`` of the session's time) finished.

        Args:
            result: Its ``TrialResult``.
            wall_s: Its share of the session's wall time (default: the trial's own).
            cost: What the plan counts it as, in plain arms.
        """
        self.done += 1
        self._count_down(cost)
        wall = wall_s if wall_s is not None else result.wall_s
        if wall:
            self.walls.append(wall / cost)
        figure = f"{result.samples_per_s:,.1f} samples/s" if result.samples_per_s else (result.error or "")
        line = f"  {self.current}: {result.status} {figure}  (ETA {format_duration(self._eta())})"
        if not self.quiet:
            self.console.print(line, markup=False)
        if self._status:
            self._status.update(self._line())

    def trial_reused(self, cost: float = 1.0) -> None:
        self.reused += 1
        self._count_down(cost)

    def _count_down(self, cost: float) -> None:
        if self.remaining is not None:
            self.remaining = max(0, self.remaining - cost)

    def close(self) -> None:
        if self._status:
            self._status.stop()
            self._status = None
