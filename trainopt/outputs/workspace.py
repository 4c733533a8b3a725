"""The output folder of a search: creating it, and a lock so two searches never share it."""

from __future__ import annotations

import errno
import fcntl
import os
import re
from pathlib import Path

from trainopt.errors import UserError

__all__ = ["OutputFolder", "OutputFolderError", "default_folder"]


class OutputFolderError(UserError):
    """The output folder cannot be used (not writable, or locked by another search)."""


def default_folder(name: str, *parts: str) -> Path:
    """``runs/<name>/...`` with the spec's name made safe for a path.

    The name is the user's text: slashes, ``..`` or a leading dot must never steer where
    trainopt writes, so everything outside ``[A-Za-z0-9._-]`` becomes ``-``.
    """
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-") or "search"
    return Path("runs", slug, *parts)


class OutputFolder:
    """An output folder held for the lifetime of one search.

    The lock is an ``flock`` on a file inside the folder: the kernel releases it when the
    process dies, even by ``kill -9``, so a crashed search never leaves a stale lock.

    Args:
        path: The folder; created if missing.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fh = None

    def __enter__(self) -> "OutputFolder":
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for sub in ("logs", "trials"):
                (self.path / sub).mkdir(exist_ok=True)
            probe = self.path / f".write-test.{os.getpid()}"
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise OutputFolderError(
                f"output folder {self.path} cannot be written ({exc.strerror or exc}); choose another with --out"
            ) from None
        lock_path = self.path / ".trainopt.lock"
        fh = open(lock_path, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise OutputFolderError(
                    f"another trainopt search (pid {holder}) is using {self.path}; wait for it to finish "
                    f"or choose another folder with --out"
                ) from None
            raise
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc) -> bool:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
        return False
