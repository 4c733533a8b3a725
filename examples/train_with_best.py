"""Train a ResNet-18 on synthetic images with the settings a search found.

Usage::

    python examples/train_with_best.py runs/resnet/best.yaml --steps 200
    python examples/train_with_best.py best.yaml --steps 4 --report-json report.json

This is the pattern to copy into a real training script: load ``best.yaml``, let
``TrainSettings`` set up the loader, model, optimizer and precision, and keep the
measured loss-logging cadence. ``--report-json`` records what was actually in effect
(loader, backend flags, autocast dtype, memory format, loss), to check the settings really applied.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch import nn

from trainopt import load_settings
from trainopt.errors import UserError
from trainopt.trial.workloads.data import SyntheticImages
from trainopt.trial.workloads.models import resnet18

__all__ = ["main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("best_yaml", help="best.yaml written by `trainopt search` (or by hand)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps to train (default 100)")
    p.add_argument("--report-json", help="write what was in effect and the final loss to this JSON file")
    p.add_argument("--image-size", type=int, default=32, help="image side in pixels (default 32)")
    p.add_argument("--width", type=int, default=64, help="channels of the first ResNet stage (default 64)")
    p.add_argument("--dataset-size", type=int, default=2048, help="samples per epoch (default 2048)")
    p.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (default 0.01)")
    p.add_argument("--seed", type=int, default=0, help="seed for the model and the shuffling (default 0)")
    args = p.parse_args(argv)
    for name in ("steps", "image_size", "width", "dataset_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    return args


def _first_conv_weight(model: nn.Module) -> torch.Tensor | None:
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            return module.weight
    return None


def train(args: argparse.Namespace) -> dict:
    """Train for ``args.steps`` optimizer steps; return what was in effect."""
    s = load_settings(args.best_yaml)
    if s.lr_scale_hint:
        print(f"note: {s.lr_scale_hint}", file=sys.stderr)
    s.apply_backend_flags()
    torch.manual_seed(args.seed)

    shape = (3, args.image_size, args.image_size)
    dataset = SyntheticImages(size=args.dataset_size, shape=shape, num_classes=10, seed=args.seed)
    loader = torch.utils.data.DataLoader(
        dataset,
        shuffle=True,
        generator=torch.Generator().manual_seed(args.seed),
        **s.dataloader_kwargs(),
    )
    if len(loader) == 0:
        raise UserError(
            f"--dataset-size {args.dataset_size} is smaller than batch_size {s.settings['batch_size']}; "
            f"raise --dataset-size"
        )
    net = resnet18(num_classes=10, width=args.width, input_shape=shape)
    model = s.prepare_model(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, **s.optimizer_kwargs())
    loss_fn = nn.CrossEntropyLoss()

    accum = s.settings["grad_accum"]
    total = args.steps * accum  # micro-batches
    step = 0
    optimizer_steps = 0
    autocast_dtype = None
    loss = None
    start = time.perf_counter()
    while step < total:
        for x, y in loader:
            x, y = s.to_device(x, y)
            with s.autocast():
                out = model(x)
                loss = loss_fn(out, y)
            if autocast_dtype is None:
                # The classifier's output dtype shows what autocast really ran the matmuls in.
                autocast_dtype = str(out.dtype)
            if s.backward_and_step(loss, optimizer, step):
                optimizer_steps += 1
            if s.should_log(step):
                print(f"step {optimizer_steps}/{args.steps}  loss {loss.item():.4f}", flush=True)
            step += 1
            if step >= total:
                break
    final_loss = float(loss.item())
    elapsed = time.perf_counter() - start
    weight = _first_conv_weight(net)
    print(f"trained {optimizer_steps} steps in {elapsed:.1f} s; final loss {final_loss:.4f}")
    return {
        "best_yaml": str(args.best_yaml),
        "device": str(s.device_obj()),
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "pin_memory": loader.pin_memory,
        "grad_accum": accum,
        "autocast_dtype": autocast_dtype,
        "channels_last_weights": None
        if weight is None
        else bool(weight.is_contiguous(memory_format=torch.channels_last)),
        "compiled": model is not net,
        "backend_flags": {
            "cudnn.benchmark": torch.backends.cudnn.benchmark,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
        },
        "optimizer_steps": optimizer_steps,
        "steps": optimizer_steps,
        "micro_batches": step,
        "final_loss": final_loss,
        "final_loss_finite": math.isfinite(final_loss),
        "elapsed_s": elapsed,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the example; returns the exit code (2 for a settings problem)."""
    args = _parse(argv)
    try:
        report = train(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.report_json:
        Path(args.report_json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
