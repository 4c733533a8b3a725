"""The one channel between the orchestrator and a trial process.

The orchestrator writes a ``TrialRequest`` as JSON; the trial process writes exactly one
``TrialResult`` as JSON (atomically) before it exits. Nothing is ever parsed from a
child's stdout. Both carry ``SCHEMA_VERSION`` so that a result written by another
version of trainopt is refused with a message instead of being misread.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from trainopt.errors import UserError

__all__ = [
    "SCHEMA_VERSION",
    "FAILED_STATUSES",
    "TrialRequest",
    "TrialResult",
    "SchemaVersionError",
    "REFCHECK_SCHEMA_VERSION",
    "REFCHECK_REQUEST_KIND",
    "REFCHECK_ANSWER_KIND",
]

SCHEMA_VERSION = 1

# The reference check (``trainopt.execute.refcheck`` asks, ``trainopt.trial.refcheck`` answers):
# request ``{kind, schema_version, source_dir, answer_path, references: [{field, ref, builtin,
# args_field, args, leading}]}``,
# answer ``{kind, schema_version, problems: [message, ...], tracebacks: bool}``.
REFCHECK_SCHEMA_VERSION = 2
REFCHECK_REQUEST_KIND = "trainopt-refcheck-request"
REFCHECK_ANSWER_KIND = "trainopt-refcheck"

# ok: measured; oom: allocator ran out of memory; timeout: killed at the time limit;
# crashed: died by a signal or exit code without a result; nonfinite: NaN/inf loss;
# error: an exception (usually in user code); not_applicable: a knob cannot apply here.
# The failed ones:
FAILED_STATUSES = ("oom", "timeout", "crashed", "nonfinite", "error")


class SchemaVersionError(UserError, ValueError):
    """A JSON document written by an incompatible schema version (re-run with this trainopt)."""


def _check_version(data: dict, what: str) -> None:
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{what} has schema version {version!r}, this trainopt reads version {SCHEMA_VERSION}"
        )


@dataclass(frozen=True)
class TrialRequest:
    """What one trial process must do.

    Attributes:
        spec: The resolved spec (plain data).
        source_dir: Folder that the spec's ``module:callable`` references resolve against.
        settings: Every knob's value for this trial.
        mode: ``measure`` (warm-up and timed windows), ``probe`` (one full training
            step, to learn whether a batch fits in memory) or ``train`` (the training check:
            ``training["steps"]`` optimizer steps from the spec's seeded weights, the loss
            read at every one, nothing timed).
        result_path: Where the trial process writes its ``TrialResult``.
        memory_gb: Memory limit for the trial, or None: on a CPU an address-space cap
            (RLIMIT_AS) on the trial process; on CUDA the device allocator's limit
            (``torch.cuda.set_per_process_memory_fraction``), since an address-space cap
            breaks the CUDA driver. Each rank of a data-parallel trial is capped alike.
        trial_id: Identifier used in logs.
        diagnose: After the timed windows, also profile where a step's time goes
            (``TrialResult.breakdown``) and, when the spec has ``run_costs``, time one
            checkpoint save and one evaluation pass (``TrialResult.run_costs``). Neither
            touches the timed windows.
        training: For ``train``: ``steps`` (optimizer steps) and ``order_seed`` (the seed of
            the data order and of every other draw after the weights are made, such as
            dropout masks: runs with the same ``order_seed`` see the same batches in the
            same order).
    """

    spec: dict[str, Any]
    source_dir: str
    settings: dict[str, Any]
    mode: str
    result_path: str
    memory_gb: float | None = None
    trial_id: str = ""
    diagnose: bool = False
    training: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "TrialRequest":
        data = json.loads(text)
        _check_version(data, "trial request")
        return cls(**data)


@dataclass
class TrialResult:
    """What one trial measured, or why it could not.

    Throughputs are samples per second. ``windows`` holds every timed window's
    throughput in order; ``steady_from`` is the index of the first window kept after
    the warm-up cut. Memory is bytes.

    A data-parallel trial reports global figures (all ranks together; ``peak_memory_bytes``
    is the worst rank's) and ``per_rank``: each rank's ``rank``, ``samples_per_s``,
    ``peak_memory_bytes`` and ``data_wait_fraction``.
    """

    status: str
    settings: dict[str, Any] = field(default_factory=dict)
    mode: str = "measure"
    samples_per_s: float | None = None
    windows: list[float] = field(default_factory=list)
    window_steps: int = 0
    steady_from: int = 0
    steady: bool = True
    median: float | None = None
    iqr: float | None = None
    step_time_s: float | None = None
    data_wait_fraction: float | None = None
    peak_memory_bytes: int | None = None
    warmup_s: float | None = None
    compile_s: float | None = None
    first_step_s: float | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    steps: int = 0
    dataset_len: int | None = None
    # fp16 only: the GradScaler's initial and final scale, growth interval, optimizer steps.
    grad_scaler: dict[str, Any] | None = None
    env: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    wall_s: float | None = None
    log_path: str | None = None
    world_size: int = 1
    backend: str | None = None
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    # Measured inside a session: its id, this arm's index, the session's mode and note.
    session: dict[str, Any] | None = None
    # Where a step's time goes, from a profiled window after the timed ones (requests with
    # ``diagnose``): steps, wall_s, seconds and shares per phase (``trainopt.stats.phases.PHASES``,
    # shares summing to 1), device_type, device_busy (accelerators: the device's busy share of
    # wall time), gpu_utilization and gpu_memory_used_bytes (NVML, where available).
    breakdown: dict[str, Any] | None = None
    # What the rest of a run costs (``run_costs`` in the spec): checkpoint_s, eval_s, eval_batches.
    run_costs: dict[str, Any] | None = None
    # Probes only: the largest items of a bounded sample, of which each probe batch was made
    # (``trainopt.trial.probe_items``): sampled, dataset_len, largest, median, smallest, in_batch,
    # unit. Optional: a result without it (a trial that is no probe) is complete.
    probe_items: dict[str, Any] | None = None
    # Training-check runs (mode ``train``) only: ``losses`` (one per optimizer step, None
    # from the first non-finite one, where the run stops), ``order_seed``, and for fp16
    # ``scaler_skipped`` (steps the GradScaler skipped for inf/NaN gradients).
    training: dict[str, Any] | None = None
    # Where the loss came from when the model or step returned a tuple or list, such as
    # ``(logits, loss)`` (``trainopt.trial.batches.loss_note``). Optional, likewise.
    loss_note: str | None = None
    # What the trial trained (``trainopt.trial.workload_record``): the loss form, the optimizer
    # it built (source, name, class, args), a LightningModule's own loader batch size. Optional.
    workload: dict[str, Any] | None = None
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TrialResult":
        _check_version(data, "trial result")
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def ok(self) -> bool:
        return self.status == "ok"
