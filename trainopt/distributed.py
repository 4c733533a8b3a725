"""What a data-parallel (DDP) trial means, as plain data: the one place for the DDP knobs.

The rank side (``trainopt.ddp``), the launcher side (``trainopt.launch``), the production
settings (``TrainSettings.wrap_ddp``) and the exports all read the DDP knobs through these
functions, so a knob's meaning (which ``DistributedDataParallel`` argument it sets, what
the launch command is, how large the effective batch is) is written once. Nothing here
imports torch.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

__all__ = [
    "BACKENDS",
    "DDP_KNOBS",
    "world_size",
    "resolve_backend",
    "ddp_kwargs",
    "sampler_kwargs",
    "effective_batch",
    "grad_accum_for",
    "rank_threads",
    "torchrun_args",
    "launch_command",
    "not_applicable_reason",
    "combine_ranks",
]

BACKENDS = ("auto", "nccl", "gloo")

# knob -> the DistributedDataParallel keyword it sets. A knob at None keeps PyTorch's default.
DDP_KNOBS: dict[str, str] = {
    "ddp_bucket_cap_mb": "bucket_cap_mb",
    "ddp_gradient_as_bucket_view": "gradient_as_bucket_view",
    "ddp_static_graph": "static_graph",
    "ddp_find_unused_parameters": "find_unused_parameters",
    "ddp_broadcast_buffers": "broadcast_buffers",
}

# The values that leave DistributedDataParallel exactly as its defaults do; a single-process
# trial can only run these (anything else would be a silent no-op there).
DDP_DEFAULTS: dict[str, Any] = {
    "ddp_bucket_cap_mb": None,
    "ddp_gradient_as_bucket_view": False,
    "ddp_static_graph": False,
    "ddp_find_unused_parameters": False,
    "ddp_broadcast_buffers": True,
}


def world_size(distributed: Mapping[str, Any] | None) -> int:
    """Processes per trial: ``nproc_per_node`` of the spec's ``distributed`` block, else 1."""
    if not distributed:
        return 1
    return int(distributed.get("nproc_per_node", 1))


def resolve_backend(backend: str, device_type: str) -> str:
    """The process-group backend: ``auto`` is nccl on CUDA and gloo elsewhere.

    Raises:
        ValueError: nccl asked for on a device that is not CUDA.
    """
    if backend == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if backend == "nccl" and device_type != "cuda":
        raise ValueError(
            f"distributed.backend: 'nccl' needs CUDA devices but this trial runs on {device_type}; use auto or gloo"
        )
    return backend


