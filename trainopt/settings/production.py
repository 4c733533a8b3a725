"""Use the winning settings in a real training script: ``load_settings("best.yaml")``.

``best.yaml`` is written by ``trainopt search`` or by hand; a hand-written file needs only
a ``settings:`` mapping (knobs left out take their defaults) and optionally ``device:``.
Three parts, each with one job:

* the schema: ``SettingsRecord``, validated plain data (device, every knob, provenance);
* file reading: ``read_settings_file`` (YAML to data) and ``record_from_document``
  (data to a record), with errors naming the dotted field;
* applying: ``TrainSettings`` hands every knob to ``trainopt.trial.applier.Applier``, the same
  code the measured trial loop runs, so what a training run gets is what was measured::

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

torch is imported inside the methods only, so ``import trainopt`` stays light.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ContextManager, Mapping

import yaml

from trainopt.contract import distributed as dist_mod
from trainopt.errors import UserError
from trainopt.knobs.catalog import KNOBS, KnobValueError, coerce_value, default_settings, distributed_reason
from trainopt.knobs.kwargs import DEVICE_PATTERN
from trainopt.version import __version__

__all__ = [
    "SETTINGS_SCHEMA_VERSION",
    "SettingsError",
    "SettingsRecord",
    "TrainSettingsWarning",
    "TrainSettings",
    "load_settings",
    "read_settings_file",
    "record_from_document",
    "settings_from_dict",
    "validate_record",
]

SETTINGS_SCHEMA_VERSION = 1
SETTINGS_KIND = "trainopt-settings"
TOP_LEVEL_KEYS = ("schema_version", "kind", "device", "settings", "distributed", "provenance")
DISTRIBUTED_KEYS = ("nproc_per_node", "backend")



class SettingsError(UserError):
    """A settings file or value that cannot be used; ``problems`` has one line per bad field.

    Args:
        problems: One message per problem, each starting with the dotted field path.
        source: The file the settings came from, or None.
    """

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        head = f"{source}: " if source else ""
        if len(self.problems) == 1:
            text = head + self.problems[0]
        else:
            text = f"{head}{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(text)


class TrainSettingsWarning(UserWarning):
    """The settings were measured on another machine or software; the speedup may not carry over."""


def _did_you_mean(name: str, known: tuple[str, ...] | list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_distributed(block: Any) -> list[str]:
    """Problems with a ``distributed:`` block (the spec's: nproc_per_node, backend)."""
    if block is None:
        return []
    if not isinstance(block, Mapping):
        return [f"distributed: expected a mapping like {{nproc_per_node: 2, backend: auto}}, got {type(block).__name__}"]
    problems = [
        f"distributed.{key}: unknown key{_did_you_mean(str(key), DISTRIBUTED_KEYS)}; allowed: {', '.join(DISTRIBUTED_KEYS)}"
        for key in block
        if key not in DISTRIBUTED_KEYS
    ]
    nproc = block.get("nproc_per_node")
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        problems.append(f"distributed.nproc_per_node: got {nproc!r}; use an integer >= 1")
    backend = block.get("backend", "auto")
    if backend not in dist_mod.BACKENDS:
        problems.append(f"distributed.backend: got {backend!r}; use one of {', '.join(dist_mod.BACKENDS)}")
    return problems


def _check_fields(
    device: Any, settings: Any, provenance: Any, distributed: Any = None
) -> tuple[list[str], dict[str, Any]]:
    """Check device, settings, the distributed block and provenance; return the problems and the complete settings."""
    problems: list[str] = _check_distributed(distributed)
    if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
        problems.append(f"device: {device!r} is not one of auto, cpu, cuda, cuda:N")
    merged = default_settings()
    if settings is None:
        settings = {}
    if not isinstance(settings, Mapping):
        problems.append(
            f"settings: expected a mapping of knob: value, got {type(settings).__name__}; "
            f"write e.g. 'settings: {{batch_size: 64, amp: bf16}}'"
        )
    else:
        for name, value in settings.items():
            if not isinstance(name, str) or name not in KNOBS:
                problems.append(
                    f"settings.{name}: unknown knob{_did_you_mean(str(name), list(KNOBS))}; "
                    f"known knobs: {', '.join(KNOBS)}"
                )
                continue
            try:
                merged[name] = coerce_value(name, value)
            except KnobValueError as exc:
                problems.append(f"settings.{name}: {exc}")
    if not problems:
        reason = distributed_reason(merged, dist_mod.world_size(distributed) if distributed else None)
        if reason:
            problems.append(f"settings: {reason}")
    if provenance is not None:
        if not isinstance(provenance, Mapping):
            problems.append(
                f"provenance: expected a mapping, got {type(provenance).__name__}; remove it or keep the one trainopt wrote"
            )
        elif provenance.get("env") is not None and not isinstance(provenance["env"], Mapping):
            problems.append(
                f"provenance.env: expected a mapping, got {type(provenance['env']).__name__}; "
                f"remove it or keep the one trainopt wrote"
            )
    return problems, merged


@dataclass(frozen=True)
class SettingsRecord:
    """Validated settings as plain, read-only data: the schema of ``best.yaml``.

    Build it with ``validate_record`` or ``record_from_document``, which check every field.

    Attributes:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        settings: Every knob's value (knobs not given take their defaults), read-only.
        provenance: Where and how the settings were measured; empty for hand-written files.
        source: The file the settings were read from, for messages; None when built in code.
        distributed: The ``distributed`` block (``nproc_per_node``, ``backend``) when the
            settings were measured as a data-parallel job, else None.
    """

    device: str
    settings: Mapping[str, Any]
    provenance: Mapping[str, Any]
    source: str | None = None
    distributed: Mapping[str, Any] | None = None


def _distributed_block(block: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return MappingProxyType({"backend": "auto", **block}) if block else None


def validate_record(
    device: Any = "auto",
    settings: Any = None,
    provenance: Any = None,
    source: str | None = None,
    distributed: Any = None,
) -> SettingsRecord:
    """Check device, knob values, the distributed block and provenance; return the complete record.

    Raises:
        SettingsError: Listing every invalid field with its dotted path.
    """
    problems, merged = _check_fields(device, settings, provenance, distributed)
    if problems:
        raise SettingsError(problems, source)
    # Copies, so a caller changing its own dicts later cannot change these settings.
    return SettingsRecord(
        device, MappingProxyType(merged), MappingProxyType(dict(provenance or {})), source, _distributed_block(distributed)
    )


class TrainSettings:
    """Validated training-speed settings and the methods that apply them as measured.

    The fields are read-only; the state that changes while training (the fp16 gradient
    scaler, the resolved device) lives in the ``trainopt.trial.applier.Applier`` built on first use.

    Args:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        settings: Knob values; knobs not given take their defaults.
        provenance: Where and how the settings were measured.
        source: The file the settings were read from, for messages.
        distributed: The ``distributed`` block of a data-parallel measurement
            (``nproc_per_node``, ``backend``), or None.

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
    ):
        self._record = validate_record(device, settings, provenance, source, distributed)
        self._applier = None

    @classmethod
    def from_record(cls, record: SettingsRecord) -> "TrainSettings":
        """Wrap an already validated record."""
        obj = cls.__new__(cls)
        obj._record = record
        obj._applier = None
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

    # ---- what was measured --------------------------------------------------------

    @property
    def lr_scale_hint(self) -> str | None:
        """The search's learning-rate advice when it changed the batch size, else None."""
        hint = self.provenance.get("lr_hint")
        return str(hint) if hint else None

    def environment_differences(self) -> list[str]:
        """Lines for each fingerprint key that differs between the measurement and here.

        Only keys the provenance records are compared, so a hand-written file without a
        fingerprint never differs. Imports torch.
        """
        from trainopt.contract.fingerprint import COMPARED_KEYS, differences
        from trainopt.trial.environment import environment

        measured = self.provenance.get("env") or {}
        if not measured:
            return []
        try:
            device = self.device_obj()
        except SettingsError:
            # The device is unavailable here; a CPU fingerprint shows that as a difference.
            device = None
        here = environment(device)
        keys = [k for k in COMPARED_KEYS if k in measured]
        return differences({k: measured[k] for k in keys}, {k: here.get(k) for k in keys})

    # ---- applying the knobs (all through trainopt.trial.applier) ----------------------------

    @property
    def applier(self):
        """The ``trainopt.trial.applier.Applier`` for these settings on this machine's device.

        Raises:
            SettingsError: CUDA was asked for but is not available.
        """
        if self._applier is None:
            from trainopt.trial.applier import Applier, DeviceUnavailableError, resolve_device

            try:
                device = resolve_device(self.device)
            except DeviceUnavailableError as exc:
                raise SettingsError([str(exc)], self.source) from None
            if self.distributed and device.type == "cuda":
                # Under torchrun each process trains on its own GPU, as the trials did.
                import os

                import torch

                device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            self._applier = Applier(self.settings, device, data_parallel=bool(self.distributed))
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
        only towards CUDA, where it was measured.
        """
        return self.applier.loader_kwargs()

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

    def to_device(self, x, y):
        """Move one batch to the device as measured (non-blocking from pinned memory).

        Args:
            x: The input tensor; a 4-D one becomes channels-last when that knob is on.
            y: The target tensor.

        Returns:
            ``(x, y)`` on the device.
        """
        return self.applier.to_device(x, y)

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


def record_from_document(data: Any, source: str | None = None) -> SettingsRecord:
    """Check a parsed ``best.yaml`` document and return its validated record.

    Args:
        data: The parsed document.
        source: Where it came from, for messages.

    Raises:
        SettingsError: Listing every invalid field with its dotted path.
    """
    if data is None:
        raise SettingsError(["the file is empty; write at least a 'settings:' mapping of knob: value"], source)
    if not isinstance(data, Mapping):
        raise SettingsError(
            [f"expected a mapping with a 'settings:' section, got {type(data).__name__}"], source
        )
    kind = data.get("kind", SETTINGS_KIND)
    if kind != SETTINGS_KIND:
        # Checked first: a results.json or a spec given by mistake would otherwise show
        # a long list of unknown keys instead of the one thing to fix.
        raise SettingsError(
            [f"kind: {kind!r} is not {SETTINGS_KIND!r}; pass a best.yaml written by `trainopt search`, or write one by hand"],
            source,
        )
    version = data.get("schema_version", SETTINGS_SCHEMA_VERSION)
    if type(version) is not int or version != SETTINGS_SCHEMA_VERSION:
        raise SettingsError(
            [
                f"schema_version: this file has version {version!r}; this trainopt {__version__} reads version "
                f"{SETTINGS_SCHEMA_VERSION}. Use the trainopt that wrote it, or re-run the search"
            ],
            source,
        )
    problems = [
        f"{key}: unknown top-level key{_did_you_mean(str(key), TOP_LEVEL_KEYS)}; allowed: {', '.join(TOP_LEVEL_KEYS)}"
        for key in data
        if key not in TOP_LEVEL_KEYS
    ]
    if "settings" not in data:
        problems.append("settings: missing; add a 'settings:' mapping of knob: value (knobs left out take their defaults)")
    device = data.get("device", "auto")
    provenance = data.get("provenance")
    block = data.get("distributed")
    field_problems, merged = _check_fields(device, data.get("settings"), provenance, block)
    problems += field_problems
    if problems:
        raise SettingsError(problems, source)
    return SettingsRecord(
        device, MappingProxyType(merged), MappingProxyType(dict(provenance or {})), source, _distributed_block(block)
    )


def settings_from_dict(data: Any, source: str | None = None) -> "TrainSettings":
    """Build ``TrainSettings`` from a parsed ``best.yaml`` document.

    Args:
        data: The parsed document.
        source: Where it came from, for messages.

    Raises:
        SettingsError: Listing every invalid field with its dotted path.
    """
    return TrainSettings.from_record(record_from_document(data, source))


def read_settings_file(path: Path) -> Any:
    """The parsed YAML document of a settings file (no validation).

    Raises:
        SettingsError: Missing, unreadable or non-UTF-8 file, or a YAML error with line and column.
    """
    source = str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SettingsError(
            ["file not found; pass the best.yaml written by `trainopt search` (in its output folder)"], source
        ) from None
    except IsADirectoryError:
        raise SettingsError(["is a folder; pass the best.yaml file inside it"], source) from None
    except OSError as exc:
        raise SettingsError([f"cannot read the file ({exc.strerror})"], source) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SettingsError([f"not UTF-8 text (byte {exc.start}); save the file as UTF-8 YAML"], source) from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SettingsError([f"YAML syntax error{where}: {exc.problem or exc}"], source) from None
    except yaml.YAMLError as exc:
        raise SettingsError([f"YAML error: {exc}"], source) from None
    except RecursionError:
        raise SettingsError(["YAML nesting is too deep"], source) from None


def load_settings(path: str | Path, warn: bool = True) -> TrainSettings:
    """Read and validate a ``best.yaml``.

    Args:
        path: The file (``best.yaml`` from a search output folder, or one written by hand).
        warn: Emit one ``TrainSettingsWarning`` when the file's recorded machine or
            software differs from this one (imports torch to find out).

    Returns:
        The settings, with every knob left out set to its default.

    Raises:
        SettingsError: Missing or unreadable file, YAML syntax error (with line and
            column), or invalid fields (with their dotted path).
    """
    path = Path(path)
    settings = settings_from_dict(read_settings_file(path), source=str(path))
    if warn:
        diffs = settings.environment_differences()
        if diffs:
            warnings.warn(
                f"{path}: these settings were measured on a different machine or software, so the "
                f"speedup may not carry over; re-run `trainopt search` here to be sure:\n"
                + "\n".join(f"  - {d}" for d in diffs),
                TrainSettingsWarning,
                stacklevel=2,
            )
    return settings
