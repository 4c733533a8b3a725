"""Executors: where and how many measurement sessions run at once.

The search hands the executor a batch of independent ``SessionJob``s (the pairs of one
confirmation up to the rule's next look, say) and gets one ``SessionResult`` per job back,
in job order. ``SerialExecutor`` runs them one after another on this machine; executors
with several slots run them side by side. The arms of one job always run together on one
slot, so a job's ratios never mix machines.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from trainopt.protocol import TrialRequest
from trainopt.session import SessionResult, SessionRunner

__all__ = ["SessionJob", "SessionExecutor", "SerialExecutor"]


@dataclass(frozen=True)
class SessionJob:
    """One session to run.

    Attributes:
        requests: The arms, in order.
        log_paths: One log file per arm.
        timeout_s: Limit for any one arm's warm-up or window.
        seed: Randomises the arm order inside the session.
    """

    requests: list[TrialRequest]
    log_paths: list[Path]
    timeout_s: float
    seed: int


class SessionExecutor(Protocol):
    """Runs batches of sessions."""

    slots: int

    def run_many(self, jobs: list[SessionJob], exclusive: bool = False) -> list[SessionResult]: ...

    def close(self) -> None: ...


class SerialExecutor:
    """One slot on this machine: sessions run one after another.

    Args:
        runner: Measures one session.
    """

    slots = 1

    def __init__(self, runner: SessionRunner):
        self.runner = runner

    def run_many(self, jobs: list[SessionJob], exclusive: bool = False) -> list[SessionResult]:
        """Run every job in turn (always exclusive: nothing runs beside it)."""
        out = []
        node = socket.gethostname()
        for job in jobs:
            result = self.runner.run_session(job.requests, job.log_paths, job.timeout_s, job.seed)
            for arm in result.arms:
                arm.env = {**arm.env, "slot": 0, "node": node, "device": arm.env.get("device", arm.env.get("device_type", "cpu"))}
            out.append(result)
        return out

    def close(self) -> None:
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()
