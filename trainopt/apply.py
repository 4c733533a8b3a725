"""What each knob means in PyTorch, written once: the trial loop, ``load_settings()`` and the exports read it.

Two layers:

* Pure functions from a settings dict to plain data (which backend flags take which
  value, the DataLoader keyword arguments, the compile mode, the optimizer keyword
  arguments, the autocast dtype's name, when the loss is read). They import nothing
  heavy, so ``trainopt export`` renders code from exactly the data the trial applied.
* ``Applier``, which applies that data to torch objects: flags, device, memory format,
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
* ``channels_last``: the model and every 4-D input in channels-last memory format.
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
* Data parallel (a ``distributed`` block; see ``trainopt.distributed`` for the job itself):
  the model is wrapped in ``DistributedDataParallel`` after channels-last and before
  compile, each ``ddp_*`` knob setting one of its arguments (``DDP_KWARGS``;
  ``ddp_bucket_cap_mb`` null leaves PyTorch's 25 MB; ``ddp_broadcast_buffers`` is
  ``forward_sync_buffers`` on PyTorch 2.13+, which renamed it); each rank reads its shard
  through a ``DistributedSampler(shuffle=True, drop_last=True, seed=...)`` in place of the
  loader's ``shuffle``; ``batch_size`` is per rank; with ``grad_accum > 1`` the forward and
  backward of every micro-batch but the last of an optimizer step run under ``no_sync()``.
"""

from __future__ import annotations

import contextlib
import re
from typing import Any, ContextManager, Mapping

__all__ = [
    "AMP_DTYPES",
    "COMPILE_MODES",
    "DEVICE_PATTERN",
    "GRAD_SCALER_INIT_SCALE",
    "OPTIMIZER_KWARGS",
    "DDP_KWARGS",
    "Applier",
    "DeviceUnavailableError",
    "backend_flags",
    "compile_mode",
    "ddp_kwargs",
    "sampler_kwargs",
    "device_type_of",
    "loader_kwargs",
    "optimizer_kwargs",
    "pins_memory",
    "resolve_device",
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


def resolve_device(name: str):
    """The torch.device for a device name; ``auto`` is CUDA when available, else CPU.

    Raises:
        DeviceUnavailableError: CUDA was asked for but is not available.
    """
    import torch

    if not isinstance(name, str) or not DEVICE_PATTERN.match(name):
        raise DeviceUnavailableError(f"device: {name!r} is not one of auto, cpu, cuda, cuda:N")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device: {name!r} was asked for but CUDA is not available here; use device: auto or cpu"
        )
    return device


