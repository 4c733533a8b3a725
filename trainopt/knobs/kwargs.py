"""What each knob means in PyTorch, written once, as plain data: the trial loop, ``load_settings()`` and the exports read it.

Two layers, in two modules:

* Pure functions from a settings dict to plain data (which backend flags take which
  value, the DataLoader keyword arguments, the compile mode, the optimizer keyword
  arguments, the autocast dtype's name, when the loss is read). They import nothing
  heavy, so ``trainopt export`` renders code from exactly the data the trial applied.
* ``trainopt.trial.applier.Applier``, which applies that data to torch objects: flags, device, memory format,
  compile, autocast, the fp16 ``GradScaler``, gradient accumulation and the host-sync
  cadence. torch is imported inside its methods, so ``import trainopt`` stays light.

The measured state of each knob (what a pasted export must reproduce exactly):

* ``threads``: ``torch.set_num_threads(n)``; null leaves PyTorch's own count.
* ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark`` set to the value.
* ``tf32``: ``torch.backends.cuda.matmul.allow_tf32`` *and* ``torch.backends.cudnn.allow_tf32``
  set to the value: ``tf32: false`` means no TF32 anywhere, ``true`` TF32 everywhere. Null
  (the default) leaves both at PyTorch's defaults, which differ (matmul off, cuDNN on): a
  plain training script runs that way, so a baseline that does not name ``tf32`` is
  measured as the user's script runs, not with cuDNN's TF32 switched off.
* ``pin_memory``: pinned batches and ``non_blocking`` copies, on CUDA only (on a CPU the
  knob is not applicable and is applied as off).
* ``channels_last``: the model and every 4-D floating tensor of a batch (wherever it sits in
  a tuple, dict, dataclass or nested structure) in channels-last memory format.
* ``compile``: ``torch.compile(model, mode=...)``, ``default`` being mode None.
* ``amp``: ``torch.autocast(device_type, dtype)`` over forward and loss; fp16 adds a
  ``torch.amp.GradScaler``.
* ``grad_accum``: each micro-batch loss divided by ``grad_accum``; the optimizer steps
  (and gradients are reset with ``set_to_none=True``) after every ``grad_accum``-th.
* ``sync_every``: the loss is read on the host after every N-th optimizer step, counted
  over the whole run (0: never).
* ``optimizer_impl``: ``foreach=True`` or ``fused=True`` passed to the optimizer.
* Loader: ``batch_size``, ``num_workers``, ``drop_last=True`` (every measured batch had
  the same shape; a compiled model recompiles on a new one), and ``persistent_workers`` /
  ``prefetch_factor`` only with workers, where DataLoader accepts them.
* Data parallel (a ``distributed`` block; see ``trainopt.contract.distributed`` for the job itself):
  the model is wrapped in ``DistributedDataParallel`` after channels-last and before
  compile, each ``ddp_*`` knob setting one of its arguments (``DDP_KWARGS``;
  ``ddp_bucket_cap_mb`` null leaves PyTorch's 25 MB; ``ddp_broadcast_buffers`` is
  ``forward_sync_buffers`` on PyTorch 2.13+, which renamed it); each rank reads its shard
  through a ``DistributedSampler(shuffle=True, drop_last=True, seed=...)`` in place of the
  loader's ``shuffle``; ``batch_size`` is per rank; with ``grad_accum > 1`` the forward and
  backward of every micro-batch but the last of an optimizer step run under ``no_sync()``.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

__all__ = [
    "AMP_DTYPES",
    "COMPILE_MODES",
    "DEVICE_PATTERN",
    "GRAD_SCALER_INIT_SCALE",
    "OPTIMIZER_KWARGS",
    "DDP_KWARGS",
    "DeviceUnavailableError",
    "backend_flags",
    "compile_mode",
    "ddp_kwargs",
    "sampler_kwargs",
    "device_type_of",
    "loader_kwargs",
    "optimizer_kwargs",
    "pins_memory",
    "should_read_loss",
]

# amp value -> the torch dtype's attribute name (None: full precision).
AMP_DTYPES: dict[str, str | None] = {"off": None, "bf16": "bfloat16", "fp16": "float16"}
# compile value -> torch.compile's ``mode`` argument ("off" is absent: not compiled).
COMPILE_MODES: dict[str, str | None] = {"default": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}
# PyTorch's default, written out so the scaler's figures can name it.
GRAD_SCALER_INIT_SCALE = 2.0**16
OPTIMIZER_KWARGS: dict[str, dict[str, bool]] = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")

# ddp_* knob -> the DistributedDataParallel keyword argument it sets.
DDP_KWARGS: dict[str, str] = {
    "ddp_bucket_cap_mb": "bucket_cap_mb",
    "ddp_gradient_as_bucket_view": "gradient_as_bucket_view",
    "ddp_static_graph": "static_graph",
    "ddp_find_unused_parameters": "find_unused_parameters",
    "ddp_broadcast_buffers": "broadcast_buffers",
}


class DeviceUnavailableError(RuntimeError):
    """The settings ask for a device this machine does not have."""


def device_type_of(device: str) -> str:
    """``cuda`` or ``cpu`` for a device name; ``auto`` counts as ``cuda`` (it is CUDA where available)."""
    return "cpu" if device == "cpu" else "cuda"


def backend_flags(settings: Mapping[str, Any]) -> dict[str, bool]:
    """The torch.backends attributes a trial sets, by dotted name, with their values.

    Set on every device: they change nothing on a CPU, and a process that later moves to
    CUDA then runs as measured. ``tf32: null`` sets neither TF32 flag.
    """
    flags = {"torch.backends.cudnn.benchmark": bool(settings["cudnn_benchmark"])}
    if settings["tf32"] is not None:
        flags["torch.backends.cuda.matmul.allow_tf32"] = bool(settings["tf32"])
        flags["torch.backends.cudnn.allow_tf32"] = bool(settings["tf32"])
    return flags


def pins_memory(settings: Mapping[str, Any], device_type: str) -> bool:
    """Whether batches are pinned and copied non-blocking: only towards a CUDA device."""
    return bool(settings["pin_memory"]) and device_type == "cuda"


def loader_kwargs(settings: Mapping[str, Any], device_type: str) -> dict[str, Any]:
    """DataLoader keyword arguments, without ``shuffle`` and ``generator`` (the caller's)."""
    kwargs: dict[str, Any] = {
        "batch_size": settings["batch_size"],
        "num_workers": settings["num_workers"],
        "pin_memory": pins_memory(settings, device_type),
        "drop_last": True,
    }
    if settings["num_workers"] > 0:
        kwargs["persistent_workers"] = bool(settings["persistent_workers"])
        if settings["prefetch_factor"] is not None:
            kwargs["prefetch_factor"] = settings["prefetch_factor"]
    return kwargs


def compile_mode(settings: Mapping[str, Any]) -> tuple[bool, str | None]:
    """``(compiled, mode)``: whether ``torch.compile`` runs and with which ``mode``."""
    value = settings["compile"]
    return (value != "off", COMPILE_MODES.get(value))


def optimizer_kwargs(impl: str) -> dict[str, bool]:
    """The optimizer constructor's keyword arguments for ``optimizer_impl``.

    Raises:
        ValueError: ``impl`` is not a known implementation.
    """
    if impl not in OPTIMIZER_KWARGS:
        raise ValueError(f"optimizer_impl {impl!r} is not one of {', '.join(OPTIMIZER_KWARGS)}")
    return dict(OPTIMIZER_KWARGS[impl])


def ddp_kwargs(settings: Mapping[str, Any], forward_sync_buffers: bool = False) -> dict[str, Any]:
    """Keyword arguments for ``DistributedDataParallel`` (``device_ids`` aside).

    Every DDP knob is written out, also at its default, so the trial, ``wrap_ddp`` and the
    exports pass the same arguments; ``bucket_cap_mb`` is left out at null (PyTorch's 25 MB).

    Args:
        settings: Every knob's value.
        forward_sync_buffers: True to name the buffer broadcast ``forward_sync_buffers``, as
            PyTorch 2.13+ does (it warns on ``broadcast_buffers``). Both sync buffers from
            rank 0 at every forward when true, which is what the knob measures.
    """
    out: dict[str, Any] = {}
    for knob, kwarg in DDP_KWARGS.items():
        value = settings[knob]
        if knob == "ddp_bucket_cap_mb" and value is None:
            continue
        if knob == "ddp_broadcast_buffers" and forward_sync_buffers:
            kwarg = "forward_sync_buffers"
        out[kwarg] = value
    return out


def sampler_kwargs(seed: int = 0) -> dict[str, Any]:
    """``DistributedSampler`` keyword arguments as measured (world size and rank come from the group).

    ``drop_last`` keeps every rank's batches the same in shape and number, as the
    single-process loader's ``drop_last`` does; the sampler shuffles, so the loader gets
    no ``shuffle``.
    """
    return {"shuffle": True, "drop_last": True, "seed": seed}


def should_read_loss(sync_every: int, optimizer_steps: int) -> bool:
    """Whether the loss is read on the host now, after ``optimizer_steps`` steps of the run.

    Counted over the whole run, as a logging loop counts, never per timing window: a
    cadence longer than a window is still read at its cadence.
    """
    return bool(sync_every) and optimizer_steps > 0 and optimizer_steps % sync_every == 0
