"""A trial process's lifeline to its parent: it ends when the process that started it ends.

Every trial-side process (the arm launcher, each arm and its loader workers, a one-shot
``trainopt.trial.worker``, the torchrun wrapper and its ranks) ties its life to its
parent's here, so even a ``kill -9`` of the orchestrator leaves no trial process behind
to load the machine while the search resumes.
"""

from __future__ import annotations

import ctypes
import os
import signal
from typing import Callable

from trainopt.contract.boundary import PARENT_PID_VAR

__all__ = ["expected_parent", "die_with_parent", "watch_parent"]

_PR_SET_PDEATHSIG = 1


def expected_parent() -> int | None:
    """The parent pid the orchestrator named in ``PARENT_PID_VAR`` (None when run by hand)."""
    value = os.environ.get(PARENT_PID_VAR, "")
    return int(value) if value.isdigit() else None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent ends (Linux; no-op elsewhere).

    The launcher is told (SIGTERM) when the orchestrator ends, each arm is killed when the
    launcher ends, and a one-shot trial process (``trainopt.trial.worker``, the torchrun wrapper)
    when the orchestrator ends.

    Args:
        sig: The signal to receive.
        parent: The pid the parent should have. A parent that died before the request
            left this process to another parent already, and no signal would come: it
            exits at once instead.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(70)


def watch_parent(parent: int, orphaned: Callable[[], None], period_s: float = 0.5) -> None:
    """Check now and every ``period_s`` that ``parent`` is still this process's parent.

    The parent-death signal alone can be lost (a parent that died before it was asked
    for, or whose creating thread outlives it), so a timer (SIGALRM) checks too and calls
    ``orphaned`` on a change; ``orphaned`` is expected to end the process. Forked children
    do not inherit the timer.

    Args:
        parent: The pid the parent should have.
        orphaned: Called from the signal handler once the parent has changed.
        period_s: Seconds between checks.
    """

    def check(signum, frame) -> None:
        if os.getppid() != parent:
            orphaned()

    signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, period_s, period_s)
    check(signal.SIGALRM, None)
