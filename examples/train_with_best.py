"""Train a ResNet-18 on synthetic images with the settings a search found.

Usage::

    python examples/train_with_best.py runs/resnet/best.yaml --steps 200
    python examples/train_with_best.py best.yaml --steps 4 --report-json report.json

This is the pattern to copy into a real training script: load ``best.yaml``, let
``TrainSettings`` set up the loader, model, optimizer and precision, and keep the
measured loss-logging cadence. ``--report-json`` records what was actually in effect
(loader, backend flags, autocast dtype, memory format, loss), to check the settings really applied.

Settings measured data-parallel (a ``distributed:`` block in best.yaml) train the same way
under torchrun: each process joins the job (``s.init_distributed()``), reads its shard
through a ``DistributedSampler``, gets its model wrapped in ``DistributedDataParallel`` by
``s.prepare_model`` and skips the gradient all-reduce on accumulation steps
(``s.no_sync``). Started without torchrun, the script starts itself under torchrun with
the measured number of processes (``s.launch_command()`` names the command); rank 0
prints and writes the report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from trainopt import load_settings
from trainopt.contract.distributed import torchrun_args
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


def train(args: argparse.Namespace, s) -> dict | None:
    """Train for ``args.steps`` optimizer steps; return what was in effect (None on ranks other than 0)."""
    s.init_distributed()  # joins the torchrun job for data-parallel settings; nothing otherwise
    rank = torch.distributed.get_rank() if s.distributed else 0
    if s.lr_scale_hint and rank == 0:
        print(f"note: {s.lr_scale_hint}", file=sys.stderr)
    s.apply_backend_flags()
    torch.manual_seed(args.seed)

    shape = (3, args.image_size, args.image_size)
    dataset = SyntheticImages(size=args.dataset_size, shape=shape, num_classes=10, seed=args.seed)
    sampler = None
    if s.distributed:
        # Each process reads its own shard; the sampler shuffles, as measured.
        sampler = torch.utils.data.DistributedSampler(dataset, **s.sampler_kwargs(args.seed))
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, **s.dataloader_kwargs())
    else:
        loader = torch.utils.data.DataLoader(
            dataset,
            shuffle=True,
            generator=torch.Generator().manual_seed(args.seed),
            **s.dataloader_kwargs(),
        )
    if len(loader) == 0:
        raise UserError(
            f"--dataset-size {args.dataset_size} is smaller than batch_size {s.settings['batch_size']} per process; "
            f"raise --dataset-size"
        )
    net = resnet18(num_classes=10, width=args.width, input_shape=shape)
    model = s.prepare_model(net)  # wrapped in DistributedDataParallel for data-parallel settings
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9, **s.optimizer_kwargs())
    loss_fn = nn.CrossEntropyLoss()

    accum = s.settings["grad_accum"]
    total = args.steps * accum  # micro-batches
    step = 0
    epoch = 0
    optimizer_steps = 0
    autocast_dtype = None
    loss = None
    start = time.perf_counter()
    while step < total:
        if sampler is not None:
            sampler.set_epoch(epoch)  # a new shuffle every epoch
        for x, y in loader:
            x, y = s.to_device(x, y)
            # Accumulation steps skip DDP's all-reduce; a no-op for one process.
            with s.no_sync(step):
                with s.autocast():
                    out = model(x)
                    loss = loss_fn(out, y)
                if s.backward_and_step(loss, optimizer, step):
                    optimizer_steps += 1
            if autocast_dtype is None:
                # The classifier's output dtype shows what autocast really ran the matmuls in.
                autocast_dtype = str(out.dtype)
            if s.should_log(step):
                value = loss.item()  # every process reads its loss, as measured
                if rank == 0:
                    print(f"step {optimizer_steps}/{args.steps}  loss {value:.4f}", flush=True)
            step += 1
            if step >= total:
                break
        epoch += 1
    final_loss = float(loss.item())
    elapsed = time.perf_counter() - start
    weight = _first_conv_weight(net)
    report = {
        "best_yaml": str(args.best_yaml),
        "device": str(s.device_obj()),
        "world_size": torch.distributed.get_world_size() if s.distributed else 1,
        "ddp": isinstance(getattr(model, "_orig_mod", model), nn.parallel.DistributedDataParallel),
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "pin_memory": loader.pin_memory,
        "grad_accum": accum,
        "autocast_dtype": autocast_dtype,
        "channels_last_weights": None
        if weight is None
        else bool(weight.is_contiguous(memory_format=torch.channels_last)),
        "compiled": hasattr(model, "_orig_mod"),
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
    # DDP's reducer must be freed before the process group goes (see s.finish_distributed).
    del model, optimizer
    s.finish_distributed()
    if rank != 0:
        return None
    print(f"trained {optimizer_steps} steps in {elapsed:.1f} s; final loss {final_loss:.4f}")
    return report


def _relaunch(s, argv: list[str]) -> int:
    """Run this script under torchrun with the measured number of processes; return torchrun's exit code."""
    n = s.distributed["nproc_per_node"]
    print(f"these settings were measured data-parallel on {n} processes; starting: {s.launch_command(Path(__file__).name)}",
          file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", *torchrun_args(n), str(Path(__file__).resolve()), *argv]
    return subprocess.run(cmd).returncode


def main(argv: list[str] | None = None) -> int:
    """Run the example; returns the exit code (2 for a settings problem)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parse(argv)
    try:
        s = load_settings(args.best_yaml)
        if s.distributed and "WORLD_SIZE" not in os.environ:
            return _relaunch(s, argv)
        report = train(args, s)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.report_json and report is not None:
        Path(args.report_json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
