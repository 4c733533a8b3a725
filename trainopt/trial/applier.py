"""The torch side of the knobs: applies a settings dict to torch objects.

What each knob means is written once, as plain data, in ``trainopt.knobs.kwargs`` (read by the
exports too); ``Applier`` applies that data to torch objects: flags, device, memory format,
compile, autocast, the fp16 ``GradScaler``, gradient accumulation and the host-sync cadence.
torch is imported inside its methods, so ``import trainopt`` stays light.
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Mapping

from trainopt.knobs.kwargs import (
    AMP_DTYPES,
    DEVICE_PATTERN,
    GRAD_SCALER_INIT_SCALE,
    DeviceUnavailableError,
    backend_flags,
    compile_mode,
    ddp_kwargs,
    loader_kwargs,
    optimizer_kwargs,
    pins_memory,
    sampler_kwargs,
    should_read_loss,
)

__all__ = ["Applier", "DeviceUnavailableError", "resolve_device"]


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
        settings: Every knob's value (see ``trainopt.knobs.catalog``).
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
        self._move = None
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

    def to_device(self, batch, *more):
        """Move one batch, whatever its structure, to the device as measured.

        Every tensor inside it moves (non-blocking from pinned memory); with
        ``channels_last`` on, every 4-D floating tensor gets the channels-last format. The
        structure stays: a tuple, list, namedtuple, dict or other Mapping, dataclass, nested
        (``trainopt.trial.batches.move``).

        Args:
            batch: The batch as the DataLoader yields it.
            *more: Further parts of the batch: ``to_device(x, y)`` moves the pair ``(x, y)``.

        Returns:
            The batch on the device; a tuple when given more than one argument.
        """
        move = self._move
        if move is None:
            # Imported once, on first use: importing this module must not import torch.
            from trainopt.trial.batches import move

            self._move = move
        if more:
            batch = (batch, *more)
        return move(batch, self.device, pins_memory(self.settings, self.device.type), self.settings["channels_last"])

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

    def backward_and_step(self, loss, optimizer, phases=None) -> bool:
        """Backward one micro-batch; step the optimizer after every ``grad_accum``-th.

        Args:
            loss: The micro-batch loss, unscaled (divided by ``grad_accum`` here).
            optimizer: The optimizer to step.
            phases: A ``trainopt.trial.breakdown.PhaseTimer`` told when ``backward`` and
                ``optimizer`` start and when the last one ends, or None (training as usual:
                one ``is None`` test per phase edge).

        Returns:
            True when the optimizer stepped (and the gradients were reset).
        """
        if phases is not None:
            phases.start("backward")
        accum = self.settings["grad_accum"]
        scaled = loss / accum if accum > 1 else loss
        scaler = self.grad_scaler
        if scaler is not None:
            scaler.scale(scaled).backward()
        else:
            scaled.backward()
        self.micro_steps += 1
        if self.micro_steps % accum:
            if phases is not None:
                phases.stop()
            return False
        if phases is not None:
            phases.start("optimizer")
        if scaler is not None:
            # No scale read here: get_scale() waits for the device, which the measured
            # loop does only as sync_every asks (see scaler_state for the figures).
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if phases is not None:
            phases.stop()
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
