"""Entry point of a trial process: ``python -m trainopt.trial.worker REQUEST.json``.

It reads one ``TrialRequest``, builds the workload, applies the knobs, measures, and
writes exactly one ``TrialResult`` to the requested path. Every failure it can see is
turned into an explicit status here (oom, nonfinite, error, not_applicable); failures it
cannot see (a segfault, a hang) are classified by the runner from the outside.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

from trainopt.atomic import write_json_atomic
from trainopt.contract import slots
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.knobs import catalog as knobs
from trainopt.stats import intervals as stats
from trainopt.trial.faults import fault_status
from trainopt.trial.lifeline import die_with_parent, expected_parent
from trainopt.trial.memory import cap_memory

__all__ = ["execute", "fill_result", "main"]


def fill_result(result: TrialResult, m, dataset_len: int | None) -> None:
    """Copy a ``Measurement``'s figures into ``result`` and mark it ok (also used by DDP rank 0)."""
    summary = stats.summarize_windows(m.windows[m.steady_from:]) if m.windows else {}
    result.status = "ok"
    result.samples_per_s = m.samples_per_s
    result.windows = m.windows
    result.window_steps = m.window_steps
    result.steady_from = m.steady_from
    result.steady = m.steady
    result.median = summary.get("median")
    result.iqr = summary.get("iqr")
    result.step_time_s = m.step_time_s
    result.data_wait_fraction = m.data_wait_fraction
    result.peak_memory_bytes = m.peak_memory_bytes
    result.warmup_s = m.warmup_s
    result.compile_s = m.compile_s
    result.first_step_s = m.first_step_s
    result.first_loss = m.first_loss
    result.last_loss = m.last_loss
    result.steps = m.steps
    result.dataset_len = dataset_len
    result.grad_scaler = m.grad_scaler


def _diagnose(result: TrialResult, request: TrialRequest, trainer, window_steps: int) -> None:
    """After the timed windows: where a step's time goes, and what checkpoints and evaluation cost.

    Each part records None (and its reason in the log) when it fails; the measured figures
    already in ``result`` stand.
    """
    from trainopt.trial.breakdown import profile_or_none
    from trainopt.trial.run_costs import run_costs_or_none

    result.breakdown = profile_or_none(trainer, request.spec["measure"], window_steps)
    result.run_costs = run_costs_or_none(trainer, request.spec.get("run_costs"), Path(request.result_path).parent)


def _train(request: TrialRequest, result: TrialResult, workload, settings: dict, device) -> None:
    """A training-check run (mode ``train``): the loss at every step into ``result.training``."""
    import torch

    from trainopt.trial.measure import Trainer
    from trainopt.trial.training_run import seed_run, train_steps

    order_seed = int(request.training["order_seed"])
    trainer = Trainer(workload, settings, device, seed=order_seed)
    result.env["torch_threads"] = torch.get_num_threads()
    seed_run(order_seed)
    result.training = {**train_steps(trainer, int(request.training["steps"])), "order_seed": order_seed}
    result.status = "ok"


def execute(request: TrialRequest) -> TrialResult:
    """Run one trial in this process and return its result (never raises for trial faults)."""
    import torch

    from trainopt.trial import environment as fingerprint
    from trainopt.trial.applier import resolve_device
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
    result = TrialResult(status="error", settings=settings, mode=request.mode)
    if request.spec.get("distributed"):
        # Measuring a data-parallel spec in one process would report a different job.
        result.error = "a spec with a distributed block runs each trial under torchrun (trainopt.trial.ddp_rank), not trainopt.trial.worker"
        return result
    try:
        device = resolve_device(request.spec.get("device", "auto"))
        result.env = fingerprint.environment(device)
        result.env["cpu_set"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        reason = knobs.not_applicable_reason(settings, device.type) or slots.threads_reason(
            settings.get("threads"), slots.slot_cpus_from_env(os.environ))
        if reason:
            result.status, result.error = "not_applicable", reason
            return result
        cap_memory(request.memory_gb, device)
        torch.manual_seed(int(request.spec.get("seed", 0)))
        workload = build_workload(request.spec, Path(request.source_dir))
        reason = knobs.channels_last_reason(settings, workload.image_like)
        if reason:
            result.status, result.error = "not_applicable", reason
            return result
        dataset_len = len(workload.dataset)
        if request.mode == "probe":
            # The probe must fit the largest items a production batch may hold, not an average batch.
            workload.dataset, result.probe_items = largest_items(
                workload.dataset, settings["batch_size"], seed=int(request.spec.get("seed", 0)))
        if request.mode == "train":
            _train(request, result, workload, settings, device)
            result.dataset_len = dataset_len
            return result
        trainer = Trainer(workload, settings, device, seed=int(request.spec.get("seed", 0)))
        result.env["torch_threads"] = torch.get_num_threads()
        if request.mode == "probe":
            m = probe_memory(trainer)
        else:
            cfg = request.spec["measure"]
            m = measure_throughput(
                trainer, cfg["warmup_steps"], cfg["warmup_seconds"], cfg["window_seconds"], cfg["windows"]
            )
        fill_result(result, m, dataset_len)
        result.workload = workload_record(workload.loss_form, request.spec, trainer.optimizer, workload.fields)
        result.loss_note = getattr(trainer.compute_loss, "note", None)
        if result.loss_note:
            print(result.loss_note, file=sys.stderr)  # the trial log says it too
        if request.diagnose and request.mode == "measure":
            _diagnose(result, request, trainer, m.window_steps)
    except NonFiniteLoss as exc:
        result.status, result.error = "nonfinite", str(exc)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every fault becomes a status, never a lost result
        # The user's traceback goes to the trial log; the result keeps its last line.
        traceback.print_exc()
        result.status, result.error = fault_status(exc)
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the request named on the command line; always try to write a result."""
    argv = sys.argv[1:] if argv is None else argv
    start = time.perf_counter()
    die_with_parent(parent=expected_parent())
    request = TrialRequest.from_json(Path(argv[0]).read_text())
    result = execute(request)
    result.wall_s = time.perf_counter() - start
    write_json_atomic(request.result_path, result.to_dict())
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: loader workers and compile caches are not needed any more,
    # and a slow or hanging teardown must not turn a finished trial into a timeout.
    os._exit(0)


if __name__ == "__main__":
    main()