def ddp_kwargs(settings: Mapping[str, Any], forward_sync_buffers: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``DistributedDataParallel`` (``device_ids`` aside).

    Every DDP knob is written out, also at its default, so the trial, ``wrap_ddp`` and the
    exports pass the same arguments; ``bucket_cap_mb`` is left out at null (PyTorch's 25 MB).

    Args:
        settings: Every knob's value.
        forward_sync_buffers: PyTorch renamed the per-forward buffer broadcast from
            ``broadcast_buffers`` to ``forward_sync_buffers`` (2.13 warns on the old name);
            true to use the new name. Both sync buffers at every forward when true, which
            is what the knob measures; the new one also always syncs them once at wrap time.
    """
    out: dict[str, Any] = {}
    for knob, kwarg in DDP_KNOBS.items():
        value = settings.get(knob, DDP_DEFAULTS[knob])
        if knob == "ddp_bucket_cap_mb" and value is None:
            continue
        if knob == "ddp_broadcast_buffers" and forward_sync_buffers:
            kwarg = "forward_sync_buffers"
        out[kwarg] = value
    return out


def sampler_kwargs(seed: int = 0) -> dict[str, Any]:
    """Keyword arguments for ``DistributedSampler`` as measured (world size and rank come from the group).

    ``drop_last`` keeps every rank's batches the same shape and count, as the single-process
    loader's ``drop_last`` does; shuffling moves to the sampler (the loader gets no ``shuffle``).
    """
    return {"shuffle": True, "drop_last": True, "seed": seed}


def effective_batch(settings: Mapping[str, Any], world: int = 1) -> int:
    """Samples per optimizer step across all ranks: batch_size x grad_accum x world size."""
    return int(settings["batch_size"]) * int(settings["grad_accum"]) * int(world)


def grad_accum_for(effective: int, batch_size: int, world: int = 1) -> int | None:
    """The grad_accum that keeps ``effective`` fixed at this per-rank batch, or None when none does."""
    per_step = batch_size * world
    if per_step <= 0 or effective % per_step:
        return None
    return effective // per_step


def rank_threads(threads: int | None, nproc: int, cpu_count: int | None = None) -> int:
    """CPU threads for each rank: the ``threads`` knob, else this machine's cores shared out.

    torchrun sets OMP_NUM_THREADS=1 when it is unset, which would make every DDP trial
    single-threaded without anyone choosing it; trainopt always says how many.
    """
    if threads is not None:
        return int(threads)
    cores = cpu_count if cpu_count is not None else (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    return max(1, int(cores or 1) // max(1, nproc))


def torchrun_args(nproc: int) -> list[str]:
    """torchrun's options for one single-node trial.

    ``--standalone`` starts a local rendezvous on a free port, so trials running at the same
    time never share one; ``--max-restarts=0`` because a restarted rank would measure a
    different run.
    """
    return ["--standalone", "--nnodes=1", f"--nproc-per-node={int(nproc)}", "--max-restarts=0"]


def launch_command(nproc: int, script: str = "train.py") -> str:
    """The shell command that runs a training script as measured (for exports and docs)."""
    return "torchrun " + " ".join(torchrun_args(nproc)) + f" {script}"


def not_applicable_reason(settings: Mapping[str, Any], world: int | None) -> str | None:
    """Why the DDP knobs in ``settings`` cannot apply, or None when they can.

    Args:
        settings: Every knob's value.
        world: Processes per trial, or None when the spec has no ``distributed`` block.
    """
    if world is None:
        for knob, default in DDP_DEFAULTS.items():
            if settings.get(knob, default) != default:
                return (
                    f"{knob} applies to data-parallel trials only; add a 'distributed: {{nproc_per_node: N}}' "
                    f"block to the spec to measure it"
                )
        return None
    if settings.get("ddp_static_graph") and settings.get("grad_accum", 1) > 1:
        # Verified on torch 2.13: the second backward after no_sync() trips
        # "expect_autograd_hooks_ INTERNAL ASSERT FAILED" in reducer.cpp (pytorch#143580).
        return (
            "ddp_static_graph with grad_accum > 1 fails inside PyTorch: accumulation steps run under "
            "no_sync(), which static_graph does not support (pytorch#143580)"
        )
    return None


def combine_ranks(per_rank: list[Mapping[str, Any]], window_steps: int, samples_per_step: int) -> dict[str, Any]:
    """Global figures of a DDP measurement from every rank's window times.

    Every rank timed the same windows between the same barriers, so window ``i`` lasted as
    long as its slowest rank's clock says, and all ranks together trained
    ``world x window_steps x samples_per_step`` samples in it. The warm-up cut is chosen on
    that global series and applied to every rank.

    Args:
        per_rank: One entry per rank, in rank order: ``rank``, ``window_times``,
            ``window_waits`` (seconds per window) and ``peak_memory_bytes``.
        window_steps: Optimizer steps per window (the same on every rank).
        samples_per_step: Samples one rank trains per optimizer step.

    Returns:
        ``windows``, ``steady_from``, ``steady``, ``samples_per_s``, ``step_time_s``,
        ``data_wait_fraction`` (the mean over ranks), ``peak_memory_bytes`` (the worst rank's)
        and ``per_rank`` (each rank's own throughput, peak memory and data-wait share).
    """
    from trainopt import stats

    world = len(per_rank)
    n = min(len(r["window_times"]) for r in per_rank)
    longest = [max(r["window_times"][i] for r in per_rank) for i in range(n)]
    rank_samples = window_steps * samples_per_step
    windows = [world * rank_samples / t for t in longest]
    cut = stats.steady_state(windows)
    kept = range(cut.start, n)
    kept_time = sum(longest[i] for i in kept)
    kept_steps = window_steps * len(kept)
    ranks = []
    for r in per_rank:
        own_time = sum(r["window_times"][i] for i in kept)
        ranks.append(
            {
                "rank": r["rank"],
                "samples_per_s": kept_steps * samples_per_step / own_time,
                "peak_memory_bytes": r.get("peak_memory_bytes"),
                "data_wait_fraction": sum(r["window_waits"][i] for i in kept) / own_time,
            }
        )
    peaks = [r.get("peak_memory_bytes") for r in per_rank if r.get("peak_memory_bytes") is not None]
    return {
        "windows": windows,
        "steady_from": cut.start,
        "steady": cut.steady,
        "samples_per_s": world * kept_steps * samples_per_step / kept_time,
        "step_time_s": kept_time / kept_steps,
        "data_wait_fraction": sum(r["data_wait_fraction"] for r in ranks) / world,
        "peak_memory_bytes": max(peaks) if peaks else None,
        "per_rank": ranks,
    }
