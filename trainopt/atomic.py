"""Atomic file writes: readers see the old file or the whole new one, never half of one.

Every result file trainopt writes (trial results, results.json, best.yaml, the CSVs, the
report and its plots) goes through here, so a crash, a kill or a full disk mid-write
leaves the previous version intact and no temporary file behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["write_bytes_atomic", "write_text_atomic", "write_json_atomic"]


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    """Write ``data`` to a temporary file in the same folder, fsync it, rename it over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
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
