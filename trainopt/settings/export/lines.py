"""The lines the code exports share: backend flags, the DataLoader, the model, DDP and knob comments.

Every value comes from ``trainopt.knobs.kwargs``' data, the same data the trial applied.
Each knob a line carries is named in a comment beside it (``# name: value``, as written in
best.yaml), so no measured setting is silently lost on the way into a training script.
"""

from __future__ import annotations

from typing import Any

from trainopt.knobs import kwargs as apply
from trainopt.knobs.catalog import format_value
from trainopt.settings.production import TrainSettings

__all__ = [
    "backend_expr",
    "backend_lines",
    "compile_call",
    "ddp_kwarg_lines",
    "ddp_unused",
    "device_type",
    "knob",
    "loader_comment",
    "loader_kwargs",
    "loader_leftovers",
    "loader_lines",
    "model_format_line",
    "optimizer_args",
    "optimizer_lines",
    "import_of",
]

# Names the torch loop itself uses: a user function named like one of them is imported under another.
LOOP_NAMES = {"step", "batch", "loss", "model", "loader", "optimizer", "device", "scaler", "grad_accum", "to_device",
              "output", "sys"}

# Which knob each backend flag carries, for the comment beside its line.
_FLAG_KNOB = {
    "torch.backends.cudnn.benchmark": "cudnn_benchmark",
    "torch.backends.cuda.matmul.allow_tf32": "tf32",
    "torch.backends.cudnn.allow_tf32": "tf32",
}
# DataLoader keyword -> the knob it carries (None: no knob; every batch the same shape).
_LOADER_KNOB = {
    "batch_size": "batch_size",
    "num_workers": "num_workers",
    "pin_memory": "pin_memory",
    "drop_last": None,
    "persistent_workers": "persistent_workers",
    "prefetch_factor": "prefetch_factor",
}


def knob(s: TrainSettings, name: str) -> str:
    """``name: value`` as written in best.yaml, for comments."""
    return f"{name}: {format_value(s.settings[name])}"


def ddp_unused(s: TrainSettings) -> str:
    """The comment naming the DDP knobs of single-process settings, so none is silently absent."""
    return "# " + ", ".join(knob(s, k) for k in apply.DDP_KWARGS) + " -> measured as one process (no distributed block)"


def ddp_kwarg_lines(s: TrainSettings, indent: str) -> list[str]:
    """``argument=value,  # knob: value`` for every DDP knob, from the applier's own arguments."""
    from trainopt.settings.production import ddp_buffer_kwarg

    # The buffer argument under the name the installed torch takes (the old one warns on 2.13+).
    renamed = ddp_buffer_kwarg() == "forward_sync_buffers"
    kwargs = apply.ddp_kwargs(s.settings, forward_sync_buffers=renamed)
    lines = []
    for name, kwarg in apply.DDP_KWARGS.items():
        if kwarg == "broadcast_buffers" and renamed:
            kwarg = "forward_sync_buffers"
        if kwarg not in kwargs:
            lines.append(f"{indent}# {knob(s, name)} -> PyTorch's default bucket size (25 MB)")
        else:
            lines.append(f"{indent}{kwarg}={kwargs[kwarg]!r},  # {knob(s, name)}")
    return lines


def backend_expr(s: TrainSettings) -> str:
    """The process-group backend as a Python expression (``auto``: nccl on CUDA, gloo otherwise)."""
    backend = s.distributed["backend"]
    if backend == "auto":
        return '"nccl" if torch.cuda.is_available() else "gloo"'
    return f'"{backend}"'


def device_type(s: TrainSettings) -> str:
    """``cuda`` or ``cpu``: the device type the settings name."""
    return apply.device_type_of(s.device)


def loader_kwargs(s: TrainSettings) -> dict[str, Any]:
    """The DataLoader keyword arguments the trial used."""
    return apply.loader_kwargs(s.settings, device_type(s))


def loader_comment(s: TrainSettings, key: str) -> str:
    """The comment beside one DataLoader keyword: the knob it carries, or why it is there."""
    name = _LOADER_KNOB[key]
    if name is None:
        return "every batch the same shape, as measured (a compiled model would recompile)"
    if key == "pin_memory" and s.settings["pin_memory"] and not apply.pins_memory(s.settings, device_type(s)):
        return f"{knob(s, name)}, but pinning helps CUDA copies only"
    return knob(s, name)


def loader_leftovers(s: TrainSettings, kwargs: dict[str, Any]) -> list[str]:
    """Comments for the input knobs the loader does not take with these settings."""
    missing = [name for name in ("persistent_workers", "prefetch_factor") if name not in kwargs]
    if not missing:
        return []
    if s.settings["num_workers"] == 0:
        return [f"# {', '.join(knob(s, n) for n in missing)}: apply only with num_workers > 0"]
    return [f"# {knob(s, 'prefetch_factor')} -> DataLoader's default"]


