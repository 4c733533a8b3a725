"""Atomic file writes: readers see the old file or the whole new one, never half of one.

Every result file trainopt writes (trial results, results.json, best.yaml, the CSVs, the
report and its plots) goes through here, so a crash, a kill or a full disk mid-write
leaves the previous version intact and no temporary file behind. The file gets the mode
a plain ``open(path, "w")`` would give it (0644 under the usual umask 022), not the 0600 of
the temporary file it was written as.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_bytes_atomic", "write_text_atomic", "write_json_atomic", "current_umask"]


def current_umask() -> int:
    """This process's umask, read without changing it where the system allows.

    Linux shows it in ``/proc/self/status``; elsewhere it can only be read by setting it,
    which is done with 022 so a file another thread creates meanwhile is never left open
    to everyone.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file in the same folder, fsync it, rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            # mkstemp makes the file private (0600); results are meant to be read like any file.
            os.fchmod(fh.fileno(), 0o666 & ~current_umask())
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write UTF-8 text atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON atomically; NaN and infinity are refused rather than written as invalid JSON."""
    write_text_atomic(path, json.dumps(data, indent=1, allow_nan=False, default=str))
