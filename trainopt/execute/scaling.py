"""The search's scale-out options: ``--parallel N``, ``--ray [ADDRESS]``, ``--cpus-per-slot K``.

Parsing and choosing the executor live here so the command line and the executors stay
apart: ``add_options`` adds the flags to ``trainopt search``; ``make_executor`` turns
the parsed flags into a ``SessionExecutor``. Ray is imported only when ``--ray`` is given.
"""

from __future__ import annotations

import argparse
from typing import Any, Mapping

from trainopt.contract import slots as slotplan
from trainopt.contract.session import SessionRunner
from trainopt.errors import UserError
from trainopt.execute.executors import SerialExecutor, SessionExecutor, SlotExecutor

__all__ = ["add_options", "check_options", "make_executor", "executor_notes", "LOCAL_RAY", "ScalingError"]

# ``--ray`` without an address: start a local Ray instance.
LOCAL_RAY = "local"


class ScalingError(UserError):
    """Scale-out flags that do not go together."""


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def add_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--parallel``, ``--ray`` and ``--cpus-per-slot`` to a subcommand's parser."""
    group = parser.add_argument_group("scaling out (independent measurement sessions at once)")
    group.add_argument("--parallel", type=_positive, default=1, metavar="N",
                       help="run up to N sessions at once on this machine, one per slot: one GPU per slot, "
                            "or on CPU a disjoint set of cores per slot (default 1: one at a time)")
    group.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                       help="place sessions on a Ray cluster: 'auto' joins the cluster of `ray start`, "
                            "HOST:PORT joins that one, no address starts a local Ray instance "
                            '(needs pip install "trainopt[ray]")')
    group.add_argument("--cpus-per-slot", type=_positive, default=None, metavar="K",
                       help="with --ray: cores per slot on CPU-only nodes (default: one slot per node), "
                            "or cores each GPU slot reserves")


def check_options(args: argparse.Namespace) -> None:
    """Refuse flag combinations that make no sense, naming the fix."""
    if args.ray is not None and args.parallel != 1:
        raise ScalingError(f"--parallel {args.parallel} and --ray both choose where sessions run; with --ray the "
                           "cluster's slots decide (use --cpus-per-slot to size them), so drop --parallel")
    if args.cpus_per_slot is not None and args.ray is None:
        raise ScalingError(f"--cpus-per-slot {args.cpus_per_slot} sizes the slots of a Ray cluster and needs --ray; "
                           "on this machine --parallel N splits the cores evenly")


def make_executor(args: argparse.Namespace, device: str, *, runner_options: Mapping[str, Any] | None = None,
                  serial_runner: SessionRunner | None = None) -> SessionExecutor:
    """The executor the flags ask for.

    Args:
        args: Parsed flags (``parallel``, ``ray``, ``cpus_per_slot``).
        device: The spec's ``device``.
        runner_options: ``rounds``, ``window_seconds``, ``rewarm_steps``, ``env`` for each slot's
            ``InterleavedSessionRunner``.
        serial_runner: The session runner of a one-slot run (default: an
            ``InterleavedSessionRunner`` with ``runner_options``).

    Raises:
        UserError: Bad flag combinations, more slots than cores/GPUs, Ray missing or unreachable.
    """
    check_options(args)
    options = dict(runner_options or {})
    if args.ray is not None:
        from trainopt.execute.ray_executor import RayExecutor

        address = None if args.ray == LOCAL_RAY else args.ray
        return RayExecutor(address, args.cpus_per_slot, device=device, **options)
    if args.parallel > 1:
        return SlotExecutor(args.parallel, device=device, **options)
    if serial_runner is None:
        from trainopt.execute.session_runners import InterleavedSessionRunner

        serial_runner = InterleavedSessionRunner(**options)
    return SerialExecutor(serial_runner)


def executor_notes(executor: SessionExecutor) -> list[str]:
    """Lines to tell the user before the search starts (empty for a one-slot run)."""
    plan = getattr(executor, "plan", None)
    if isinstance(executor, SlotExecutor) and executor.slots > 1 and all(s.gpu is None for s in executor.plan):
        cores = len(executor.plan[0].cpus)
        return [f"{executor.slots} slots of {cores} core(s) each ({', '.join(s.device for s in executor.plan)}). "
                "Slots on one CPU share its memory bandwidth and caches, so a session's figures can differ from "
                "the same session alone and are noisier (pairs about 1.6x noisier on a 2-core machine, so "
                "confirmations may need more pairs); both arms of a comparison always share one slot, and the "
                "final check and the held-out sessions run with no other session beside them."]
    if isinstance(executor, SlotExecutor) and executor.slots > 1:
        return [f"{executor.slots} GPU slots: {', '.join(s.device for s in executor.plan)}.",
                *slotplan.gpu_busy_warnings(executor.plan)]
    if plan and not isinstance(executor, SlotExecutor):
        hosts = sorted({s.host for s in plan.values()})
        return [f"{executor.slots} Ray slot(s) on {len(hosts)} node(s): {', '.join(hosts)}."]
    return []