def loader_lines(s: TrainSettings, indent: str, sampler: bool = False) -> list[str]:
    """The DataLoader keyword lines, every input knob present as code or comment."""
    kwargs = loader_kwargs(s)
    lines = [f"{indent}sampler=sampler,  # the sampler shuffles; no shuffle=True" if sampler else f"{indent}shuffle=True,"]
    lines += [f"{indent}{key}={value!r},  # {loader_comment(s, key)}" for key, value in kwargs.items()]
    return lines + [indent + line for line in loader_leftovers(s, kwargs)]


def backend_lines(s: TrainSettings) -> list[str]:
    """Threads and every backend flag, as the trial set them."""
    if s.settings["threads"] is not None:
        lines = [f"torch.set_num_threads({s.settings['threads']})  # {knob(s, 'threads')}"]
    else:
        lines = [f"# {knob(s, 'threads')} -> PyTorch's default thread count"]
    lines += [f"{flag} = {value}  # {knob(s, _FLAG_KNOB[flag])}" for flag, value in apply.backend_flags(s.settings).items()]
    if s.settings["tf32"] is None:
        lines.append(f"# {knob(s, 'tf32')} -> PyTorch's TF32 defaults (cuDNN convolutions on, matmuls off)")
    return lines


def compile_call(s: TrainSettings) -> str:
    """The ``torch.compile`` line, with the measured mode."""
    _, mode = apply.compile_mode(s.settings)
    arg = f", mode={mode!r}".replace("'", '"') if mode else ""
    return f"model = torch.compile(model{arg})  # {knob(s, 'compile')}"


def model_format_line(s: TrainSettings) -> str:
    """The channels-last line, or the comment that the default memory format was measured."""
    if s.settings["channels_last"]:
        return f"model = model.to(memory_format=torch.channels_last)  # {knob(s, 'channels_last')}"
    return f"# {knob(s, 'channels_last')} -> default memory format"


def optimizer_args(s: TrainSettings) -> str:
    """``, foreach=True`` or ``, fused=True`` for an optimizer call, or nothing."""
    return "".join(f", {k}={v}" for k, v in apply.optimizer_kwargs(s.settings["optimizer_impl"]).items())


def import_of(ref: str, field: str, alias: str) -> tuple[str, list[str]]:
    """(the expression that names the callable, the lines that import it) for a reference.

    A ``path/file.py:callable`` is imported from its folder, relative to the working
    directory as ``load_settings`` resolves ``code.collate``, so the pasted script runs as is.
    """
    target, _, attr = ref.rpartition(":")
    head, _, rest = attr.partition(".")
    name = alias if head in LOOP_NAMES else head
    call = f"{name}.{rest}" if rest else name
    imported = f"{head} as {name}" if name != head else head
    if target.endswith(".py") or "/" in target or "\\" in target:
        folder, _, file = target.replace("\\", "/").rpartition("/")
        module = file[:-3] if file.endswith(".py") else file
        return call, [
            f"import sys  # {field}: {ref}, imported from its folder (relative to the working directory)",
            f"sys.path.insert(0, {folder or '.'!r})",
            f"from {module} import {imported}",
        ]
    return call, [f"from {target} import {imported}  # {field}: {ref}"]


def _value(value: Any) -> str:
    """A keyword argument's value as Python source: lists (YAML's tuples, such as betas) as tuples."""
    if isinstance(value, list):
        return repr(tuple(value))
    return repr(value)


def optimizer_lines(s: TrainSettings, params: str = "model.parameters()") -> tuple[list[str], list[str]]:
    """(imports, the lines that build the optimizer) as the trials built it, with the measured kernels.

    From best.yaml's ``code.optimizer``: the spec's optimizer factory or class with its
    arguments, trainopt's default, or the class and arguments a LightningModule's
    ``configure_optimizers()`` built; without that record, a placeholder to replace.
    """
    record = (s.code or {}).get("optimizer")
    impl = knob(s, "optimizer_impl")
    if not record:
        return [], [f"optimizer = torch.optim.SGD({params}, lr=0.1{optimizer_args(s)})  "
                    f"# your optimizer (best.yaml names none); {impl}"]
    args = "".join(f", {k}={_value(v)}" for k, v in (record.get("args") or {}).items())
    name, cls, source = record.get("name"), record.get("class"), record.get("source", "spec")
    imports: list[str] = []
    if source == "spec" and name and ":" in name:
        call, imports = import_of(name, "optimizer.name", "make_optimizer")
        why = f"optimizer: {name}, as measured"
    elif cls:
        call = cls
        module = cls.rpartition(".")[0]
        if module and module.split(".")[0] != "torch":
            imports = [f"import {module}  # the optimizer's class, as measured"]
        why = {"spec": f"optimizer: {name}, as measured", "default": "trainopt's default optimizer, as measured",
               "configure_optimizers": "what configure_optimizers() built, as measured"}.get(source, "as measured")
    else:
        return [], [f"optimizer = torch.optim.SGD({params}, lr=0.1{optimizer_args(s)})  "
                    f"# your optimizer ({name!r} was measured); {impl}"]
    lines = [f"optimizer = {call}({params}{args}{optimizer_args(s)})  # {why}; {impl}"]
    if source == "configure_optimizers":
        lines.append("# (its learning-rate schedulers, if configure_optimizers() returns any, step as your loop steps them)")
    return imports, lines
