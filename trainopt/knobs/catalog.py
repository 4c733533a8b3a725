"""The knob catalog: every training-speed setting trainopt knows how to change.

A knob is plain data (name, allowed values, default, stage). The same names are used by
the spec's ``baseline`` and ``search`` sections, by ``--set`` overrides, by ``best.yaml``
and by the production settings API, so this module is the one place that says what a
valid value is. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

__all__ = [
    "Knob",
    "KNOBS",
    "STAGES",
    "default_settings",
    "coerce_value",
    "not_applicable_reason",
    "distributed_reason",
    "channels_last_reason",
    "KnobValueError",
    "format_value",
]


class KnobValueError(ValueError):
    """A knob value that is not allowed; the message names what is allowed."""


# Stages follow the order of the training-speed checklist: batch size first, then
# precision, then keeping the input pipeline ahead, host overhead, and last the heavy tools.
# DDP communication knobs come after the single-device ones: they tune gradient exchange,
# which only matters once the step itself is as fast as it gets.
STAGES = ("batch", "precision", "layout", "input", "host", "backend", "distributed", "compile")


@dataclass(frozen=True)
class Knob:
    """One setting that a trial can change.

    Attributes:
        name: The key used in specs, ``--set`` and ``best.yaml``.
        kind: ``int``, ``bool`` or ``choice``.
        default: The value when the spec leaves the knob out.
        stage: Which checklist stage the knob belongs to (see ``STAGES``).
        help: One line for humans.
        choices: Allowed values for ``choice`` knobs.
        minimum: Smallest allowed value for ``int`` knobs.
        nullable: Whether ``null`` is allowed (meaning "leave PyTorch's default").
        numerics: Whether the knob can change the numbers training computes (rounding,
            kernels, reduction order), as precision, compilation and backend flags can; the
            input pipeline's knobs and the host's loss reads cannot. The training check
            (``trainopt.decide.training_check``) suspects only these when a run trains worse.
    """

    name: str
    kind: str
    default: Any
    stage: str
    help: str
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    nullable: bool = False
    numerics: bool = True

    def describe_allowed(self) -> str:
        """Human text for the values this knob accepts."""
        if self.kind == "choice":
            text = ", ".join(self.choices)
        elif self.kind == "bool":
            text = "true, false"
        else:
            text = f"an integer >= {self.minimum}"
        return text + (" or null" if self.nullable else "")


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in [
        Knob("batch_size", "int", 32, "batch", "samples per optimizer micro-step", minimum=1),
        Knob("grad_accum", "int", 1, "batch", "micro-batches accumulated per optimizer step", minimum=1),
        Knob("amp", "choice", "off", "precision", "autocast dtype; fp16 adds a GradScaler", choices=("off", "bf16", "fp16")),
        Knob("tf32", "bool", None, "backend", "TF32 matmuls and convolutions (CUDA Ampere+); null: PyTorch's defaults "
             "(TF32 convolutions, full-precision matmuls)", nullable=True),
        Knob("channels_last", "bool", False, "layout", "channels-last memory format for 4-D floating tensors in a batch"),
        Knob("num_workers", "int", 0, "input", "DataLoader worker processes", minimum=0, numerics=False),
        Knob("pin_memory", "bool", False, "input", "pinned host memory and non_blocking copies (accelerators)", numerics=False),
        Knob("persistent_workers", "bool", False, "input", "keep loader workers alive between epochs", numerics=False),
        Knob("prefetch_factor", "int", None, "input", "batches prefetched per worker", minimum=1, nullable=True, numerics=False),
        Knob("sync_every", "int", 1, "host", "read the loss on the host every N steps (0 = never), as logging does", minimum=0, numerics=False),
        Knob("optimizer_impl", "choice", "default", "host", "optimizer kernel: default, foreach or fused", choices=("default", "foreach", "fused")),
        Knob("threads", "int", None, "host", "CPU intra-op threads (torch.set_num_threads)", minimum=1, nullable=True),
        Knob("cudnn_benchmark", "bool", False, "backend", "let cuDNN pick the fastest convolution algorithms"),
        Knob("compile", "choice", "off", "compile", "torch.compile mode", choices=("off", "default", "reduce-overhead", "max-autotune")),
        # Data-parallel knobs: each sets one DistributedDataParallel argument (trainopt.knobs.kwargs.DDP_KWARGS).
        Knob("ddp_bucket_cap_mb", "int", None, "distributed", "DDP gradient bucket size in MB (null: PyTorch's 25)", minimum=1, nullable=True),
        Knob("ddp_gradient_as_bucket_view", "bool", False, "distributed", "DDP gradients as views into the buckets (saves a copy)"),
        Knob("ddp_static_graph", "bool", False, "distributed", "DDP static_graph: the set of used parameters never changes"),
        Knob("ddp_find_unused_parameters", "bool", False, "distributed", "DDP searches the graph for unused parameters every step", numerics=False),
        Knob("ddp_broadcast_buffers", "bool", True, "distributed", "DDP broadcasts buffers (e.g. BatchNorm stats) from rank 0 every step"),
    ]
}


def format_value(value: Any) -> str:
    """A knob value as YAML writes it (``true``, ``null``, ``64``, ``bf16``), for reports and exports."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def default_settings() -> dict[str, Any]:
    """Every knob at its default value."""
    return {name: knob.default for name, knob in KNOBS.items()}