class Applier:
    """Applies one complete, validated settings dict to torch objects.

    Args:
        settings: Every knob's value (see ``trainopt.knobs``).
        device: The torch.device to train on.
        data_parallel: True inside a ``torch.distributed`` job (a ``distributed`` block):
            ``prepare_model`` then wraps the model in DistributedDataParallel, and
            ``no_sync`` skips the all-reduce on accumulation micro-batches.

    Attributes:
        micro_steps: Micro-batches backpropagated through ``backward_and_step`` so far.
        optimizer_steps: Optimizer steps taken so far (fp16 steps the scaler skipped
            for overflowing gradients included, as a training loop counts them).
    """

    def __init__(self, settings: Mapping[str, Any], device, data_parallel: bool = False):
        self.settings = dict(settings)
        self.device = device
        self.data_parallel = data_parallel
        self.micro_steps = 0
        self.optimizer_steps = 0
        self._scaler = None
        self.ddp_model = None

    # ---- set-up ------------------------------------------------------------------

    def apply_backend_flags(self) -> None:
        """Set the thread count, cuDNN benchmark and both TF32 flags as measured."""
        import torch

        if self.settings["threads"] is not None:
            torch.set_num_threads(self.settings["threads"])
        for dotted, value in backend_flags(self.settings).items():
            owner, _, attr = dotted.rpartition(".")
            obj = torch
            for part in owner.split(".")[1:]:
                obj = getattr(obj, part)
            setattr(obj, attr, value)

    def loader_kwargs(self) -> dict[str, Any]:
        """DataLoader keyword arguments (add ``shuffle`` and a ``generator`` yourself)."""
        return loader_kwargs(self.settings, self.device.type)

    def optimizer_kwargs(self) -> dict[str, bool]:
        """Keyword arguments for the optimizer's constructor."""
        return optimizer_kwargs(self.settings["optimizer_impl"])

    @property
    def memory_format(self):
        import torch

        return torch.channels_last if self.settings["channels_last"] else torch.contiguous_format

    def prepare_model(self, model):
        """Move to the device, apply the memory format, switch to training, wrap in DDP, compile.

        Returns:
            The module to call (DistributedDataParallel when data-parallel, compiled when
            ``compile`` is on; it shares parameters with ``model``, which is changed in place).
        """
        import torch

        model = model.to(self.device)
        if self.settings["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        if self.data_parallel:
            # Before compile, as DDP's documentation asks, so compile sees the bucketed all-reduce.
            model = self.wrap_ddp(model)
        compiled, mode = compile_mode(self.settings)
        return torch.compile(model, mode=mode) if compiled else model

    def wrap_ddp(self, model):
        """``DistributedDataParallel(model, **ddp_kwargs(settings))`` on this process's device.

        Needs an initialized default process group (``torch.distributed.init_process_group``).
        """
        import inspect

        from torch.nn.parallel import DistributedDataParallel

        renamed = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp_model = DistributedDataParallel(
            model, device_ids=device_ids, **ddp_kwargs(self.settings, forward_sync_buffers=renamed)
        )
        return self.ddp_model

    def sampler(self, dataset, seed: int = 0):
        """This process's ``DistributedSampler`` over ``dataset`` (rank and world size from the default group)."""
        import torch

        return torch.utils.data.DistributedSampler(dataset, **sampler_kwargs(seed))

    def no_sync(self) -> ContextManager[Any]:
        """Around the next micro-batch's forward and backward: DDP's ``no_sync()`` on accumulation steps.

        Only the last micro-batch of each optimizer step all-reduces the gradients; a no-op
        context without DDP or without accumulation.
        """
        accum = self.settings["grad_accum"]
        if self.ddp_model is None or accum == 1 or (self.micro_steps + 1) % accum == 0:
            return contextlib.nullcontext()
        return self.ddp_model.no_sync()

    def to_device(self, x, y):
        """Move one batch to the device (non-blocking from pinned memory); 4-D inputs get the memory format."""
        non_blocking = pins_memory(self.settings, self.device.type)
        x = x.to(self.device, non_blocking=non_blocking)
        y = y.to(self.device, non_blocking=non_blocking)
        if self.settings["channels_last"] and x.dim() == 4:
            x = x.contiguous(memory_format=self.memory_format)
        return x, y

    # ---- each step ---------------------------------------------------------------

    def autocast_dtype(self):
        """``torch.bfloat16`` / ``torch.float16``, or None when amp is off."""
        import torch

        name = AMP_DTYPES[self.settings["amp"]]
        return getattr(torch, name) if name else None

    def autocast(self) -> ContextManager[Any]:
        """Autocast for forward and loss, or a no-op context when amp is off."""
        import torch

        dtype = self.autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=dtype)

    @property
    def grad_scaler(self):
        """The fp16 ``torch.amp.GradScaler`` (made on first use), or None for other amp values."""
        if self.settings["amp"] != "fp16":
            return None
        if self._scaler is None:
            import torch

            self._scaler = torch.amp.GradScaler(self.device.type, init_scale=GRAD_SCALER_INIT_SCALE)
        return self._scaler

    def backward_and_step(self, loss, optimizer) -> bool:
        """Backward one micro-batch; step the optimizer after every ``grad_accum``-th.

        Args:
            loss: The micro-batch loss, unscaled (divided by ``grad_accum`` here).
            optimizer: The optimizer to step.

        Returns:
            True when the optimizer stepped (and the gradients were reset).
        """
        accum = self.settings["grad_accum"]
        scaled = loss / accum if accum > 1 else loss
        scaler = self.grad_scaler
        if scaler is not None:
            scaler.scale(scaled).backward()
        else:
            scaled.backward()
        self.micro_steps += 1
        if self.micro_steps % accum:
            return False
        if scaler is not None:
            # No scale read here: get_scale() waits for the device, which the measured
            # loop does only as sync_every asks (see scaler_state for the figures).
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.optimizer_steps += 1
        return True

    def should_read_loss(self) -> bool:
        """Whether to read the loss on the host now (after the latest optimizer step)."""
        return should_read_loss(self.settings["sync_every"], self.optimizer_steps)

    def scaler_state(self) -> dict[str, Any] | None:
        """The fp16 scaler's figures, or None without a scaler; reads the scale (a device sync).

        The scale halves on every step skipped for inf/NaN gradients and doubles only
        after ``growth_interval`` clean steps in a row, so a run shorter than that with a
        scale below the initial one skipped ``log2(initial / scale)`` steps.
        """
        if self._scaler is None:
            return None
        return {
            "initial_scale": GRAD_SCALER_INIT_SCALE,
            "scale": float(self._scaler.get_scale()),
            "growth_interval": int(self._scaler.get_growth_interval()),
            "optimizer_steps": self.optimizer_steps,
        }
