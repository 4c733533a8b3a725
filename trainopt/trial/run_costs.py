"""What the rest of a training run costs: one checkpoint save and one evaluation pass, timed.

A diagnosed trial whose spec has a ``run_costs`` section times, after its timed windows,
one ``torch.save`` of the model's and the optimizer's state (to a file beside the result,
removed at once) and one evaluation pass over the trial's own loader. The orchestrator
turns the two figures into a share of the run at the spec's frequencies
(``trainopt.decide.run_costs``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

__all__ = ["time_checkpoint", "time_evaluation", "run_costs_or_none"]


def time_checkpoint(trainer: Any, directory: str | Path, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one ``torch.save`` of the model's and the optimizer's state takes; the file is removed.

    The fp16 GradScaler's state is saved too where there is one, as a resumable checkpoint holds it.
    """
    fd, name = tempfile.mkstemp(prefix=".trainopt-checkpoint-", suffix=".pt", dir=str(directory))
    os.close(fd)
    try:
        trainer.sync()
        t0 = clock()
        state = {"model": trainer.model.state_dict(), "optimizer": trainer.optimizer.state_dict()}
        if trainer.scaler is not None:
            state["scaler"] = trainer.scaler.state_dict()
        # torch.save copies device tensors to the host: part of what a checkpoint costs.
        torch.save(state, name)
        return clock() - t0
    finally:
        Path(name).unlink(missing_ok=True)


def time_evaluation(trainer: Any, batches: int, forward: Callable[[Any], Any] | None = None,
                    clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one evaluation pass of ``batches`` batches takes, as a training loop runs it.

    ``model.eval()``, ``torch.no_grad()``, autocast as the settings say, batches from the
    trial's own loader (reading and copying them is part of evaluating), the loss summed on
    the device and read once at the end, as an evaluation that reports its loss does; then
    back to ``train()``. One untimed batch goes first: a compiled model compiles once more for
    evaluation, a cost of the run's first evaluation only.

    Args:
        trainer: The trainer of the measured settings.
        batches: Batches in the pass.
        forward: The module to call (default the trainer's own: compiled when ``compile`` is on).
        clock: The time source.
    """
    if batches < 1:
        raise ValueError(f"an evaluation pass needs at least one batch, not {batches}")
    forward = forward or trainer.forward
    applier = trainer.applier

    def one_batch():
        batch = applier.to_device(trainer.next_batch(clock))
        with applier.autocast():
            return trainer.compute_loss(forward, batch).detach().float()

    trainer.model.eval()
    try:
        with torch.no_grad():
            one_batch()
            trainer.sync()
            t0 = clock()
            total = one_batch()
            for _ in range(batches - 1):
                total = total + one_batch()
            float(total.item())
            return clock() - t0
    finally:
        trainer.model.train()


def _note(message: str) -> None:
    print(f"trainopt.trial.run_costs: {message}", file=sys.stderr, flush=True)


def run_costs_or_none(trainer: Any, costs: dict[str, Any] | None, directory: str | Path,
                      forward: Callable[[Any], Any] | None = None) -> dict[str, Any] | None:
    """The ``TrialResult.run_costs`` figures the spec asks for, or None.

    Args:
        trainer: The trainer the timed windows ran.
        costs: The spec's ``run_costs`` section: ``checkpoint_every_steps`` asks for
            ``checkpoint_s``, ``eval_every_steps`` for ``eval_s`` (with ``eval_batches``).
        directory: Where the checkpoint is written (beside the trial's result) and removed.
        forward: The module evaluation calls (default the trainer's own).

    Returns:
        ``checkpoint_s`` and/or ``eval_s`` with ``eval_batches``; None when the spec asks
        for neither, or when timing failed (the reason goes to the trial's log; the timed
        windows' figures stand either way).
    """
    if not costs or not (costs.get("checkpoint_every_steps") or costs.get("eval_every_steps")):
        return None
    out: dict[str, Any] = {}
    try:
        if costs.get("checkpoint_every_steps"):
            out["checkpoint_s"] = time_checkpoint(trainer, directory)
        if costs.get("eval_every_steps"):
            batches = int(costs.get("eval_batches") or 20)
            out["eval_s"] = time_evaluation(trainer, batches, forward)
            out["eval_batches"] = batches
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - advice only: a failure here must not cost the measurement
        import traceback

        traceback.print_exc()
        _note(f"no run costs: {type(exc).__name__}: {exc}; the timed windows' figures stand")
        return None
    return out
