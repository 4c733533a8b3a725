"""One rank of a data-parallel trial: ``torchrun ... -m trainopt.trial.ddp_rank REQUEST.json``.

Every rank builds the same workload (same seed); the applier (``trainopt.trial.applier``) wraps
the model in ``DistributedDataParallel`` with the DDP knobs' arguments and gives the
loader this rank's ``DistributedSampler``; every rank runs the same timed loop as a single-process trial with the
window edges bounded by barriers (``measure.measure_throughput(group=...)``). The ranks'
window times are gathered to rank 0, which writes the one ``TrialResult``.

A diagnosed request also has every rank profile where its steps' time goes after the timed
windows (``trainopt.trial.breakdown``): each ``per_rank`` entry carries its rank's
``breakdown``, and the trial's ``breakdown`` is the slowest rank's, naming it (``rank``).
The gradients' all-reduce runs inside backward, so time a rank spends waiting for its
peers shows in its ``backward`` phase.

Every rank also writes a small status file beside the result (``distributed.rank_status_path``):
its pid when it starts (so the orchestrator can stop its loader workers), and how it ended
when it can see it (``done``, or ``failed`` with ``oom``/``nonfinite``/``error``). A rank
that fails exits with code 1, so torchrun tears the other ranks down at once instead of
leaving them waiting in a collective until the trial's time limit.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainopt.atomic import write_json_atomic
from trainopt.contract import distributed
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.knobs import catalog as knobs
from trainopt.trial.faults import fault_status
from trainopt.trial.lifeline import die_with_parent
from trainopt.trial.memory import cap_memory
from trainopt.trial.worker import fill_result

__all__ = ["RankGroup", "run_rank", "slowest_rank", "main"]


class RankGroup:
    """This rank's view of the process group: the collectives the timed loop needs.

    (Wrapping the model and sampling the data are the applier's, ``trainopt.trial.applier``.)

    Args:
        rank: Global rank.
        world: Number of ranks.
        device: This rank's torch.device.
    """

    def __init__(self, rank: int, world: int, device: torch.device):
        self.rank = rank
        self.world = world
        self.device = device
        # nccl reduces CUDA tensors only; gloo CPU tensors.
        self._tensor_device = device if dist.get_backend() == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        """Wait until every rank arrives."""
        if self.device.type == "cuda":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()

    def _reduce_max(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self._tensor_device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def mean(self, value: float) -> float:
        """The mean of ``value`` over all ranks."""
        t = torch.tensor([value], dtype=torch.float64, device=self._tensor_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return float(t.item()) / self.world

    def any(self, flag: bool) -> bool:
        """True on every rank when it is true on any."""
        return self._reduce_max(1.0 if flag else 0.0) > 0.5

    def max(self, value: float) -> float:
        """The largest ``value`` over all ranks."""
        return self._reduce_max(value)

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0 (in rank order); None on other ranks."""
        out = [None] * self.world if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out


def _rank_device(spec_device: str, local_rank: int) -> torch.device:
    from trainopt.trial.applier import resolve_device

    device = resolve_device(spec_device)
    # One accelerator per rank, as torchrun jobs use them: rank i on cuda:LOCAL_RANK.
    return torch.device("cuda", local_rank) if device.type == "cuda" else device


def slowest_rank(gathered: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The breakdown of the rank whose profiled window took longest, naming that rank (``rank``).

    Every rank's window starts at one barrier and the all-reduce in backward couples the
    ranks, so their walls differ by what the slowest did that its peers waited for.
    """
    timed = [g for g in gathered if g.get("breakdown")]
    if not timed:
        return None
    slowest = max(timed, key=lambda g: (g["breakdown"]["wall_s"], -g["rank"]))
    return {**slowest["breakdown"], "rank": slowest["rank"]}


def _diagnose(request: TrialRequest, trainer, window_steps: int, group: RankGroup) -> tuple[dict | None, dict | None]:
    """This rank's profiled window, and on rank 0 the run costs while the others wait.

    Every rank profiles the same number of steps (the window length is the same on all), so
    the all-reduces of backward pair up. Rank 0 alone saves the checkpoint, as training
    scripts do, and evaluates on the unwrapped model: DistributedDataParallel's forward may
    broadcast buffers, a collective the waiting ranks would not join. A rank whose profiled
    window fails in the middle of a step leaves its peers waiting in that step's all-reduce;
    the trial then ends at its time limit, as any rank stuck in a collective does.
    """
    from trainopt.trial.breakdown import profile_or_none
    from trainopt.trial.run_costs import run_costs_or_none

    breakdown = profile_or_none(trainer, request.spec["measure"], window_steps, group=group)
    run_costs = None
    if request.spec.get("run_costs"):
        if group.rank == 0:
            run_costs = run_costs_or_none(trainer, request.spec["run_costs"], Path(request.result_path).parent,
                                          forward=trainer.model)
        group.barrier()
    return breakdown, run_costs


def run_rank(request: TrialRequest, rank: int, world: int, local_rank: int) -> tuple[TrialResult, bool]:
    """Run this rank's part of the trial.

    Returns:
        The result (rank 0's is the trial's; others carry only their own status), and
        whether this rank itself failed (so it must exit non-zero to stop its peers).
    """
    from trainopt.trial import environment as fingerprint
    from trainopt.trial.measure import (
        NonFiniteLoss,
        Trainer,
        measure_throughput,
        probe_memory,
    )
    from trainopt.trial.probe_items import largest_items
    from trainopt.trial.workload_record import workload_record
    from trainopt.trial.workloads import build_workload

    settings = dict(request.settings)
    spec = request.spec
    seed = int(spec.get("seed", 0))
    result = TrialResult(status="error", settings=settings, mode=request.mode, world_size=world)
    try:
        device = _rank_device(spec.get("device", "auto"), local_rank)
        backend = distributed.resolve_backend(spec["distributed"].get("backend", "auto"), device.type)
        result.backend = backend
        result.env = fingerprint.environment(device)
        reason = knobs.not_applicable_reason(settings, device.type, world)
        if reason:
            result.status, result.error = "not_applicable", reason
            return result, False
        torch.set_num_threads(distributed.rank_threads(settings["threads"], world))
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # Longer than the trial's own limit: a hung collective is the runner's to stop (as a
        # timeout, killing every rank), not a library error on one rank.
        limit = float(spec["measure"]["trial_timeout_s"]) + 60
        dist.init_process_group(backend, timeout=timedelta(seconds=limit))
        group = RankGroup(rank, world, device)
        # The first collective starts the backend's threads and buffers; capped after it, as
        # the single-process worker caps after importing torch, so the cap bounds training.
        group.barrier()
        cap_memory(request.memory_gb, device)
        torch.manual_seed(seed)
        workload = build_workload(spec, Path(request.source_dir))
        reason = knobs.channels_last_reason(settings, workload.image_like)
        if reason:
            result.status, result.error = "not_applicable", reason
            return result, False
        if request.mode == "probe":
            # As in a single-process probe: each rank's batch holds the largest items sampled,
            # so the worst rank's peak is production's worst batch.
            workload.dataset, result.probe_items = largest_items(
                workload.dataset, settings["batch_size"], seed=seed, copies=world)
        if request.mode == "train":
            return _train(request, result, workload, settings, device, group), False
        trainer = Trainer(workload, settings, device, seed=seed, ddp=group)
        result.env["torch_threads"] = torch.get_num_threads()
        if request.mode == "probe":
            m = probe_memory(trainer)
        else:
            cfg = spec["measure"]
            m = measure_throughput(
                trainer, cfg["warmup_steps"], cfg["warmup_seconds"], cfg["window_seconds"], cfg["windows"], group=group
            )
        diagnose = request.diagnose and request.mode == "measure"
        breakdown = run_costs = None
        if diagnose:
            breakdown, run_costs = _diagnose(request, trainer, m.window_steps, group)
        own = {
            "rank": rank,
            "window_times": m.window_times,
            "window_waits": m.window_waits,
            "peak_memory_bytes": m.peak_memory_bytes,
            "breakdown": breakdown,
        }
        gathered = group.gather(own)
        if rank == 0:
            if m.window_times:
                combined = distributed.combine_ranks(gathered, m.window_steps, trainer.samples_per_step)
                per_rank = combined.pop("per_rank")
                if diagnose:
                    for entry, mine in zip(per_rank, gathered):
                        entry["breakdown"] = mine["breakdown"]
                    result.breakdown = slowest_rank(gathered)
                    result.run_costs = run_costs
                m = dataclasses.replace(m, **combined)
            else:
                # A probe: the worst rank's peak decides whether the batch fits.
                peaks = [g["peak_memory_bytes"] for g in gathered if g["peak_memory_bytes"] is not None]
                m = dataclasses.replace(m, peak_memory_bytes=max(peaks) if peaks else None)
                per_rank = [{"rank": g["rank"], "peak_memory_bytes": g["peak_memory_bytes"]} for g in gathered]
            fill_result(result, m, trainer.dataset_len)
            result.per_rank = per_rank
            result.workload = workload_record(workload.loss_form, spec, trainer.optimizer, workload.fields)
        else:
            result.status = "ok"
        return result, False
    except NonFiniteLoss as exc:
        result.status, result.error = "nonfinite", str(exc)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every fault becomes a status
        traceback.print_exc()
        result.status, result.error = fault_status(exc)
    return result, True


def _train(request: TrialRequest, result: TrialResult, workload: Any, settings: dict[str, Any], device: torch.device,
           group: RankGroup) -> TrialResult:
    """A training-check run on every rank; rank 0's result holds the mean loss over the ranks at each step."""
    from trainopt.trial.measure import Trainer
    from trainopt.trial.training_run import seed_run, train_steps

    order_seed = int(request.training["order_seed"])
    trainer = Trainer(workload, settings, device, seed=order_seed, ddp=group)
    seed_run(order_seed)
    result.training = {**train_steps(trainer, int(request.training["steps"]), group=group), "order_seed": order_seed}
    result.status = "ok"
    result.dataset_len = trainer.dataset_len
    return result


def _write_status(path: Path, **fields: Any) -> None:
    write_json_atomic(path, {"pid": os.getpid(), "time": time.time(), **fields})


def main(argv: list[str] | None = None) -> int:
    """Run one rank of the request named on the command line (torchrun sets RANK and WORLD_SIZE)."""
    argv = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    # A rank ends with its torchrun agent, which ends with the orchestrator.
    die_with_parent()
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    request = TrialRequest.from_json(Path(argv[0]).read_text())
    status_path = distributed.rank_status_path(request.result_path, rank)
    _write_status(status_path, rank=rank, state="started")
    result, failed = run_rank(request, rank, world, local_rank)
    if failed:
        print(f"trainopt.trial.ddp_rank: rank {rank} of {world}: {result.status}: {result.error}", file=sys.stderr)
        _write_status(status_path, rank=rank, state="failed", status=result.status, error=result.error)
    elif rank == 0:
        result.wall_s = time.perf_counter() - start
        write_json_atomic(request.result_path, result.to_dict())
    if not failed:
        _write_status(status_path, rank=rank, state="done", status=result.status)
    sys.stdout.flush()
    sys.stderr.flush()
    # As in the single-process worker: no interpreter teardown (loader workers, process
    # group shutdown) that could hang a finished rank. A failed rank exits 1 so torchrun
    # stops its peers instead of leaving them blocked in a collective.
    os._exit(1 if failed else 0)


if __name__ == "__main__":
    main()
