"""Run one trial in a fresh Python process and bring back its one result.

The child runs in its own process session, so a time-out or an interrupt can stop it
together with every DataLoader worker it started (one ``killpg``), leaving no orphans.
Its stdout and stderr go to a per-trial log file; the result comes back only through the
JSON file named in the request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from trainopt.contract.boundary import (
    PARENT_PID_VAR,
    TORCHRUN_MODULE,
    WORKER_MODULE,
    child_environment,
)
from trainopt.contract.protocol import SchemaVersionError, TrialRequest, TrialResult
from trainopt.execute.ddp_launch import DistributedLaunch

__all__ = ["Runner", "SubprocessRunner", "ChildExit", "run_child", "child_env", "classify_exit"]


class Runner(Protocol):
    """Anything that turns a request into a result; swappable so tests can fake trials."""

    def run(self, request: TrialRequest, log_path: Path, timeout_s: float) -> TrialResult: ...


def classify_exit(returncode: int, what: str = "the trial process") -> str:
    """Human text for how a child ended without writing a result."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{what} was killed by {name}"
    return f"{what} exited with code {returncode} without writing a result"


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's whole process group (the child and its loader workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class ChildExit:
    """How a child launched by ``run_child`` ended."""

    returncode: int | None
    timed_out: bool
    wall_s: float


def child_env(extra_env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a trainopt child process: this one's, plus ``extra_env``."""
    env = child_environment(extra=extra_env)
    # The child ends with this process, even on a kill -9 (lifeline.die_with_parent).
    env[PARENT_PID_VAR] = str(os.getpid())
    return env


def run_child(
    module: str,
    argument: Path,
    log_path: Path,
    timeout_s: float,
    python: str | None = None,
    extra_env: dict[str, str] | None = None,
    command: list[str] | None = None,
    on_stop: Callable[[int], None] | None = None,
) -> ChildExit:
    """Run ``python -m MODULE ARGUMENT`` in a new process session, output to ``log_path``.

    On a time-out, an interrupt or a normal exit the whole process group is killed, so
    nothing the child started (DataLoader workers) outlives it.

    Args:
        command: The whole argv instead of ``python -m MODULE ARGUMENT`` (a torchrun launch).
        on_stop: Called with the child's pid before its group is killed, for processes the
            child started in sessions of their own (torchrun's ranks).
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            command or [python or sys.executable, "-m", module, str(argument)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=child_env(extra_env),
            start_new_session=True,
        )
        try:
            returncode = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            returncode = None
        except BaseException:
            # Ctrl-C or SIGTERM in the orchestrator: stop the child and its workers first.
            if on_stop is not None:
                on_stop(proc.pid)
            _kill_group(proc)
            proc.wait()
            raise
        finally:
            if on_stop is not None:
                on_stop(proc.pid)
            _kill_group(proc)
        if timed_out:
            proc.wait()
    return ChildExit(returncode, timed_out, time.perf_counter() - start)


class SubprocessRunner:
    """Runs each trial as ``python -m trainopt.trial.worker`` in a new process session.

    Args:
        python: Interpreter for the child (defaults to this one).
        extra_env: Environment variables added for the child.
    """

    def __init__(self, python: str | None = None, extra_env: dict[str, str] | None = None):
        self.python = python or sys.executable
        self.extra_env = extra_env or {}

    def run(self, request: TrialRequest, log_path: Path, timeout_s: float) -> TrialResult:
        """Run one trial; always returns a result, classifying every way a child can fail."""
        result_path = Path(request.result_path)
        stem = result_path.name.removesuffix(".json").removesuffix(".result")
        request_path = result_path.with_name(stem + ".request.json")
        request_path.write_text(request.to_json())
        # A stale result must never be mistaken for this trial's.
        result_path.unlink(missing_ok=True)
        # A spec with a `distributed` block runs each trial as a torchrun job (trainopt.execute.ddp_launch).
        launch = DistributedLaunch.for_request(request, request_path, self.python) if request.spec.get("distributed") else None
        if launch is None:
            end = run_child(WORKER_MODULE, request_path, log_path, timeout_s, self.python, self.extra_env)
        else:
            launch.clear()
            end = run_child(
                TORCHRUN_MODULE, request_path, log_path, timeout_s, self.python,
                {**self.extra_env, **launch.env()}, command=launch.command, on_stop=launch.stop,
            )
        result = self._read_result(result_path, request, end.returncode, end.timed_out, timeout_s)
        if launch is not None and result.status == "crashed" and not result_path.exists():
            # No result from rank 0: say which rank failed and how, from what the ranks left.
            result.status, result.error = launch.classify(end.returncode)
            result.world_size = launch.nproc
        elif launch is not None and result.status == "timeout":
            left = launch.unfinished()
            result.error += f" (ranks still running: {', '.join(map(str, left))} of {launch.nproc})" if left else ""
            result.world_size = launch.nproc
        result.wall_s = end.wall_s
        result.log_path = str(log_path)
        return result

    @staticmethod
    def _read_result(path: Path, request: TrialRequest, returncode, timed_out: bool, timeout_s: float) -> TrialResult:
        base = dict(settings=request.settings, mode=request.mode)
        if timed_out:
            return TrialResult(status="timeout", error=f"the trial did not finish within {timeout_s:g} s and was stopped", **base)
        try:
            data = json.loads(path.read_text())
            return TrialResult.from_dict(data)
        except FileNotFoundError:
            return TrialResult(status="crashed", error=classify_exit(returncode), **base)
        except (json.JSONDecodeError, SchemaVersionError, TypeError) as exc:
            return TrialResult(status="crashed", error=f"unreadable trial result: {exc}", **base)
