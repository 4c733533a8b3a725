"""Sampling the machine for the machine check: other processes' CPU time and the load, from /proc.

Only reading happens here; ``decide.machine`` judges what was read. On a system without
/proc every sample is None and the check says nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

from trainopt.decide.machine import Load, MachineCheck, judge, other_load

__all__ = ["snapshot", "MachineProbe"]

PROC = Path("/proc")


# The kernel's own threads (PF_KTHREAD in the flags field): their time is the kernel writing
# back and moving I/O, often the files of the run that just ended; no user can stop them, and
# counting them called a quiet machine busy after every search here (writeback and vsock
# workers at 0.4-0.8 of a CPU for a second).
_KERNEL_THREAD = 0x00200000


def _read_stat(pid_dir: Path) -> tuple[str, int, int] | None:
    """(name, ppid, utime + stime ticks) of one user process, or None when it is gone, unreadable or a kernel thread."""
    try:
        text = (pid_dir / "stat").read_text()
    except OSError:
        return None
    # The name is in parentheses and may hold spaces or parentheses itself.
    open_, close = text.find("("), text.rfind(")")
    if open_ < 0 or close < 0:
        return None
    fields = text[close + 2:].split()
    try:
        if int(fields[6]) & _KERNEL_THREAD:
            return None
        return text[open_ + 1:close], int(fields[1]), int(fields[11]) + int(fields[12])
    except (IndexError, ValueError):
        return None


def snapshot(root: Path = PROC, roots: Iterable[int] = ()) -> dict[str, Any] | None:
    """Every process's CPU ticks, the search's own processes, and the load average; None without /proc.

    Args:
        root: The /proc to read.
        roots: More processes whose trees are the search's own (a Ray slot's actor on this
            machine, which is not this process's descendant when Ray was started apart).
    """
    if not (root / "stat").exists():
        return None
    procs: dict[int, tuple[str, int]] = {}
    parents: dict[int, int] = {}
    for d in root.iterdir():
        if not d.name.isdigit():
            continue
        got = _read_stat(d)
        if got is not None:
            procs[int(d.name)] = (got[0], got[2])
            parents[int(d.name)] = got[1]
    try:
        load1 = float((root / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        load1 = None
    # The search's own processes: this one and every descendant (its trials and their workers).
    own = {os.getpid(), *(pid for pid in roots if pid in parents)}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in own and pid not in own:
                own.add(pid)
                grew = True
    return {"t": time.monotonic(), "cpus": os.cpu_count() or 1, "hz": os.sysconf("SC_CLK_TCK"), "procs": procs,
            "load1": load1, "own": sorted(own)}


class MachineProbe:
    """Samples the machine before and during a search and keeps what it saw for ``results.json``.

    Args:
        sleep: How to wait (a test passes its own).
        root: The /proc to read.
    """

    def __init__(self, sleep: Callable[[float], None] = time.sleep, root: Path = PROC):
        self.sleep, self.root = sleep, root
        self.started = time.monotonic()
        self.before: dict[str, Any] | None = None
        self.during: list[dict[str, Any]] = []
        self.waited_s = 0.0
        self.roots: set[int] = set()
        self._last = snapshot(root)

    def add_own(self, pids: Iterable[int]) -> None:
        """Count these processes and their descendants as the search's own from the next sample on."""
        self.roots.update(int(p) for p in pids)

    def _since_last(self) -> Load | None:
        now = snapshot(self.root, self.roots)
        last, self._last = self._last, now
        if last is None or now is None:
            return None
        return other_load(last, now, own=set(last.get("own", [])) | set(now.get("own", [])))

    def check_before(self, interval_s: float = 1.0) -> MachineCheck | None:
        """Sample ``interval_s`` seconds before the first trial; records and returns the judgement."""
        self._last = snapshot(self.root)
        self.sleep(interval_s)
        load = self._since_last()
        if load is None:
            return None
        check = judge(load, before_search=True)
        self.before = {**load.to_dict(), "busy": check.busy, "reason": check.reason}
        return check

    def wait_for_quiet(self, max_s: float, interval_s: float = 5.0, say: Callable[[str], None] = print) -> MachineCheck | None:
        """Sample every ``interval_s`` until the machine is quiet or ``max_s`` have passed; the last judgement."""
        check = self.check_before(min(interval_s, 1.0))
        while check is not None and check.busy and self.waited_s < max_s:
            say(f"machine busy ({check.reason}); waiting for it to quiet down ({self.waited_s:.0f} of {max_s:.0f} s)")
            check = self.check_before(interval_s)
            self.waited_s += interval_s
        if self.before is not None:
            self.before["waited_s"] = self.waited_s
        return check

    def sample(self, t_s: float | None = None) -> MachineCheck | None:
        """The load since the previous sample (no waiting), recorded as a point of the search."""
        load = self._since_last()
        if load is None or load.interval_s < 0.5:
            return None
        check = judge(load)
        self.during.append({"t_s": round(t_s if t_s is not None else time.monotonic() - self.started, 3),
                            **load.to_dict(), "busy": check.busy, "reason": check.reason})
        return check

    @property
    def busy_now(self) -> bool:
        """The latest sample said busy."""
        return bool(self.during and self.during[-1]["busy"])

    def to_dict(self) -> dict[str, Any]:
        """The results document's ``machine`` section."""
        busy = [p for p in self.during if p["busy"]]
        return {"before": self.before, "during": list(self.during), "busy_samples": len(busy),
                "samples": len(self.during), "max_others": max((p["others"] for p in self.during), default=None)}
