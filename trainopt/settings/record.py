"""The schema of ``best.yaml``: the validated record, its checks, and reading a file into one.

``best.yaml`` is written by ``trainopt search`` or by hand; a hand-written file needs only
a ``settings:`` mapping (knobs left out take their defaults) and optionally ``device:``.
A ``code:`` section names the training code the settings were measured with: the spec's
``data.collate``, ``loss`` and ``step``, the loss ``form``, the ``optimizer`` the trials built
(``source``, ``name``, ``class``, ``args``) and a LightningModule's own loader batch size
(``data_batch_size``).
``SettingsRecord`` is the validated plain data (device, every knob, provenance, code);
``read_settings_file`` turns a file into YAML data and ``record_from_document`` that data
into a record, with errors naming the dotted field. Nothing here imports torch.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

import yaml

from trainopt.contract import distributed as dist_mod
from trainopt.contract.reference import REFERENCE_PATTERN
from trainopt.errors import UserError
from trainopt.knobs.catalog import (
    KNOBS,
    KnobValueError,
    coerce_value,
    default_settings,
    distributed_reason,
)
from trainopt.knobs.kwargs import DEVICE_PATTERN
from trainopt.version import __version__

__all__ = [
    "CODE_KEYS",
    "SETTINGS_KIND",
    "SETTINGS_SCHEMA_VERSION",
    "SettingsError",
    "SettingsRecord",
    "read_record",
    "read_settings_file",
    "record_from_document",
    "validate_record",
]


SETTINGS_SCHEMA_VERSION = 1
SETTINGS_KIND = "trainopt-settings"
TOP_LEVEL_KEYS = ("schema_version", "kind", "device", "settings", "distributed", "code", "provenance")
DISTRIBUTED_KEYS = ("nproc_per_node", "backend")
# The ``code:`` section: the spec's data.collate, loss and step, as written there; the loss form,
# the optimizer the baseline trial built, a LightningModule's own loader batch size.
CODE_KEYS = ("collate", "loss", "step", "form", "optimizer", "data_batch_size")
OPTIMIZER_KEYS = ("source", "name", "class", "args")
OPTIMIZER_SOURCES = ("spec", "default", "configure_optimizers")


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


def _check_code(block: Any) -> list[str]:
    """Problems with a ``code:`` section (``collate``, ``loss``, ``step``)."""
    if block is None:
        return []
    # Here, not at the top: the spec module loads pydantic, which ``import trainopt`` need not.
    from trainopt.contract.spec import BUILTIN_LOSSES, DEFAULT_LOSS, LOSS_FORMS, MODEL_LOSS

    if not isinstance(block, Mapping):
        return [f"code: expected a mapping like {{collate: 'mypkg.data:pad', loss: model}}, got {type(block).__name__}"]
    problems = [
        f"code.{key}: unknown key{_did_you_mean(str(key), CODE_KEYS)}; allowed: {', '.join(CODE_KEYS)}"
        for key in block
        if key not in CODE_KEYS
    ]
    for key in ("collate", "step"):
        value = block.get(key)
        if value is not None and not (isinstance(value, str) and REFERENCE_PATTERN.match(value)):
            problems.append(f"code.{key}: got {value!r}; use a 'module:callable' or 'path/file.py:callable' reference, or null")
    loss = block.get("loss", DEFAULT_LOSS)
    losses = (*BUILTIN_LOSSES, MODEL_LOSS)
    if not isinstance(loss, str) or not (loss in losses or REFERENCE_PATTERN.match(loss)):
        problems.append(f"code.loss: got {loss!r}; use one of {', '.join(losses)} or a 'module:callable' reference")
    elif block.get("step") is not None and loss != DEFAULT_LOSS:
        problems.append(f"code.loss: got {loss!r}, but code.step computes the loss itself; remove one of them")
    form = block.get("form")
    if form is not None and form not in LOSS_FORMS:
        problems.append(f"code.form: got {form!r}; use one of {', '.join(LOSS_FORMS)}")
    size = block.get("data_batch_size")
    if size is not None and (type(size) is not int or size < 1):
        problems.append(f"code.data_batch_size: got {size!r}; use a positive integer or leave it out")
    return problems + _check_optimizer(block.get("optimizer"))


def _check_optimizer(block: Any) -> list[str]:
    """Problems with ``code.optimizer`` (``source``, ``name``, ``class``, ``args``)."""
    if block is None:
        return []
    if not isinstance(block, Mapping):
        return [f"code.optimizer: expected a mapping like {{class: torch.optim.AdamW, args: {{lr: 0.001}}}}, "
                f"got {type(block).__name__}"]
    problems = [
        f"code.optimizer.{key}: unknown key{_did_you_mean(str(key), OPTIMIZER_KEYS)}; allowed: {', '.join(OPTIMIZER_KEYS)}"
        for key in block
        if key not in OPTIMIZER_KEYS
    ]
    if block.get("source", "spec") not in OPTIMIZER_SOURCES:
        problems.append(f"code.optimizer.source: got {block.get('source')!r}; use one of {', '.join(OPTIMIZER_SOURCES)}")
    name, cls = block.get("name"), block.get("class")
    if name is not None and not isinstance(name, str):
        problems.append(f"code.optimizer.name: got {name!r}; use a built-in optimizer name or a 'module:callable' reference")
    if cls is not None and not (isinstance(cls, str) and all(p.isidentifier() for p in cls.split("."))):
        problems.append(f"code.optimizer.class: got {cls!r}; use a dotted class path such as torch.optim.AdamW")
    if name is None and cls is None:
        problems.append("code.optimizer: needs name or class; name the optimizer the settings were measured with")
    if not isinstance(block.get("args", {}), Mapping):
        problems.append(f"code.optimizer.args: got {block.get('args')!r}; use a mapping of keyword arguments")
    return problems


def _code_block(block: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not block:
        return None
    from trainopt.contract.spec import DEFAULT_LOSS

    code: dict[str, Any] = {"collate": block.get("collate")}
    if block.get("step") is None and block.get("form") != "lightning":
        # A step or a training_step computes the loss: no loss beside them.
        code["loss"] = block.get("loss", DEFAULT_LOSS)
    code["step"] = block.get("step")
    for key in ("form", "data_batch_size"):
        if block.get(key) is not None:
            code[key] = block[key]
    if block.get("optimizer") is not None:
        optimizer = dict(block["optimizer"])
        code["optimizer"] = {"source": optimizer.get("source", "spec"), "name": optimizer.get("name"),
                             "class": optimizer.get("class"), "args": dict(optimizer.get("args") or {})}
    return MappingProxyType(code)


def _check_fields(
    device: Any, settings: Any, provenance: Any, distributed: Any = None, code: Any = None
) -> tuple[list[str], dict[str, Any]]:
    """Check device, settings, the distributed block, the code section and provenance; return the problems and the complete settings."""
    problems: list[str] = _check_distributed(distributed) + _check_code(code)
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
        code: The user's training code the settings were measured with: ``collate``
            (the spec's ``data.collate``), ``loss`` and ``step``, each as written in the spec;
            None when the spec used ``(input, target)`` pairs with PyTorch's default collate.
    """

    device: str
    settings: Mapping[str, Any]
    provenance: Mapping[str, Any]
    source: str | None = None
    distributed: Mapping[str, Any] | None = None
    code: Mapping[str, Any] | None = None

    @property
    def lr_scale_hint(self) -> str | None:
        """The search's learning-rate advice when it changed the batch size, else None."""
        hint = self.provenance.get("lr_hint")
        return str(hint) if hint else None

    @property
    def established(self) -> frozenset[str]:
        """The knobs whose values are decisions: changed by the search, or set off trainopt's default.

        A knob the search changed is listed in ``provenance.kept``; a knob off its catalog
        default was set so by the search or by the user's baseline. The rest sit at
        trainopt's defaults, which stand for "nothing decided": the framework exports leave
        a framework's own default in place for them (``trainopt.settings.frameworks``).
        """
        kept = self.provenance.get("kept")
        names = {d.get("knob") for d in kept if isinstance(d, Mapping)} if isinstance(kept, (list, tuple)) else set()
        names |= {name for name, knob in KNOBS.items() if self.settings[name] != knob.default}
        return frozenset(name for name in names if name in KNOBS)

    @property
    def measured_device_type(self) -> str | None:
        """``cpu`` or ``cuda``: the device type the settings were measured on, or None when unknown.

        ``device: cpu`` or ``cuda[:N]`` names it; for ``device: auto`` it is read from the
        measuring machine's fingerprint (``provenance.env.device_type``), so an ``auto``
        search that ran on a CPU says ``cpu``; None for ``auto`` without a fingerprint.
        """
        if self.device == "cpu":
            return "cpu"
        if self.device.startswith("cuda"):
            return "cuda"
        env = self.provenance.get("env")
        measured = env.get("device_type") if isinstance(env, Mapping) else None
        return measured if measured in ("cpu", "cuda") else None


