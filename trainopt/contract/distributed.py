"""The data-parallel job a trial runs as, as plain data: the spec's ``distributed`` block.

How many ranks, which backend, the torchrun command, the effective batch, how many
threads each rank gets, and how the ranks' figures combine. The rank side
(``trainopt.trial.ddp_rank``), the launcher side (``trainopt.execute.ddp_launch``), the production settings and
the exports read these. What each ``ddp_*`` knob means in PyTorch is written in
``trainopt.knobs.kwargs`` with the other knobs; where it applies, in ``trainopt.knobs.catalog``.
Nothing here imports torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

__all__ = [
    "rank_status_path",
    "launch_status_path",
    "BACKENDS",
    "world_size",
    "resolve_backend",
    "effective_batch",
    "divisor_fix",
    "grad_accum_for",
    "rank_threads",
    "torchrun_args",
    "launch_command",
    "combine_ranks",
]

BACKENDS = ("auto", "nccl", "gloo")



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
    from trainopt.stats import intervals as stats

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


# ---- the files a data-parallel trial leaves beside its result ---------------------------


def _stem(result_path: str | Path) -> Path:
    path = Path(result_path)
    return path.with_name(path.name.removesuffix(".json").removesuffix(".result"))


def rank_status_path(result_path: str | Path, rank: int) -> Path:
    """Where rank ``rank`` writes its status: beside the result, ``<stem>.rank<N>.json``."""
    stem = _stem(result_path)
    return stem.with_name(f"{stem.name}.rank{int(rank)}.json")


def launch_status_path(result_path: str | Path) -> Path:
    """Where the launcher records failed ranks: ``<stem>.launch.json``."""
    stem = _stem(result_path)
    return stem.with_name(f"{stem.name}.launch.json")


def divisor_fix(eff: int, batch_size: int, field: str) -> str:
    """How to make ``batch_size`` x ``field`` equal ``eff``: the value to set, or the batch sizes that divide it."""
    if eff % batch_size == 0:
        return f"set {field} to {eff // batch_size} (= {eff} / batch_size {batch_size})"
    divisors = [d for d in range(1, min(eff, 4096) + 1) if eff % d == 0]
    shown = ", ".join(str(d) for d in divisors[:12]) + (", ..." if len(divisors) > 12 else "")
    return f"batch_size {batch_size} does not divide {eff}; use a batch_size that does ({shown})"
