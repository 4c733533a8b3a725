"""Use the winning settings in a real training script: ``load_settings("best.yaml")``.

``load_settings`` reads the file into a validated record (``trainopt.settings.record``),
warns when it was measured on another machine (``trainopt.settings.environment_check``)
and returns a ``TrainSettings``: the handle that applies every knob through
``trainopt.trial.applier.Applier``, the same code the measured trial loop runs, so what a
training run gets is what was measured::

    s = load_settings("runs/resnet/best.yaml")
    s.apply_backend_flags()
    loader = DataLoader(dataset, shuffle=True, **s.dataloader_kwargs())
    model = s.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **s.optimizer_kwargs())
    for step, (x, y) in enumerate(loader):
        x, y = s.to_device(x, y)
        with s.autocast():
            loss = loss_fn(model(x), y)
        s.backward_and_step(loss, optimizer, step)
        if s.should_log(step):
            print(loss.item())

Batches of any structure work the same way: ``batch = s.to_device(batch)`` moves a dict, a
namedtuple, a dataclass or a nested structure whole, and ``s.dataloader_kwargs()`` carries
the ``collate_fn`` the settings were measured with (``code.collate`` in best.yaml).

torch is imported inside the methods only, so ``import trainopt`` stays light.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping

from trainopt.contract import distributed as dist_mod
from trainopt.settings.environment_check import warn_if_measured_elsewhere
from trainopt.settings.record import (
    SettingsError,
    SettingsRecord,
    read_record,
    record_from_document,
    validate_record,
)

__all__ = ["TrainSettings", "load_settings", "settings_from_dict"]

_UNRESOLVED = object()


def _applier_for(record: SettingsRecord):
    """The ``trainopt.trial.applier.Applier`` for a record on this machine's device.

    Raises:
        SettingsError: CUDA was asked for but is not available.
    """
    from trainopt.trial.applier import Applier, DeviceUnavailableError, resolve_device

    try:
        device = resolve_device(record.device)
    except DeviceUnavailableError as exc:
        raise SettingsError([str(exc)], record.source) from None
    if record.distributed and device.type == "cuda":
        # Under torchrun each process trains on its own GPU, as the trials did.
        import os

        import torch

        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return Applier(record.settings, device, data_parallel=bool(record.distributed))


class TrainSettings:
    """The user's handle on validated settings: its methods apply them as measured.

    The fields are read-only (a ``trainopt.settings.record.SettingsRecord`` underneath);
    the state that changes while training (the fp16 gradient scaler, the resolved device)
    lives in the ``trainopt.trial.applier.Applier`` built on first use.

    Args:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        settings: Knob values; knobs not given take their defaults.
        provenance: Where and how the settings were measured.
        source: The file the settings were read from, for messages.
        distributed: The ``distributed`` block of a data-parallel measurement
            (``nproc_per_node``, ``backend``), or None.
        code: The training code the settings were measured with (``collate``, ``loss``,
            ``step``; best.yaml's ``code:`` section), or None.

    Raises:
        SettingsError: A field is invalid (raised on construction).
    """

    def __init__(
        self,
        device: str = "auto",
        settings: Mapping[str, Any] | None = None,
        provenance: Mapping[str, Any] | None = None,
        source: str | None = None,
        distributed: Mapping[str, Any] | None = None,
        code: Mapping[str, Any] | None = None,
    ):
        self._record = validate_record(device, settings, provenance, source, distributed, code)
        self._applier = None
        self._collate: Any = _UNRESOLVED

    @classmethod
    def from_record(cls, record: SettingsRecord) -> TrainSettings:
        """Wrap an already validated record."""
        obj = cls.__new__(cls)
        obj._record = record
        obj._applier = None
        obj._collate = _UNRESOLVED
        return obj

    def __repr__(self) -> str:
        return f"TrainSettings(device={self.device!r}, settings={dict(self.settings)!r}, source={self.source!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TrainSettings) and self._record == other._record

    __hash__ = None  # type: ignore[assignment]

    @property
    def record(self) -> SettingsRecord:
        """The validated plain data."""
        return self._record

    @property
    def device(self) -> str:
        return self._record.device

    @property
    def settings(self) -> Mapping[str, Any]:
        """Every knob's value (read-only)."""
        return self._record.settings

    @property
    def provenance(self) -> Mapping[str, Any]:
        return self._record.provenance

    @property
    def source(self) -> str | None:
        return self._record.source

    @property
    def distributed(self) -> Mapping[str, Any] | None:
        """The ``distributed`` block (``nproc_per_node``, ``backend``), or None for single-process settings."""
        return self._record.distributed

    @property
    def code(self) -> Mapping[str, Any] | None:
        """The training code the settings were measured with: ``collate``, ``loss``, ``step`` (each as
        the spec wrote it; no ``loss`` beside a step or a LightningModule's training_step), and when
        recorded the loss ``form``, the ``optimizer`` (``source``, ``name``, ``class``, ``args``) and
        ``data_batch_size``; None for settings that name no code."""
        return self._record.code

    @property
    def collate_fn(self) -> Callable[[list[Any]], Any] | None:
        """The measured ``collate_fn`` (best.yaml's ``code.collate``), imported on first use; None without one.

        A ``module:callable`` reference is imported as your training script would import it
        (the current working directory first on ``sys.path``); a relative
        ``path/file.py:callable`` starts at the current working directory.

        Raises:
            SettingsError: The reference cannot be imported.
        """
        if self._collate is _UNRESOLVED:
            ref = (self.code or {}).get("collate")
            if ref is None:
                self._collate = None
            else:
                from trainopt.contract.reference import WorkloadError, resolve_reference

                try:
                    self._collate = resolve_reference(ref, Path(os.getcwd()), field="code.collate",
                                                      base="the current working directory")
                except WorkloadError as exc:
                    raise SettingsError([str(exc)], self.source) from None
        return self._collate

    @property
    def lr_scale_hint(self) -> str | None:
        """The search's learning-rate advice when it changed the batch size, else None."""
        return self._record.lr_scale_hint

    # ---- applying the knobs (all through trainopt.trial.applier) ----------------------------

    @property
    def applier(self):
        """The ``trainopt.trial.applier.Applier`` for these settings on this machine's device.

        Raises:
            SettingsError: CUDA was asked for but is not available.
        """
        if self._applier is None:
            self._applier = _applier_for(self._record)
        return self._applier

    def device_obj(self):
        """The torch.device to train on; ``auto`` is CUDA when available, else CPU.

        Raises:
            SettingsError: CUDA was asked for but is not available.
        """
        return self.applier.device

    def apply_backend_flags(self) -> None:
        """Set the thread count, cuDNN benchmark and both TF32 flags (matmul and cuDNN) as measured.

        The cuDNN and TF32 flags affect CUDA only; they are set on every device so a
        process that moves to CUDA later still runs as measured.
        """
        self.applier.apply_backend_flags()

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader`` (add ``shuffle`` yourself).

        ``drop_last`` is on because every measured batch had the same shape (a compiled
        model recompiles on a new shape). ``persistent_workers`` and ``prefetch_factor``
        are left out without workers, where DataLoader rejects them; ``pin_memory`` is on
        only towards CUDA, where it was measured. ``collate_fn`` is there when the settings
        were measured with one (``code.collate``).

        Raises:
            SettingsError: ``code.collate`` cannot be imported.
        """
        kwargs = self.applier.loader_kwargs()
        if self.collate_fn is not None:
            kwargs["collate_fn"] = self.collate_fn
        return kwargs

    def dataloader(self, dataset, shuffle: bool = True, **overrides):
        """A ``torch.utils.data.DataLoader`` over ``dataset`` with ``dataloader_kwargs()`` as measured.

        Args:
            dataset: Your map-style data set.
            shuffle: Shuffle every epoch, as the measured loader did.
            **overrides: DataLoader arguments of your own (``generator``, a ``sampler``
                instead of ``shuffle``); they win over the measured ones.
        """
        from torch.utils.data import DataLoader

        kwargs = {"shuffle": shuffle, **self.dataloader_kwargs(), **overrides}
        if "sampler" in overrides:
            kwargs.pop("shuffle")
        return DataLoader(dataset, **kwargs)

    def prepare_model(self, model):
        """Move the model to the device, apply channels-last, switch to training, compile.

        With a ``distributed`` block the model is also wrapped in ``DistributedDataParallel``
        (with the ``ddp_*`` knobs' arguments, before compile, as measured): call
        ``init_distributed()`` first. Build the optimizer from ``model.parameters()`` after
        this call.

        Args:
            model: A ``torch.nn.Module``.

        Returns:
            The module to call in the training loop (the compiled one when ``compile`` is
            on; it shares parameters with ``model``).
        """
        if self.distributed:
            import torch.distributed as dist

            if not dist.is_initialized():
                raise SettingsError(
                    ["distributed: these settings were measured data-parallel; call s.init_distributed() "
                     "(under torchrun) before s.prepare_model(model)"],
                    self.source,
                )
        return self.applier.prepare_model(model)

    def to_device(self, batch, *more):
        """Move one batch, whatever its structure, to the device as measured.

        Every tensor inside it moves (non-blocking from pinned memory), and with
        ``channels_last`` on every 4-D floating tensor becomes channels-last. Tuples, lists,
        namedtuples, dicts and other Mappings (a ``BatchEncoding``), dataclasses and nested
        structures keep their structure and types.

        Args:
            batch: The batch as the DataLoader yields it.
            *more: More parts of the batch: ``s.to_device(x, y)`` returns ``(x, y)`` moved.

        Returns:
            The batch on the device (a tuple when given more than one argument).
        """
        return self.applier.to_device(batch, *more)

    def autocast_dtype(self):
        """The autocast dtype (``torch.bfloat16`` or ``torch.float16``), or None when amp is off."""
        return self.applier.autocast_dtype()

    def autocast(self) -> ContextManager[Any]:
        """A context manager for the forward pass and loss: autocast, or nothing when amp is off."""
        return self.applier.autocast()

    @property
    def grad_scaler(self):
        """The fp16 ``torch.amp.GradScaler`` (created on first use), or None for other amp values.

        Save its ``state_dict()`` with your checkpoints so a resumed run keeps its scale.
        """
        return self.applier.grad_scaler

    def backward_and_step(self, loss, optimizer, step: int | None = None) -> bool:
        """Backward one micro-batch; step the optimizer after every ``grad_accum``-th.

        Args:
            loss: The micro-batch loss (unscaled; it is divided by ``grad_accum`` here).
            optimizer: The optimizer to step.
            step: The 0-based micro-batch index, counted across the whole run (the same
                index ``should_log`` takes). Left out, the micro-batches passed here so
                far are counted instead.

        Returns:
            True when the optimizer stepped (and the gradients were reset).
        """
        applier = self.applier
        if step is not None:
            applier.micro_steps = step
        return applier.backward_and_step(loss, optimizer)

    def optimizer_kwargs(self) -> dict[str, bool]:
        """Keyword arguments for your optimizer's constructor: ``{}``, ``foreach`` or ``fused``."""
        from trainopt.knobs.kwargs import optimizer_kwargs

        return optimizer_kwargs(self.settings["optimizer_impl"])

    def build_optimizer(self, params: Any):
        """The optimizer the settings were measured with, over ``params``, with the measured kernels.

        From best.yaml's ``code.optimizer``: the spec's optimizer factory with its arguments,
        or the class and arguments the trials built (the spec's, trainopt's default, or a
        LightningModule's ``configure_optimizers()``), plus ``optimizer_kwargs()``. Use it in
        your own loop, in ``configure_optimizers()``, or as a Hugging Face Trainer's optimizer.

        Raises:
            SettingsError: best.yaml names no optimizer, or it cannot be imported.
        """
        import importlib

        from trainopt.contract.reference import WorkloadError, resolve_reference

        record = (self.code or {}).get("optimizer")
        if not record:
            raise SettingsError(["code.optimizer: missing; this best.yaml names no optimizer, so build your own "
                                 "with **s.optimizer_kwargs()"], self.source)
        name, cls = record.get("name"), record.get("class")
        try:
            if record.get("source", "spec") == "spec" and name and ":" in name:
                factory = resolve_reference(name, Path(os.getcwd()), field="code.optimizer.name",
                                            base="the current working directory")
            else:
                module, _, attr = str(cls).rpartition(".")
                factory = getattr(importlib.import_module(module), attr)
        except WorkloadError as exc:
            raise SettingsError([str(exc)], self.source) from None
        except (ImportError, AttributeError, ValueError) as exc:
            raise SettingsError([f"code.optimizer.class: {cls!r} cannot be imported ({exc})"], self.source) from None
        args = {k: tuple(v) if isinstance(v, list) else v for k, v in (record.get("args") or {}).items()}
        return factory(params, **args, **self.optimizer_kwargs())

    # ---- a framework's own trainer (trainopt.settings.frameworks) ----------------------------

    def framework_args(self, framework: str):
        """The ``trainopt.settings.frameworks.FrameworkArgs`` of ``framework``: what ``trainer_kwargs``
        builds and ``trainopt export`` writes, each argument with its comment.

        Args:
            framework: ``lightning`` or ``hf``.

        Raises:
            FrameworkError: Unknown framework (``trainopt.settings.frameworks.FrameworkError``).
        """
        from trainopt.settings.frameworks import BUFFER_KWARGS, framework_args

        device_type = self._record.measured_device_type
        if device_type is None:
            # device: auto without a fingerprint: the device it resolves to here.
            device_type = self.device_obj().type
        buffer_kwarg = ddp_buffer_kwarg() if self.distributed else BUFFER_KWARGS[0]
        return framework_args(self._record, framework, device_type, buffer_kwarg)

    def trainer_kwargs(self, framework: str) -> dict[str, Any]:
        """Keyword arguments for ``lightning.Trainer`` (``lightning``) or ``transformers.TrainingArguments`` (``hf``).

        They construct the framework's object on the machine the settings were measured on
        (``use_cpu`` / ``accelerator`` from the measured device, a ``DDPStrategy`` object for
        a data-parallel measurement) and change a framework default only for what the
        search established; add your own (``max_steps``, ``output_dir``, ...) beside them.
        What the framework cannot express is in ``unexpressed(framework)``.

        Raises:
            FrameworkError: Unknown framework.
        """
        return self.framework_args(framework).built_kwargs()

    def unexpressed(self, framework: str) -> list:
        """What ``framework``'s arguments cannot express: ``Unexpressed`` records (``setting``,
        ``value``, ``reason``, ``instead``), each saying what to do in the script instead.

        Raises:
            FrameworkError: Unknown framework.
        """
        return list(self.framework_args(framework).unexpressed)

    # ---- data parallel (the distributed block; the ddp_* knobs live in the applier) ----

    def launch_command(self, script: str = "train.py") -> str | None:
        """The torchrun command the settings were measured under, or None for single-process settings."""
        if not self.distributed:
            return None
        return dist_mod.launch_command(self.distributed["nproc_per_node"], script)

    def init_distributed(self) -> None:
        """Join the torchrun job with the measured backend (``auto``: nccl on CUDA, gloo on CPU).

        On CUDA it also selects this process's GPU (``cuda:LOCAL_RANK``). Does nothing for
        single-process settings or when a process group exists already.
        """
        if not self.distributed:
            return
        import torch
        import torch.distributed as dist

        device = self.device_obj()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            try:
                backend = dist_mod.resolve_backend(self.distributed["backend"], device.type)
            except ValueError as exc:
                raise SettingsError([str(exc)], self.source) from None
            dist.init_process_group(backend)

    def finish_distributed(self) -> None:
        """Leave the torchrun job cleanly: free what DDP holds, then destroy the process group.

        Call it once training is over, after dropping your references to the wrapped model
        and its optimizer. DDP's reducer sits in reference cycles that plain reference
        counting never frees; left to interpreter shutdown, a gloo process group can abort a
        rank that finished its work ("terminate called without an active exception", exit
        -6), and torchrun then reports the whole job as failed. Collecting those cycles
        while the group is still alive avoids that. Does nothing when no group exists.
        """
        import gc

        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return
        gc.collect()
        dist.destroy_process_group()

    def sampler_kwargs(self, seed: int = 0) -> dict[str, Any]:
        """``DistributedSampler`` keyword arguments as measured; give DataLoader the sampler, not ``shuffle``."""
        from trainopt.knobs.kwargs import sampler_kwargs

        return sampler_kwargs(seed)

    def wrap_ddp(self, model):
        """Wrap an already prepared module in ``DistributedDataParallel`` with the ``ddp_*`` knobs' arguments.

        ``prepare_model`` does this by itself for settings with a ``distributed`` block;
        this is for models prepared some other way (wrap before ``torch.compile``).
        """
        return self.applier.wrap_ddp(model)

    def no_sync(self, step: int | None = None) -> ContextManager[Any]:
        """Around one micro-batch's forward and ``backward_and_step``: DDP's ``no_sync()`` on accumulation steps.

        Only the last micro-batch of each optimizer step all-reduces gradients, as measured;
        a no-op context without DDP or without accumulation.

        Args:
            step: The same 0-based micro-batch index passed to ``backward_and_step``; left
                out, the micro-batches passed there so far are counted.
        """
        applier = self.applier
        if step is not None:
            applier.micro_steps = step
        return applier.no_sync()

    def should_log(self, step: int) -> bool:
        """Whether to read the loss on the host (``loss.item()``) after this micro-batch.

        The measured loop read the loss every ``sync_every`` optimizer steps counted over
        the whole run; each read waits for the device, so logging more often than that
        is slower than measured.

        Args:
            step: The same 0-based micro-batch index passed to ``backward_and_step``.

        Returns:
            True after every ``sync_every``-th optimizer step; never when ``sync_every`` is 0.
        """
        from trainopt.knobs.kwargs import should_read_loss

        accum = self.settings["grad_accum"]
        if (step + 1) % accum:
            return False
        return should_read_loss(self.settings["sync_every"], (step + 1) // accum)


def ddp_buffer_kwarg() -> str:
    """``DistributedDataParallel``'s keyword for the buffer broadcast in the installed torch.

    ``forward_sync_buffers`` from PyTorch 2.13, which deprecated ``broadcast_buffers`` (a
    FutureWarning at every wrap); ``broadcast_buffers`` before. Imports torch.
    """
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters:
        return "forward_sync_buffers"
    return "broadcast_buffers"


def settings_from_dict(data: Any, source: str | None = None) -> TrainSettings:
    """Build ``TrainSettings`` from a parsed ``best.yaml`` document.

    Args:
        data: The parsed document.
        source: Where it came from, for messages.

    Raises:
        SettingsError: Listing every invalid field with its dotted path.
    """
    return TrainSettings.from_record(record_from_document(data, source))


def load_settings(path: str | Path, warn: bool = True) -> TrainSettings:
    """Read and validate a ``best.yaml``.

    Args:
        path: The file (``best.yaml`` from a search output folder, or one written by hand).
        warn: Emit one ``TrainSettingsWarning`` (``trainopt.settings.environment_check``)
            when the file's recorded machine or software differs from this one (imports
            torch to find out).

    Returns:
        The settings, with every knob left out set to its default.

    Raises:
        SettingsError: Missing or unreadable file, YAML syntax error (with line and
            column), or invalid fields (with their dotted path).
    """
    path = Path(path)
    settings = TrainSettings.from_record(read_record(path))
    if warn:
        warn_if_measured_elsewhere(path, settings.provenance, settings.device_obj)
    return settings