def _distributed_block(block: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    return MappingProxyType({"backend": "auto", **block}) if block else None


def validate_record(
    device: Any = "auto",
    settings: Any = None,
    provenance: Any = None,
    source: str | None = None,
    distributed: Any = None,
    code: Any = None,
) -> SettingsRecord:
    """Check device, knob values, the distributed block, the code section and provenance; return the complete record.

    Raises:
        SettingsError: Listing every invalid field with its dotted path.
    """
    problems, merged = _check_fields(device, settings, provenance, distributed, code)
    if problems:
        raise SettingsError(problems, source)
    # Copies, so a caller changing its own dicts later cannot change these settings.
    return SettingsRecord(
        device, MappingProxyType(merged), MappingProxyType(dict(provenance or {})), source, _distributed_block(distributed),
        _code_block(code),
    )


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
    code = data.get("code")
    field_problems, merged = _check_fields(device, data.get("settings"), provenance, block, code)
    problems += field_problems
    if problems:
        raise SettingsError(problems, source)
    return SettingsRecord(
        device, MappingProxyType(merged), MappingProxyType(dict(provenance or {})), source, _distributed_block(block),
        _code_block(code),
    )


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


def read_record(path: Path) -> SettingsRecord:
    """Read a settings file and validate it into a record.

    Raises:
        SettingsError: Missing or unreadable file, YAML syntax error (with line and
            column), or invalid fields (with their dotted path).
    """
    return record_from_document(read_settings_file(path), source=str(path))
