"""How a fault inside a trial process is reported: its status and the one line a result keeps.

A one-shot trial (``trainopt.trial.worker``), an arm (``trainopt.trial.arm``) and a
data-parallel rank (``trainopt.trial.ddp_rank``) classify a fault they can see the same
way, so an out-of-memory error means the same status whichever process hit it. torch is
not imported here: its out-of-memory type is looked up only when torch is already loaded.
"""

from __future__ import annotations

import sys

__all__ = ["is_out_of_memory", "last_line", "fault_status"]

# "std::bad_alloc": a C++ allocation inside torch (collating a large batch under an
# address-space cap, for one) fails with the bare exception name as its message.
_OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory", "std::bad_alloc")


def is_out_of_memory(exc: BaseException) -> bool:
    """True for the allocator's own out-of-memory errors (CUDA, CPU allocator, Python)."""
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(sys.modules.get("torch"), "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _OOM_MARKERS)


def last_line(exc: BaseException) -> str:
    """``Type: first line of the message``: the line a user needs, not library advice after it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def fault_status(exc: BaseException) -> tuple[str, str]:
    """The status (``oom`` or ``error``) and the error line for a fault a trial caught.

    A non-finite loss is the caller's to report as ``nonfinite`` before it gets here.
    """
    return ("oom" if is_out_of_memory(exc) else "error"), last_line(exc)