def coerce_value(name: str, value: Any) -> Any:
    """Check one knob value and return it in canonical form.

    YAML 1.1 reads a bare ``off`` as ``False``; for ``amp`` and ``compile`` that is taken
    to mean ``"off"`` so users are not surprised by their own YAML.

    Args:
        name: Knob name.
        value: The value as written (already parsed from YAML or ``--set``).

    Returns:
        The canonical value.

    Raises:
        KnobValueError: The knob is unknown or the value is not allowed.
    """
    knob = KNOBS.get(name)
    if knob is None:
        raise KnobValueError(f"unknown knob {name!r}; known knobs: {', '.join(KNOBS)}")
    if value is None:
        if knob.nullable:
            return None
        raise KnobValueError(f"null is not allowed; use {knob.describe_allowed()}")
    if knob.kind == "choice":
        if value is False and "off" in knob.choices:
            return "off"
        if not isinstance(value, str) or value not in knob.choices:
            raise KnobValueError(f"{value!r} is not one of {knob.describe_allowed()}")
        return value
    if knob.kind == "bool":
        if not isinstance(value, bool):
            raise KnobValueError(f"{value!r} is not a boolean; use true or false")
        return value
    # int
    if isinstance(value, bool) or not isinstance(value, int):
        raise KnobValueError(f"{value!r} is not an integer; use {knob.describe_allowed()}")
    if knob.minimum is not None and value < knob.minimum:
        raise KnobValueError(f"{value!r} is too small; use {knob.describe_allowed()}")
    if value > 1_000_000_000:
        raise KnobValueError(f"{value!r} is too large; use a value up to 1000000000")
    return value


def _needs_workers(s: Mapping[str, Any]) -> str | None:
    if s.get("num_workers", 0) == 0:
        if s.get("persistent_workers"):
            return "persistent_workers needs num_workers > 0"
        if s.get("prefetch_factor") is not None:
            return "prefetch_factor needs num_workers > 0"
    return None


def _needs_cuda(s: Mapping[str, Any], device_type: str) -> str | None:
    if device_type == "cuda":
        return None
    for name in ("pin_memory", "cudnn_benchmark", "tf32"):
        if s.get(name):
            return f"{name} applies to CUDA devices only; this trial runs on {device_type}"
    return None


def distributed_reason(settings: Mapping[str, Any], world_size: int | None) -> str | None:
    """Why the data-parallel knobs in ``settings`` cannot apply, or None when they can.

    Args:
        settings: Every knob's value.
        world_size: Processes per trial, or None without a ``distributed`` block (where a
            ``ddp_*`` knob off its default would be a silent no-op).
    """
    if world_size is None:
        for name, knob in KNOBS.items():
            if knob.stage == "distributed" and settings.get(name, knob.default) != knob.default:
                return (
                    f"{name} applies to data-parallel trials only; add a 'distributed: {{nproc_per_node: N}}' "
                    f"block to the spec to measure it"
                )
        return None
    if settings.get("ddp_static_graph") and settings.get("grad_accum", 1) > 1:
        # Checked on torch 2.13: the second backward after no_sync() trips
        # "expect_autograd_hooks_ INTERNAL ASSERT FAILED" in reducer.cpp (pytorch#143580).
        return (
            "ddp_static_graph with grad_accum > 1 fails inside PyTorch: accumulation steps run under "
            "no_sync(), which static_graph does not support (pytorch#143580)"
        )
    return None


def not_applicable_reason(settings: Mapping[str, Any], device_type: str, world_size: int | None = None) -> str | None:
    """Why these settings cannot apply on ``device_type``, or None when they can.

    A knob that would be a silent no-op on this device is reported, not run, so a
    verdict is never drawn from a change that changed nothing.

    Args:
        settings: Every knob's value.
        device_type: ``cpu`` or ``cuda``.
        world_size: Processes per data-parallel trial, or None for single-process trials
            (where the DDP knobs cannot apply).
    """
    return (
        _needs_cuda(settings, device_type)
        or distributed_reason(settings, world_size)
        or _needs_workers(settings)
    )


def channels_last_reason(settings: Mapping[str, Any], image_batches: bool) -> str | None:
    """Why ``channels_last`` cannot apply to a workload's batches, or None when it can.

    Args:
        settings: Every knob's value.
        image_batches: Whether a real batch of the workload holds a 4-D floating tensor
            (``[N, C, H, W]``), the only kind the memory format changes.
    """
    if settings.get("channels_last") and not image_batches:
        return (
            "channels_last needs a 4-D floating tensor (images as [N, C, H, W]) in a batch; "
            "this workload's batches hold none"
        )
    return None
