"""Use the winning settings in a real training script: ``load_settings("best.yaml")``.

``best.yaml`` is written by ``trainopt search`` or by hand; a hand-written file needs only
a ``settings:`` mapping (knobs left out take their defaults) and optionally ``device:``.
``TrainSettings`` applies every knob the same way the measured loop did, so what a
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

torch is imported inside the methods only, so ``import trainopt`` stays light.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ContextManager, Mapping

import yaml

from trainopt import __version__
from trainopt import distributed as dist_mod
from trainopt.errors import UserError
from trainopt.knobs import KNOBS, KnobValueError, coerce_value, default_settings

__all__ = [
    "SETTINGS_SCHEMA_VERSION",
    "SettingsError",
    "TrainSettingsWarning",
    "TrainSettings",
    "load_settings",
    "settings_from_dict",
]

SETTINGS_SCHEMA_VERSION = 1
SETTINGS_KIND = "trainopt-settings"
TOP_LEVEL_KEYS = ("schema_version", "kind", "device", "settings", "distributed", "provenance")
DISTRIBUTED_KEYS = ("nproc_per_node", "backend")

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_COMPILE_MODES = {"default": None, "reduce-overhead": "reduce-overhead", "max-autotune": "max-autotune"}


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


def _check_fields(device: Any, settings: Any, provenance: Any, distributed: Any = None) -> tuple[list[str], dict[str, Any]]:
    """Check device, settings, the distributed block and provenance; return the problems and the complete settings."""
    problems: list[str] = _check_distributed(distributed)
    if not isinstance(device, str) or not _DEVICE_RE.match(device):
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
        world = dist_mod.world_size(distributed) if distributed else None
        reason = dist_mod.not_applicable_reason(merged, world)
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
class TrainSettings:
    """Validated training-speed settings and the methods that apply them.

    The fields are fixed once built; the only state that changes while training (the
    fp16 gradient scaler, the resolved device) lives in private attributes.

    Attributes:
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        settings: Every knob's value (knobs not given take their defaults). Treat it as
            read-only.
        provenance: Where and how the settings were measured; empty for hand-written files.
        source: The file the settings were read from, for messages; None when built in code.
        distributed: The spec's ``distributed`` block (``nproc_per_node``, ``backend``) when
            the settings were measured as a data-parallel job, else None.

    Raises:
        SettingsError: A field is invalid (raised on construction).
    """

    device: str = "auto"
    settings: dict[str, Any] = field(default_factory=default_settings)
    provenance: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    distributed: dict[str, Any] | None = None
    _scaler: Any = field(default=None, init=False, repr=False, compare=False)
    _device: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems, merged = _check_fields(self.device, self.settings, self.provenance, self.distributed)
        if problems:
            raise SettingsError(problems, self.source)
        if self.distributed is not None:
            object.__setattr__(self, "distributed", {"backend": "auto", **self.distributed})
        # Copies, so a caller mutating its own dicts later cannot change these settings.
        object.__setattr__(self, "settings", merged)
        object.__setattr__(self, "provenance", dict(self.provenance or {}))

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
        from trainopt.fingerprint import COMPARED_KEYS, differences, environment

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

    # ---- applying the knobs -------------------------------------------------------

    def device_obj(self):
        """The torch.device to train on; ``auto`` is CUDA when available, else CPU.

        Raises:
            SettingsError: CUDA was asked for but is not available.
        """
        if self._device is not None:
            return self._device
        import torch

        if self.device == "auto":
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        elif self.distributed and self.device.startswith("cuda"):
            device = torch.device("cuda")
        else:
            device = torch.device(self.device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise SettingsError(
                    [f"device: {self.device!r} was asked for but CUDA is not available here; use device: auto or cpu"],
                    self.source,
                )
        if self.distributed and device.type == "cuda":
            # Under torchrun each rank trains on its own GPU, as the trials did.
            import os

            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        object.__setattr__(self, "_device", device)
        return device

    def _on_cuda(self) -> bool:
        return self.device_obj().type == "cuda"

    def apply_backend_flags(self) -> None:
        """Set the thread count, cuDNN benchmark and TF32 flags as measured.

        The cuDNN and TF32 flags affect CUDA only; they are set on every device so a
        process that moves to CUDA later still runs as measured.
        """
        import torch

        s = self.settings
        if s["threads"] is not None:
            torch.set_num_threads(s["threads"])
        torch.backends.cudnn.benchmark = bool(s["cudnn_benchmark"])
        torch.backends.cuda.matmul.allow_tf32 = bool(s["tf32"])
        torch.backends.cudnn.allow_tf32 = bool(s["tf32"])

    def dataloader_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.utils.data.DataLoader`` (add ``shuffle`` yourself).

        ``drop_last`` is on because every measured batch had the same shape (a compiled
        model recompiles on a new shape). ``persistent_workers`` and ``prefetch_factor``
        are left out without workers, where DataLoader rejects them.
        """
        s = self.settings
        kwargs: dict[str, Any] = {
            "batch_size": s["batch_size"],
            "num_workers": s["num_workers"],
            # Pinned memory only helps copies to an accelerator; on CPU it was not measured.
            "pin_memory": bool(s["pin_memory"]) and self._on_cuda(),
            "drop_last": True,
        }
        if s["num_workers"] > 0:
            kwargs["persistent_workers"] = bool(s["persistent_workers"])
            if s["prefetch_factor"] is not None:
                kwargs["prefetch_factor"] = s["prefetch_factor"]
        return kwargs

    def prepare_model(self, model):
        """Move the model to the device, apply channels-last, switch to training, compile.

        Build the optimizer from ``model.parameters()`` after this call.

        Args:
            model: A ``torch.nn.Module``.

        Returns:
            The module to call in the training loop (the compiled one when ``compile`` is
            on; it shares parameters with ``model``).
        """
        import torch

        s = self.settings
        model = model.to(self.device_obj())
        if s["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        if s["compile"] != "off":
            return torch.compile(model, mode=_COMPILE_MODES[s["compile"]])
        return model

    def to_device(self, x, y):
        """Move one batch to the device as measured (non-blocking from pinned memory).

        Args:
            x: The input tensor; a 4-D one becomes channels-last when that knob is on.
            y: The target tensor.

        Returns:
            ``(x, y)`` on the device.
        """
        import torch

        device = self.device_obj()
        non_blocking = bool(self.settings["pin_memory"]) and device.type == "cuda"
        x = x.to(device, non_blocking=non_blocking)
        y = y.to(device, non_blocking=non_blocking)
        if self.settings["channels_last"] and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y

    def autocast_dtype(self):
        """The autocast dtype (``torch.bfloat16`` or ``torch.float16``), or None when amp is off."""
        import torch

        return {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.settings["amp"]]

    def autocast(self) -> ContextManager[Any]:
        """A context manager for the forward pass and loss: autocast, or nothing when amp is off."""
        import torch

        dtype = self.autocast_dtype()
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_obj().type, dtype=dtype)

    @property
    def grad_scaler(self):
        """The fp16 ``torch.amp.GradScaler`` (created on first use), or None for other amp values.

        Save its ``state_dict()`` with your checkpoints so a resumed run keeps its scale.
        """
        if self.settings["amp"] != "fp16":
            return None
        if self._scaler is None:
            import torch

            object.__setattr__(self, "_scaler", torch.amp.GradScaler(self.device_obj().type))
        return self._scaler

    def backward_and_step(self, loss, optimizer, step: int) -> bool:
        """Backward one micro-batch; step the optimizer after every ``grad_accum``-th.

        Args:
            loss: The micro-batch loss (unscaled; it is divided by ``grad_accum`` here).
            optimizer: The optimizer to step.
            step: The 0-based micro-batch index, counted across the whole run.

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
        if (step + 1) % accum:
            return False
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return True

    def optimizer_kwargs(self) -> dict[str, bool]:
        """Keyword arguments for your optimizer's constructor: ``{}``, ``foreach`` or ``fused``."""
        return {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}[self.settings["optimizer_impl"]]

    # ---- data parallel (the `distributed` block and the ddp_* knobs) ---------------

    def launch_command(self, script: str = "train.py") -> str | None:
        """The torchrun command the settings were measured under, or None for single-process settings."""
        if not self.distributed:
            return None
        return dist_mod.launch_command(self.distributed["nproc_per_node"], script)

    def init_distributed(self) -> None:
        """Join the torchrun job: the measured backend (``auto``: nccl on CUDA, gloo on CPU), the rank's GPU.

        Call it once per process, first; does nothing for single-process settings or when
        a process group already exists.
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
                backend = dist_mod.resolve_backend(self.distributed.get("backend", "auto"), device.type)
            except ValueError as exc:
                raise SettingsError([str(exc)], self.source) from None
            dist.init_process_group(backend)

    def ddp_kwargs(self) -> dict[str, Any]:
        """``DistributedDataParallel`` keyword arguments from the ddp_* knobs (``device_ids`` aside)."""
        from trainopt.ddp import has_forward_sync_buffers

        return dist_mod.ddp_kwargs(self.settings, forward_sync_buffers=has_forward_sync_buffers())

    def wrap_ddp(self, model):
        """Wrap a prepared model in ``DistributedDataParallel`` as measured.

        Call it after ``init_distributed()`` and before ``torch.compile``: pass the module
        from ``prepare_model`` of settings without ``compile``, or wrap first and compile
        the wrapper (``torch.compile(s.wrap_ddp(model))``), as the trials did.
        """
        from torch.nn.parallel import DistributedDataParallel

        device = self.device_obj()
        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids, **self.ddp_kwargs())

    def sampler_kwargs(self, seed: int = 0) -> dict[str, Any]:
        """``DistributedSampler`` keyword arguments as measured; pass the sampler, not ``shuffle``, to DataLoader."""
        return dist_mod.sampler_kwargs(seed)

    def no_sync(self, model, step: int) -> ContextManager[Any]:
        """``model.no_sync()`` on accumulation micro-batches of a DDP model, else a no-op context.

        Put the forward pass and ``backward_and_step`` inside it, as the trials did: only the
        last micro-batch of each optimizer step all-reduces the gradients.

        Args:
            model: The module being trained (``DistributedDataParallel`` or not).
            step: The same 0-based micro-batch index passed to ``backward_and_step``.
        """
        accum = self.settings["grad_accum"]
        if accum > 1 and (step + 1) % accum and hasattr(model, "no_sync"):
            return model.no_sync()
        return contextlib.nullcontext()

    def should_log(self, step: int) -> bool:
        """Whether to read the loss on the host (``loss.item()``) after this micro-batch.

        The measured loop read the loss every ``sync_every`` optimizer steps; each read
        waits for the device, so logging more often than that is slower than measured.

        Args:
            step: The same 0-based micro-batch index passed to ``backward_and_step``.

        Returns:
            True after every ``sync_every``-th optimizer step; never when ``sync_every`` is 0.
        """
        every, accum = self.settings["sync_every"], self.settings["grad_accum"]
        if not every or (step + 1) % accum:
            return False
        return ((step + 1) // accum) % every == 0


def settings_from_dict(data: Any, source: str | None = None) -> TrainSettings:
    """Build ``TrainSettings`` from a parsed ``best.yaml`` document.

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
    field_problems, _ = _check_fields(device, data.get("settings"), provenance, block)
    problems += field_problems
    if problems:
        raise SettingsError(problems, source)
    return TrainSettings(
        device=device,
        settings=dict(data.get("settings") or {}),
        provenance=dict(provenance or {}),
        source=source,
        distributed=dict(block) if block else None,
    )


def _read_yaml(path: Path) -> Any:
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
    settings = settings_from_dict(_read_yaml(path), source=str(path))
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
