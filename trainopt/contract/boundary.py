"""The process boundary's names, in one place: entry modules, environment variables, the child environment.

Every process trainopt starts is started by module name (``python -m NAME``), never by
importing the module, so the orchestrator's side (``trainopt.execute``) and the trial side
(``trainopt.trial``) share only these strings. A test checks that every module named here
exists and that no other module spells one of these names itself.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

__all__ = [
    "WORKER_MODULE",
    "FORKSERVER_MODULE",
    "TORCHRUN_MODULE",
    "DDP_RANK_MODULE",
    "REFCHECK_MODULE",
    "ENV_REPORT_MODULE",
    "ENTRY_MODULES",
    "ARM_PRELOAD",
    "COMPILER_PRELOAD",
    "PARENT_PID_VAR",
    "FORKSERVER_PARENT_VAR",
    "SLOT_CPUS_VAR",
    "LAUNCH_STATUS_VAR",
    "checkout_root",
    "child_environment",
]

# ---- entry modules: what ``python -m`` runs -------------------------------------------------
# One trial in a fresh process: ``python -m trainopt.trial.worker REQUEST.json``.
WORKER_MODULE = "trainopt.trial.worker"
# The fork server that starts live arms: ``python -m trainopt.trial.forkserver FD [TAG]``.
FORKSERVER_MODULE = "trainopt.trial.forkserver"
# torchrun itself, recording which rank failed: ``python -m trainopt.trial.torchrun ... -m DDP_RANK_MODULE``.
TORCHRUN_MODULE = "trainopt.trial.torchrun"
# One rank of a data-parallel trial, run by torchrun.
DDP_RANK_MODULE = "trainopt.trial.ddp_rank"
# Resolves a spec's ``module:callable`` references away from the orchestrator's process.
REFCHECK_MODULE = "trainopt.trial.refcheck"
# This machine's environment fingerprint for ``trainopt env``: ``python -m trainopt.trial.env_report REQUEST.json``.
ENV_REPORT_MODULE = "trainopt.trial.env_report"
ENTRY_MODULES = (WORKER_MODULE, FORKSERVER_MODULE, TORCHRUN_MODULE, DDP_RANK_MODULE, REFCHECK_MODULE, ENV_REPORT_MODULE)

# Imported by the fork server before its first fork: everything an arm needs that is slow to import.
ARM_PRELOAD = ("torch", "torch._dynamo", "trainopt.trial.measure", "trainopt.trial.workloads",
               "trainopt.trial.environment", "trainopt.trial.arm")
# Imported on the first request for an arm that compiles: about 1 s of every compiled arm's
# start (measured 4.7-4.9 s to the first compiled step of the demo's model from a warm
# compiler cache, 3.4-3.9 s with these imported before the fork). Not in ARM_PRELOAD, since a
# search without compile would pay the import for nothing. It starts no threads.
COMPILER_PRELOAD = ("torch._inductor.compile_fx",)

# ---- environment variables -------------------------------------------------------------------
# Set by the orchestrator for its one-shot trial processes: the pid they must have as parent
# (the child ends with it, even on a kill -9).
PARENT_PID_VAR = "TRAINOPT_PARENT_PID"
# Set for the fork server: the orchestrator's pid, which its watchdog follows.
FORKSERVER_PARENT_VAR = "TRAINOPT_LAUNCHER_PARENT"
# The core count of the slot a process runs in (threads follow it).
SLOT_CPUS_VAR = "TRAINOPT_SLOT_CPUS"
# Where ``TORCHRUN_MODULE`` writes the failed ranks' exit codes.
LAUNCH_STATUS_VAR = "TRAINOPT_LAUNCH_STATUS"


def checkout_root() -> Path:
    """The folder that holds the ``trainopt`` package (a checkout, or site-packages)."""
    return Path(__file__).resolve().parents[2]


def child_environment(base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a trainopt child process: ``base`` (this one's) plus ``extra``.

    The child must import this trainopt even when it is not installed (tests, checkouts),
    so the package's folder goes first on ``PYTHONPATH``; its output is unbuffered, so a
    log shows everything up to a crash.
    """
    env = dict(os.environ if base is None else base)
    env.update(extra or {})
    root = str(checkout_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
