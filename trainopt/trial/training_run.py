"""A training-check run: train a fixed number of optimizer steps and read the loss at every one.

Not a timed trial: nothing here is measured for speed, so the loss is read on the host after
every step (a device sync) whatever ``sync_every`` says. The weights come from the spec's
seed (the workload is built the same way for every run); ``order_seed`` seeds the loader's
shuffling and every draw after the weights are made (dropout masks, random augmentation in
the main process), so two runs with one ``order_seed`` see the same batches in the same
order, and a run with another seed is what the same training gives on another day.
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["train_steps", "seed_run"]


def seed_run(order_seed: int) -> None:
    """Seed every draw a run makes after its weights exist (before the first step)."""
    torch.manual_seed(order_seed)


def train_steps(trainer: Any, steps: int, group: Any = None) -> dict[str, Any]:
    """Train ``steps`` optimizer steps; the loss of each, and what the fp16 scaler skipped.

    Args:
        trainer: A ``trainopt.trial.measure.Trainer`` built with the run's ``order_seed``.
        steps: Optimizer steps to take.
        group: For a data-parallel run, the rank's ``RankGroup``: each step's loss is then the
            mean over the ranks (each rank's batch is a shard of the global one).

    Returns:
        ``losses`` (one per step; a non-finite loss is recorded as None and ends the run,
        since every step after it would be NaN too) and ``scaler_skipped`` (fp16: steps whose
        inf/NaN gradients the GradScaler skipped, seen as a fall of its scale; None otherwise).
    """
    scaler = trainer.applier.grad_scaler
    losses: list[float | None] = []
    skipped = 0 if scaler is not None else None
    for _ in range(steps):
        before = float(scaler.get_scale()) if scaler is not None else None
        loss = trainer.step()
        value = float(loss.item())
        if group is not None:
            value = group.mean(value)
        if scaler is not None and float(scaler.get_scale()) < before:
            # The scale falls only on a step skipped for inf/NaN gradients (it grows otherwise).
            skipped += 1
        if not math.isfinite(value):
            losses.append(None)
            break
        losses.append(value)
    return {"losses": losses, "scaler_skipped": skipped}
