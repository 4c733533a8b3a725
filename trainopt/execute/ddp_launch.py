"""The orchestrator's side of a data-parallel trial: the torchrun command, and what it left behind.

A DDP trial is one ``python -m trainopt.trial.torchrun <torchrun options> -m trainopt.trial.ddp_rank REQUEST.json``
process: torchrun's own launcher (same options, same code) that also records which rank
failed and how. Each rank writes a small status file beside the result (pid, and how it
ended when it could see it), rank 0 writes the one ``TrialResult``. From those files and
the launcher's record, ``classify`` says what happened; ``kill_ranks`` stops every rank
and loader worker, which torchrun starts in sessions of their own (so killing the
launcher's process group alone would leave them running). Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from trainopt.contract import distributed
from trainopt.contract.boundary import (
    DDP_RANK_MODULE,
    LAUNCH_STATUS_VAR,
    TORCHRUN_MODULE,
)
from trainopt.contract.distributed import launch_status_path, rank_status_path

__all__ = [
    "DistributedLaunch",
    "classify",
    "kill_process_tree",
]

# The launcher tells a rank it is being torn down with SIGTERM; a rank that ended so was
# stopped because another failed, not a failure of its own.
_TEARDOWN = -int(signal.SIGTERM)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code} without reporting an error"


def classify(
    world: int,
    statuses: Mapping[int, Mapping[str, Any]],
    failures: Mapping[int, int],
    launcher_code: int | None,
) -> tuple[str, str]:
    """The status and message of a DDP trial that left no result, from what each rank left.

    Pure, so every fault is testable without processes. Order of evidence:

    1. A rank that died without reporting (a signal or a bare exit code, other than the
       launcher's SIGTERM tear-down) crashed; peers then fail only as a consequence.
    2. Otherwise the first rank to report a fault (``oom``, ``nonfinite``, ``error``)
       names the status: later reports are usually peers losing their connection to it.
    3. Otherwise the launcher itself failed.

    Args:
        world: Number of ranks.
        statuses: Rank -> its status file (``state``, ``status``, ``error``, ``time``).
        failures: Rank -> exit code, for the ranks the launcher saw fail (negative: signal).
        launcher_code: The launcher process's exit code (None if unknown).

    Returns:
        ``(status, message)``; the message names the rank.
    """
    for rank in sorted(failures):
        code = failures[rank]
        if statuses.get(rank, {}).get("state") == "failed" or code == _TEARDOWN:
            continue
        return "crashed", f"rank {rank} of {world} {_exit_text(code)}"
    reported = [(s.get("time", 0.0), r, s) for r, s in statuses.items() if s.get("state") == "failed"]
    if reported:
        _, rank, s = min(reported, key=lambda item: (item[0], item[1]))
        return str(s.get("status", "error")), f"rank {rank} of {world}: {s.get('error') or 'failed'}"
    for rank in sorted(failures):
        return "crashed", f"rank {rank} of {world} {_exit_text(failures[rank])}"
    missing = [r for r in range(world) if statuses.get(r, {}).get("state") != "done"]
    if launcher_code is not None and launcher_code < 0:
        return "crashed", f"the launcher {_exit_text(launcher_code)}"
    who = f" (ranks {', '.join(map(str, missing))} did not finish)" if missing else ""
    code = "" if launcher_code is None else f" with code {launcher_code}"
    return "crashed", f"the data-parallel launcher ended{code} without a result{who}; see the trial log"


def kill_process_tree(root_pid: int, extra_groups: list[int] = ()) -> None:
    """SIGKILL the launcher, every descendant and every process group they lead.

    Descendants are collected before anything is killed (afterwards they would be
    re-parented and out of sight); ranks' own sessions hold their loader workers.
    """
    import psutil

    pids: set[int] = set()
    try:
        root = psutil.Process(root_pid)
        pids.update(p.pid for p in root.children(recursive=True))
    except psutil.Error:
        pass
    groups = set(int(g) for g in extra_groups)
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except OSError:
            pass
    groups.add(root_pid)
    own = os.getpgrp()
    for group in groups:
        if group in (0, 1, own):
            continue
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@dataclass
class DistributedLaunch:
    """One DDP trial's command, environment and leftovers.

    Args:
        python: Interpreter for the launcher and ranks.
        request_path: The trial request the ranks read.
        result_path: Where rank 0 writes the result.
        nproc: Ranks on this node.
        threads: The ``threads`` knob (None: the cores shared out among the ranks).
    """

    python: str
    request_path: Path
    result_path: Path
    nproc: int
    threads: int | None = None

    @classmethod
    def for_request(cls, request: Any, request_path: Path, python: str) -> "DistributedLaunch":
        """The launch for a request whose spec has a ``distributed`` block."""
        return cls(
            python=python,
            request_path=Path(request_path),
            result_path=Path(request.result_path),
            nproc=distributed.world_size(request.spec.get("distributed")),
            threads=request.settings.get("threads"),
        )

    @property
    def command(self) -> list[str]:
        """argv: torchrun's options, then the rank module and the request."""
        return [
            self.python,
            "-m",
            TORCHRUN_MODULE,
            *distributed.torchrun_args(self.nproc),
            "-m",
            DDP_RANK_MODULE,
            str(self.request_path),
        ]

    def env(self) -> dict[str, str]:
        """Variables added for the launcher and ranks: explicit threads, where to record failures."""
        return {
            "OMP_NUM_THREADS": str(distributed.rank_threads(self.threads, self.nproc)),
            LAUNCH_STATUS_VAR: str(launch_status_path(self.result_path)),
        }

    def clear(self) -> None:
        """Remove status files of an earlier run of this trial, so none is mistaken for this one's."""
        launch_status_path(self.result_path).unlink(missing_ok=True)
        for rank in range(self.nproc):
            rank_status_path(self.result_path, rank).unlink(missing_ok=True)

    def rank_statuses(self) -> dict[int, dict[str, Any]]:
        """Each rank's status file that could be read."""
        out: dict[int, dict[str, Any]] = {}
        for rank in range(self.nproc):
            try:
                out[rank] = json.loads(rank_status_path(self.result_path, rank).read_text())
            except (OSError, ValueError):
                continue
        return out

    def failures(self) -> dict[int, int]:
        """Rank -> exit code for the ranks the launcher saw fail."""
        try:
            data = json.loads(launch_status_path(self.result_path).read_text())
            return {int(rank): int(code) for rank, code in data.get("failures", {}).items()}
        except (OSError, ValueError, AttributeError, TypeError):
            return {}

    def stop(self, launcher_pid: int) -> None:
        """Kill the launcher, every rank and every loader worker (also after a clean exit)."""
        pids = [int(s["pid"]) for s in self.rank_statuses().values() if isinstance(s.get("pid"), int)]
        kill_process_tree(launcher_pid, pids)
        # Once more after a moment: a rank mid-fork may have started a worker just then.
        time.sleep(0.05)
        kill_process_tree(launcher_pid, pids)

    def unfinished(self) -> list[int]:
        """Ranks that had not finished (no ``done`` status) when the trial ended."""
        statuses = self.rank_statuses()
        return [r for r in range(self.nproc) if statuses.get(r, {}).get("state") != "done"]

    def classify(self, launcher_code: int | None) -> tuple[str, str]:
        """The status and message for this trial when rank 0 wrote no result."""
        return classify(self.nproc, self.rank_statuses(), self.failures(), launcher_code)
