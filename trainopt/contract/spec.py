"""The experiment spec: YAML in, a validated and frozen ``Spec`` out.

Every error names the dotted field path, the value given and what is allowed, so that
``trainopt validate`` can answer a bad spec with one readable message and exit 2.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)

from trainopt.contract import distributed as dist_mod
from trainopt.contract.checks import CheckSection
from trainopt.contract.spec_errors import SpecError, _fmt_value, _pydantic_problems
from trainopt.contract.reference import REFERENCE_PATTERN
from trainopt.contract.run_block import (DEFAULT_RUN_STEPS, OptionalDuration, RunCostsSection, RunSection, deprecation_notes,
                                         run_plan, run_problems)
from trainopt.knobs import catalog as knobs

__all__ = [
    "Spec",
    "SpecError",
    "load_spec",
    "spec_from_dict",
    "apply_overrides",
    "parse_set",
    "BUILTIN_MODELS",
    "BUILTIN_DATA",
    "BUILTIN_LOSSES",
    "BUILTIN_OPTIMIZERS",
    "BUILTIN_OPTIMIZER_CLASSES",
    "LOSS_FORMS",
    "DEFAULT_LOSS",
    "DEFAULT_OPTIMIZER",
    "MODEL_LOSS",
]

BUILTIN_MODELS = ("resnet18", "resnet50", "mlp", "gpt")
BUILTIN_DATA = ("synthetic-images", "synthetic-tokens", "synthetic-tabular")
BUILTIN_LOSSES = ("cross_entropy", "mse")
BUILTIN_OPTIMIZERS = ("sgd", "adam", "adamw")
# The class each built-in optimizer name builds (the trial's table and the exports read this).
BUILTIN_OPTIMIZER_CLASSES = {"sgd": "torch.optim.SGD", "adam": "torch.optim.Adam", "adamw": "torch.optim.AdamW"}
# How a batch becomes the loss (``trainopt.trial.batches``): (input, target) pairs and a named
# loss, ``loss: model``, ``step:``, a LightningModule's training_step.
LOSS_FORMS = ("pair", "model", "step", "lightning")
# ``loss: model``: the model computes its own loss from the whole batch.
MODEL_LOSS = "model"
DEFAULT_LOSS = "cross_entropy"
# The optimizer of a spec without one (a LightningModule's configure_optimizers() comes first).
DEFAULT_OPTIMIZER = {"name": "sgd", "args": {"lr": 0.1, "momentum": 0.9}}

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")
_REF_RE = REFERENCE_PATTERN


def _ref_or_builtin(value: str, builtins: tuple[str, ...], what: str) -> str:
    if value in builtins or _REF_RE.match(value):
        return value
    raise ValueError(
        f"{value!r} is not a built-in {what} ({', '.join(builtins)}) "
        f"nor a 'module:callable' or 'path/file.py:callable' reference"
    )


def _reference_only(value: str | None, what: str) -> str | None:
    if value is None or _REF_RE.match(value):
        return value
    raise ValueError(f"{value!r} is not a 'module:callable' or 'path/file.py:callable' reference to {what}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class Component(_Strict):
    """A named factory with keyword arguments (model, data, optimizer)."""

    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class ModelSection(Component):
    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return _ref_or_builtin(v, BUILTIN_MODELS, "model")


class DataSection(Component):
    """The data set, and optionally the ``collate_fn`` that batches its items.

    ``name`` may be left out only for a LightningModule, whose ``train_dataloader()`` (or
    ``datamodule``'s) then supplies the data set and collate function (checked in the trial).
    """

    name: str | None = None
    collate: str | None = None
    datamodule: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else _ref_or_builtin(v, BUILTIN_DATA, "data set")

    @field_validator("datamodule")
    @classmethod
    def _datamodule(cls, v: str | None) -> str | None:
        return _reference_only(v, "a factory returning a LightningDataModule")

    @field_validator("collate")
    @classmethod
    def _collate(cls, v: str | None) -> str | None:
        return _reference_only(v, "a collate function collate(items) -> batch")


class OptimizerSection(Component):
    """The optimizer; a spec without one leaves ``name`` None (see ``Spec.optimizer``)."""

    name: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else _ref_or_builtin(v, BUILTIN_OPTIMIZERS, "optimizer")


class MeasureSection(_Strict):
    """How one trial is timed and how a change is confirmed."""

    warmup_steps: int = Field(5, ge=0, le=100_000)
    warmup_seconds: float = Field(2.0, ge=0, le=3600)
    window_seconds: float = Field(1.0, gt=0, le=3600)
    windows: int = Field(8, ge=3, le=1000)
    trial_timeout_s: float = Field(300.0, gt=0, le=7 * 24 * 3600)
    # Before the pair counts: the max_pairs check needs it.
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    pairs: int = Field(6, ge=3, le=1000)
    # 40: at the pair noise of live arms on a 2-core CPU (log-ratio sd ~0.09) a true +10 %
    # change is adopted by a whole search in 93 % of runs, against 68-74 % with 20
    # (benchmarks/RESULTS.md); knobs without effect stop early for futility (about 16 sessions).
    max_pairs: int = Field(40, ge=3, le=1000)
    min_speedup: float = Field(0.03, ge=0.0, le=1.0)
    interval: Literal["hodges-lehmann", "t"] = "hodges-lehmann"
    # knob: a change without effect is adopted with chance <= (1 - confidence) / 2 per knob;
    # search: that budget is split over the search's knobs, so it bounds the whole search.
    error_scope: Literal["knob", "search"] = "knob"
    seed: int = Field(0, ge=0, le=2**31 - 1)
    # interleaved: live arms alternate timed windows; sequential: one fresh process per arm.
    session: Literal["interleaved", "sequential"] = "interleaved"
    # Steps of the profiled window that splits a step's time into phases, after the timed
    # windows of a diagnosed trial (the baseline, the final settings, ``trainopt measure``);
    # null: as many as one timed window; 0: no breakdown.
    breakdown_steps: int | None = Field(None, ge=0, le=100_000)
    # The search's wall-time budget in seconds (written as 20m, 1h30m, ...); null: none.
    time_budget: OptionalDuration = None

    @field_validator("max_pairs")
    @classmethod
    def _max_pairs(cls, v: int, info) -> int:
        pairs = info.data.get("pairs")
        if pairs is not None and v < pairs:
            raise ValueError(f"must be at least measure.pairs ({pairs})")
        confidence = info.data.get("confidence")
        if confidence is not None:
            from trainopt.stats.ranks import min_decidable_pairs

            # Fewer pairs can never reach the confidence with an exact rank interval:
            # every confirmation would end inconclusive.
            need = min_decidable_pairs(confidence)
            if v < need:
                raise ValueError(f"must be at least {need} for confidence {confidence}: fewer pairs can never confirm a change")
        return v


class LimitsSection(_Strict):
    """Limits every trial keeps to.

    Attributes:
        memory_gb: Memory cap per trial. On a CPU the trial process gets an address-space
            cap (RLIMIT_AS); on CUDA the device allocator gets the limit
            (``torch.cuda.set_per_process_memory_fraction``), since an address-space cap
            makes the CUDA driver fail. Either way a batch too large fails as out-of-memory.
        effective_batch: When set, ``batch_size x grad_accum`` is kept equal to it.
    """

    memory_gb: float | None = Field(None, gt=0, le=1_000_000)
    effective_batch: int | None = Field(None, ge=1, le=1_000_000_000)


class DistributedSection(_Strict):
    """Run every trial as a single-node data-parallel job under torchrun.

    ``batch_size`` is then per rank. One node per trial: multi-node jobs are not measured.
    """

    nproc_per_node: int = Field(ge=1, le=1024)
    backend: Literal["auto", "nccl", "gloo"] = "auto"


class BatchSearch(_Strict):
    """How the largest fitting batch is searched for."""

    max: int = Field(1024, ge=1, le=1_000_000_000)
    margin: float = Field(0.1, ge=0.0, lt=1.0)
    max_candidates: int = Field(4, ge=1, le=32)


class Spec(_Strict):
    """A validated experiment spec. Build it with ``load_spec`` or ``spec_from_dict``."""

    name: str = Field(min_length=1, max_length=200)
    device: str = "auto"
    model: ModelSection
    data: DataSection = DataSection()
    loss: str = DEFAULT_LOSS
    # Left out (name None): a LightningModule's configure_optimizers(), else DEFAULT_OPTIMIZER (in the trial).
    optimizer: OptimizerSection = OptimizerSection()
    baseline: dict[str, Any] = Field(default_factory=knobs.default_settings)
    search: dict[str, Any] = Field(default_factory=dict)
    search_order: Literal["guide", "as_written"] = "guide"
    measure: MeasureSection = MeasureSection()
    limits: LimitsSection = LimitsSection()
    distributed: DistributedSection | None = None
    run_costs: RunCostsSection | None = None
    check: CheckSection = CheckSection()
    run: RunSection | None = None
    # Deprecated: run.steps says the same.
    run_length_steps: int | None = Field(None, ge=1, le=10**12)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    # The user's forward and loss, ``step(model, batch) -> loss``; trainopt keeps the rest.
    step: str | None = None

    _source_dir: str = PrivateAttr(default=".")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not _DEVICE_RE.match(v):
            raise ValueError(f"{v!r} is not one of auto, cpu, cuda, cuda:N")
        return v

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str) -> str:
        return _ref_or_builtin(v, BUILTIN_LOSSES + (MODEL_LOSS,), "loss")

    @field_validator("step")
    @classmethod
    def _step(cls, v: str | None) -> str | None:
        return _reference_only(v, "a function step(model, batch) -> loss")

    def resolved(self) -> dict[str, Any]:
        """The spec with every default filled in, as plain data (YAML/JSON-ready).

        ``step``, ``run`` and ``run_length_steps`` appear only when set, so a spec that uses
        none of them resolves (and fingerprints) to the same plain data whether or not the
        version reading it knows these fields.
        """
        out = self.model_dump(mode="json")
        for key in ("step", "run", "run_length_steps"):
            if out.get(key) is None:
                out.pop(key, None)
        if "run" in out:
            out["run"] = {k: v for k, v in out["run"].items() if v is not None}
        if out["measure"].get("time_budget") is None:
            out["measure"].pop("time_budget")
        for key in ("collate", "datamodule", "name"):
            if out["data"].get(key) is None:
                out["data"].pop(key, None)
        if out["data"] == {"args": {}}:
            out.pop("data")  # left out: a LightningModule's train_dataloader() supplies it
        if out["optimizer"]["name"] is None:
            # Only a referenced model can be a LightningModule with its own optimizer.
            if out["model"]["name"] in BUILTIN_MODELS:
                out["optimizer"] = dict(DEFAULT_OPTIMIZER)
            else:
                out.pop("optimizer")
        return out

    def fingerprint(self) -> str:
        """A short content hash of the resolved spec; changes when the spec changes."""
        resolved = self.resolved()
        # Changing the checks after the search keeps the study's trials (a training run's key holds its steps).
        resolved.pop("check", None)
        # A left-out optimizer hashes as the default it was before it could come from the model.
        resolved.setdefault("optimizer", dict(DEFAULT_OPTIMIZER))
        # The budget bounds the search, not what a trial measures (a resume with another budget
        # reuses its trials); a spec silent on its run hashes as the length then assumed.
        resolved["measure"].pop("time_budget", None)
        if "run" not in resolved:
            resolved.setdefault("run_length_steps", DEFAULT_RUN_STEPS)
        blob = json.dumps(resolved, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    @property
    def world_size(self) -> int:
        """Processes per trial: ``distributed.nproc_per_node``, or 1 without a ``distributed`` block."""
        return self.distributed.nproc_per_node if self.distributed else 1

    @property
    def notes(self) -> list[str]:
        """Deprecated fields this spec uses, each with what to write instead."""
        return deprecation_notes(self.run_length_steps)

    @property
    def run_plan(self) -> RunSection | None:
        """The production run (``run_block.run_plan``)."""
        return run_plan(self.run, self.run_length_steps)

    @property
    def batch_search(self) -> BatchSearch:
        """The batch-size search settings (defaults when the spec does not search batch size)."""
        return self.search.get("batch_size") or BatchSearch()

    def source_dir(self) -> Path:
        """The folder user references resolve against (set by ``load_spec``)."""
        return Path(self._source_dir)


def _check_baseline(raw: Any, problems: list[str]) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        problems.append(f"baseline: got {_fmt_value(raw)}; expected a mapping of knob: value")
        return knobs.default_settings()
    out = knobs.default_settings()
    for name, value in raw.items():
        if name not in knobs.KNOBS:
            problems.append(f"baseline.{name}: unknown knob; known knobs: {', '.join(knobs.KNOBS)}")
            continue
        try:
            out[name] = knobs.coerce_value(name, value)
        except knobs.KnobValueError as exc:
            problems.append(f"baseline.{name}: {exc}")
    return out


def _check_search(raw: Any, problems: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        problems.append(f"search: got {_fmt_value(raw)}; expected a mapping of knob: candidates")
        return {}
    out: dict[str, Any] = {}
    for name, value in raw.items():
        path = f"search.{name}"
        if name not in knobs.KNOBS:
            problems.append(f"{path}: unknown knob; known knobs: {', '.join(knobs.KNOBS)}")
            continue
        if name == "batch_size":
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                problems.append(f"{path}: got {_fmt_value(value)}; expected a mapping like {{max: 1024}}")
                continue
            try:
                out[name] = BatchSearch(**value)
            except ValidationError as exc:
                problems.extend(_pydantic_problems(exc, prefix=path + "."))
            except TypeError:
                problems.append(f"{path}: keys must be strings")
            continue
        if not isinstance(value, list) or not value:
            problems.append(f"{path}: got {_fmt_value(value)}; expected a non-empty list of candidate values")
            continue
        values = []
        for i, item in enumerate(value):
            try:
                v = knobs.coerce_value(name, item)
            except knobs.KnobValueError as exc:
                problems.append(f"{path}[{i}]: {exc}")
                continue
            if v not in values:
                values.append(v)
        out[name] = values
    return out


def spec_from_dict(data: Any, source: str | None = None, source_dir: Path | None = None) -> Spec:
    """Validate plain data as a spec.

    Args:
        data: The parsed YAML document.
        source: The file name, used in error messages.
        source_dir: The folder that relative references resolve against.

    Raises:
        SpecError: Listing every problem found, each with its dotted field path.
    """
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else type(data).__name__
        raise SpecError([f"(top level): the document is {kind}; expected a mapping with model, data, ..."], source)
    problems: list[str] = []
    for key in data:
        if not isinstance(key, str):
            problems.append(f"{_fmt_value(key)}: keys must be strings")
    if problems:
        raise SpecError(problems, source)
    body = dict(data)
    if "name" not in body or body["name"] is None:
        body["name"] = Path(source).stem if source else "experiment"
    body["baseline"] = _check_baseline(body.get("baseline"), problems)
    body["search"] = _check_search(body.get("search"), problems)
    model = body.get("model")
    if body.get("data") is None and (not isinstance(model, Mapping) or model.get("name") in BUILTIN_MODELS):
        # Only a referenced model (a LightningModule) may bring its own data.
        problems.append("data: required field is missing")
    try:
        spec = Spec(**body)
    except ValidationError as exc:
        problems.extend(_pydantic_problems(exc))
        spec = None
    if spec is not None:
        problems.extend(_cross_checks(spec))
    if problems:
        raise SpecError(problems, source)
    spec._source_dir = str(source_dir or Path.cwd())
    return spec


def _data_checks(spec: Spec) -> list[str]:
    """``data.name`` or ``data.datamodule``, or neither for a model that may be a LightningModule."""
    d = spec.data
    if d.name is not None and d.datamodule is not None:
        return [f"data: got both name {d.name!r} and datamodule {d.datamodule!r}; keep one"]
    if d.name is None and d.datamodule is None and spec.model.name in BUILTIN_MODELS and "data" in spec.model_fields_set:
        return [f"data.name: required field is missing; model {spec.model.name!r} needs a data set "
                f"(only a LightningModule's train_dataloader() can stand in for it)"]
    problems = []
    if d.name is None and d.args and d.datamodule is None:
        problems.append("data.args: given without data.name or data.datamodule; name the factory they are for")
    if spec.optimizer.name is None and spec.optimizer.args:
        problems.append("optimizer.name: required field is missing; name the optimizer its args are for")
    return problems


def _cross_checks(spec: Spec) -> list[str]:
    """Rules between fields: step against loss, the effective batch against the baseline and the search."""
    problems = _data_checks(spec) + run_problems(spec.run, spec.run_length_steps)
    if spec.step is not None and spec.loss != DEFAULT_LOSS:
        problems.append(
            f"step: {spec.step!r} computes the loss itself, so loss {spec.loss!r} would never be used; "
            f"remove loss (or remove step and let loss compute it)"
        )
    eff = spec.limits.effective_batch
    b = spec.baseline
    if eff is not None:
        world = spec.world_size
        ranks = f" x {world} ranks" if spec.distributed else ""
        product = dist_mod.effective_batch(b, world)
        if product != eff:
            if eff % world:
                fix = f"with {world} ranks, use a limits.effective_batch that is a multiple of {world}"
            else:
                fix = dist_mod.divisor_fix(eff // world, b["batch_size"], "baseline.grad_accum")
                if world > 1:
                    fix += f" (per rank: limits.effective_batch {eff} / {world} ranks = {eff // world})"
            problems.append(
                f"baseline: batch_size {b['batch_size']} x grad_accum {b['grad_accum']}{ranks} = "
                f"{product}, but limits.effective_batch is {eff}; " + fix
            )
        values = spec.search.get("grad_accum")
        if values is not None:
            # The search changes one knob at a time, so a grad_accum candidate runs with the
            # incumbent's batch_size; only the value that already makes up the effective
            # batch keeps batch_size x grad_accum == effective_batch, and that one is no change.
            bad = [v for v in values if b["batch_size"] * v * world != eff]
            if bad:
                problems.append(
                    f"search.grad_accum: got {_fmt_value(values)}; with limits.effective_batch {eff}, "
                    f"grad_accum follows batch_size (grad_accum = {eff} / batch_size{ranks}), so "
                    f"{', '.join(str(v) for v in bad)} would give batch_size {b['batch_size']} x grad_accum{ranks} != {eff}; "
                    f"remove search.grad_accum (the batch_size stage sets grad_accum with each batch size) "
                    f"or remove limits.effective_batch"
                )
    reason = knobs.distributed_reason(b, spec.world_size if spec.distributed else None)
    if reason:
        problems.append(f"baseline: {reason}")
    bs = spec.search.get("batch_size")
    if bs is not None and bs.max < b["batch_size"]:
        problems.append(
            f"search.batch_size.max: got {bs.max}; must be at least baseline.batch_size ({b['batch_size']})"
        )
    return problems


def load_spec(path: str | Path) -> Spec:
    """Read and validate a YAML spec file.

    Raises:
        SpecError: For a missing or unreadable file, a YAML syntax error (with line and
            column) or any invalid field.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(["file not found"], str(path)) from None
    except IsADirectoryError:
        raise SpecError(["is a folder, not a YAML file"], str(path)) from None
    except OSError as exc:
        raise SpecError([f"cannot read the file ({exc.strerror})"], str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError([f"not UTF-8 text (byte {exc.start}); save the spec as UTF-8 YAML"], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise SpecError([f"YAML syntax error at {where}{exc.problem or exc}"], str(path)) from None
    except yaml.YAMLError as exc:
        raise SpecError([f"YAML error: {exc}"], str(path)) from None
    except RecursionError:
        raise SpecError(["YAML nesting is too deep"], str(path)) from None
    return spec_from_dict(data, source=str(path), source_dir=path.resolve().parent)


def parse_set(items: list[str]) -> dict[str, Any]:
    """Parse ``--set knob=value`` strings; values are read as YAML scalars.

    Raises:
        SpecError: For a malformed item, an unknown knob or a bad value.
    """
    out: dict[str, Any] = {}
    problems = []
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            problems.append(f"--set {item!r}: expected knob=value, e.g. --set batch_size=64")
            continue
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        if name not in knobs.KNOBS:
            problems.append(f"--set {name}: unknown knob; known knobs: {', '.join(knobs.KNOBS)}")
            continue
        try:
            out[name] = knobs.coerce_value(name, value)
        except knobs.KnobValueError as exc:
            problems.append(f"--set {name}: {exc}")
    if problems:
        raise SpecError(problems)
    return out


def apply_overrides(spec: Spec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The baseline settings with ``overrides`` applied (already validated values)."""
    settings = dict(spec.baseline)
    settings.update(overrides)
    return settings

