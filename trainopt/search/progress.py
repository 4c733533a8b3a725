"""Live progress for long searches: stage, knob, trial, elapsed time and ETA.

The search only emits events; how they are shown (a rich progress bar on a terminal,
plain lines in a log, nothing in tests) is decided here. What a trial process costs is
learned here too, from the trials as they finish (``plan.ArmCosts``): the search asks for
those prices when it counts what is left.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from trainopt.decide import plan

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
    def set_expected(self, processes: float) -> None: ...
    def costs(self) -> dict[str, float] | None:
        """Prices learned from this search's trials (``plan.ArmCosts``), or None for the priors."""
        return None
    def close(self) -> None: ...


class ConsoleProgress(NullProgress):
    """Progress on stderr: a live progress bar on a terminal, plain lines otherwise.

    On a terminal the bar shows the stage and the trial, the trial processes done against
    those expected, the elapsed time and the ETA, with one line per finished trial above
    it; in a log (not a terminal) every stage and every finished trial is one plain line.

    The ETA is the remaining work the search counts (``set_remaining``, in plain arms)
    times the price of a plain arm now; both the price and the kinds' weights are learned
    from this search's own trials (``plan.ArmCosts``): until a kind is measured it is priced
    at its prior, then at a mix that moves to what this search measured. A session is
    learned from as a whole, once all its arms finished (its arms share its wall time).
    Reused trials cost nothing and teach nothing. A trial whose settings and role are not
    known is counted down at the ``cost`` given and sets only the plain arm's price.

    Args:
        quiet: No per-trial or stage lines, and no bar.
        stream: Where to write (default stderr).
        terminal: Force (True) or forbid (False) the terminal's bar; default: whether the
            stream is a terminal.
        learn: Learn the kinds' prices (False: the priors, as fixed weights).
    """

    RECENT = plan.ArmCosts.RECENT

    def __init__(self, quiet: bool = False, stream=None, terminal: bool | None = None, learn: bool = True):
        from rich.console import Console

        self.quiet = quiet
        self.learn = learn
        self.console = Console(file=stream or sys.stderr, highlight=False, force_terminal=terminal)
        self.live = self.console.is_terminal and not quiet
        self.start = time.monotonic()
        self.model = plan.ArmCosts()
        # None until the search has a plan: the baseline trial finishes before the plan
        # knows how many trials follow, and "ETA 0s" there would be a wrong figure.
        self.remaining: float | None = None
        self.expected: float | None = None
        self.done = 0
        self.reused = 0
        self.work_done = 0.0
        self.current = ""
        self.stage_name = ""
        self._role = ""
        self._knob = ""
        self._sessions: dict[str, tuple[list[str], float]] = {}
        self._bar = self._task = None
        if self.live:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
            from rich.table import Column

            # The stage and trial take what the figures leave of the line, cut short if need be.
            self._bar = Progress(
                TextColumn("{task.description}", markup=False,
                           table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis")),
                BarColumn(bar_width=20), TextColumn("{task.fields[count]}"),
                TextColumn("elapsed"), TimeElapsedColumn(), TextColumn("ETA {task.fields[eta]}"),
                console=self.console, transient=False, expand=True,
            )
            self._task = self._bar.add_task("", total=None, count="", eta="?")
            self._bar.start()

    def _eta(self) -> float | None:
        unit = self.model.unit()
        if unit is None or self.remaining is None:
            return None
        return self.remaining * unit

    def costs(self) -> dict[str, float] | None:
        return self.model.costs() if self.learn else None

    def _count(self) -> str:
        done = self.done + self.reused
        if self.expected is None:
            return f"{done} trials"
        return f"{done}/~{done + round(self.expected)} trials"

    def _show(self) -> None:
        if self._bar is None:
            return
        total = self.work_done + self.remaining if self.remaining is not None else None
        self._bar.update(self._task, description=f"[{self.stage_name}] {self.current}", completed=self.work_done,
                         total=total, count=self._count(), eta=format_duration(self._eta()))
        self._bar.refresh()

    def stage(self, stage: str, detail: str) -> None:
        self.stage_name = stage
        if not self.quiet and not self.live:
            self.console.print(f"== {stage}: {detail}", markup=False, soft_wrap=True)
        self._show()

    def set_remaining(self, trials: float) -> None:
        self.remaining = trials
        self._show()

    def set_expected(self, processes: float) -> None:
        """How many trial processes the search still expects (for the bar's count)."""
        self.expected = processes
        self._show()

    def trial_started(self, **info: Any) -> None:
        self._role = str(info.get("role") or "")
        self._knob = str(info.get("knob") or "")
        self.current = f"{info.get('knob')} {info.get('role')} {info.get('detail', '')}".strip()
        self._show()

    def _arm(self, result: Any, session: dict | None) -> str:
        """`` [arm 2 of 2: amp=bf16]`` for an arm of a session, so alternating figures say whose they are."""
        session = session or getattr(result, "session", None)
        if not isinstance(session, dict) or session.get("arms", 1) < 2 or "arm" not in session:
            return ""
        settings = getattr(result, "settings", None)
        value = f": {self._knob}={settings[self._knob]}" if isinstance(settings, dict) and self._knob in settings else ""
        return f" [arm {session['arm'] + 1} of {session['arms']}{value}]"

    def _kind(self, result: Any) -> tuple[str | None, dict | None]:
        """The trial's kind (``plan.arm_kind``) and its session, or None where not known."""
        settings, session = getattr(result, "settings", None), getattr(result, "session", None)
        if not self.learn or not isinstance(settings, dict) or not settings:
            return None, None
        role = str(session["id"]).split("/")[0] if session and session.get("id") else self._role
        return plan.arm_kind(settings, role), session

    def trial_finished(self, result: Any, wall_s: float | None = None, cost: float = 1.0) -> None:
        """One trial (or one arm of a session, with its share ``wall_s`` of the session's time) finished.

        Args:
            result: Its ``TrialResult``.
            wall_s: Its share of the session's wall time (default: the trial's own).
            cost: What the plan counts it as, in plain arms (used where its kind is not known).
        """
        self.done += 1
        kind, session = self._kind(result)
        if kind is not None:
            cost = self.model.cost(kind)
        self._count_down(cost)
        wall = wall_s if wall_s is not None else result.wall_s
        if wall and kind is None:
            self.model.observe_priced(wall, cost)
        elif wall and session and session.get("arms", 1) > 1:
            kinds, total = self._sessions.get(session["id"], ([], 0.0))
            kinds, total = [*kinds, kind], total + wall
            if len(kinds) >= session["arms"]:
                self._sessions.pop(session["id"], None)
                self.model.observe(kinds, total)
            else:
                self._sessions[session["id"]] = (kinds, total)
        elif wall:
            self.model.observe([kind], wall)
        if self.expected is not None:
            self.expected = max(0.0, self.expected - 1)
        figure = f"{result.samples_per_s:,.1f} samples/s" if result.samples_per_s else (result.error or "")
        line = f"  {self.current}{self._arm(result, session)}: {result.status} {figure}  (ETA {format_duration(self._eta())})"
        if not self.quiet:
            # Each line whole, never broken at a width: a log file or a pipe has none (Rich would
            # take 80 columns and break "(ETA" from "5m25s)"), and a terminal wraps by itself.
            self.console.print(line, markup=False, soft_wrap=True)
        self._show()

    def trial_reused(self, cost: float = 1.0) -> None:
        self.reused += 1
        self._count_down(cost)
        if self.expected is not None:
            self.expected = max(0.0, self.expected - 1)
        self._show()

    def _count_down(self, cost: float) -> None:
        self.work_done += cost
        if self.remaining is not None:
            self.remaining = max(0, self.remaining - cost)

    def close(self) -> None:
        if self._bar is not None:
            self._show()
            self._bar.stop()
            self._bar = None
