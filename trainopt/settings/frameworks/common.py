"""What both frameworks' arguments share: the DDP knobs' keywords and the knobs only a script can set."""

from __future__ import annotations

from typing import Any

from trainopt.knobs import kwargs as apply
from trainopt.knobs.catalog import format_value
from trainopt.settings.frameworks.records import Argument, Unexpressed, note
from trainopt.settings.record import SettingsRecord

__all__ = ["BUFFER_KWARGS", "ddp_keywords", "device_note", "left", "measured_optimizer", "optimizer_text", "script_only"]

# The DistributedDataParallel keyword for ddp_broadcast_buffers: PyTorch 2.13 renamed it
# (the old name still works but warns on every wrap, and also skips the start-up sync).
BUFFER_KWARGS = ("forward_sync_buffers", "broadcast_buffers")


def left(record: SettingsRecord, name: str, why: str) -> Argument:
    """A comment-only line: the knob stays at the framework's default, and why."""
    return Argument(None, None, (name,), f"{note(record.settings, name)} -> {why}")


def device_note(record: SettingsRecord, device_type: str) -> str:
    """``device: auto, measured on cpu``: the device field and what it was measured on."""
    text = f"device: {record.device}"
    return text if record.device.startswith(device_type) else f"{text}, measured on {device_type}"


def ddp_keywords(record: SettingsRecord, buffer_kwarg: str) -> list[tuple[str, str, Any]]:
    """``(knob, keyword, value)`` for the DDP knobs the search established, in catalog order.

    The rest equal DistributedDataParallel's own defaults (the catalog's defaults are
    DDP's), so leaving them out runs as measured.

    Args:
        record: The settings.
        buffer_kwarg: DDP's keyword for the buffer broadcast in the installed torch (one of ``BUFFER_KWARGS``).
    """
    kwargs = apply.ddp_kwargs(record.settings, forward_sync_buffers=buffer_kwarg == "forward_sync_buffers")
    names = {v: k for k, v in apply.DDP_KWARGS.items()}
    names["forward_sync_buffers"] = "ddp_broadcast_buffers"
    return [(names[kw], kw, value) for kw, value in kwargs.items() if names[kw] in record.established]


def script_only(record: SettingsRecord, framework: str, device_type: str) -> tuple[list[Unexpressed], list[Argument]]:
    """Threads, backend flags and channels-last: set by the training script, not by a framework argument.

    Args:
        record: The settings.
        framework: ``lightning`` or ``hf``.
        device_type: ``cpu`` or ``cuda``: what the settings were measured on.

    Returns:
        The unexpressed records of the established ones, and comment lines for the rest.
    """
    v = record.settings
    label = {"lightning": "the Trainer", "hf": "TrainingArguments"}[framework]
    out: list[Unexpressed] = []
    quiet: list[Argument] = []
    if v["threads"] is not None:
        out.append(Unexpressed("threads", format_value(v["threads"]), f"{label} has no argument for the intra-op thread count",
                               f"call torch.set_num_threads({v['threads']}) (or s.apply_backend_flags()) before training"))
    else:
        quiet.append(left(record, "threads", "PyTorch's default thread count"))
    if "channels_last" in record.established and v["channels_last"]:
        out.append(Unexpressed("channels_last", "true", f"{label} has no argument for the memory format",
                               "convert the model with model.to(memory_format=torch.channels_last) before training, and 4-D "
                               "inputs with x.contiguous(memory_format=torch.channels_last) (s.to_device does both for a batch)"))
    else:
        quiet.append(left(record, "channels_last", "the default memory format"))
    if framework == "hf" and v["cudnn_benchmark"]:
        out.append(Unexpressed("cudnn_benchmark", "true", "TrainingArguments has no field for cuDNN's algorithm search",
                               "set torch.backends.cudnn.benchmark = True (or call s.apply_backend_flags()) before training"))
    if framework == "lightning" and v["tf32"] is not None:
        out.append(Unexpressed("tf32", format_value(v["tf32"]), "the Trainer has no TF32 argument",
                               f"set torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32 to {v['tf32']} "
                               "(or call s.apply_backend_flags()) before training"
                               + ("" if device_type == "cuda" else "; it changes nothing on a CPU")))
    elif framework == "lightning":
        quiet.append(left(record, "tf32", "PyTorch's TF32 defaults (cuDNN convolutions on, matmuls off)"))
    return out, quiet


def measured_optimizer(record: SettingsRecord) -> dict[str, Any] | None:
    """best.yaml's ``code.optimizer``: the optimizer the trials built (``source``, ``name``, ``class``, ``args``), or None."""
    found = (record.code or {}).get("optimizer")
    return dict(found) if found else None


def optimizer_text(optimizer: dict[str, Any], settings: Any, params: str = "params") -> str:
    """The measured optimizer as one call, kernels included: ``torch.optim.SGD(params, lr=0.1, foreach=True)``."""
    name = optimizer.get("name")
    call = name if optimizer.get("source", "spec") == "spec" and name and ":" in name else optimizer.get("class") or name
    kwargs = {**(optimizer.get("args") or {}), **apply.optimizer_kwargs(settings["optimizer_impl"])}
    text = "".join(f", {k}={tuple(v) if isinstance(v, list) else v!r}" for k, v in kwargs.items())
    return f"{call}({params}{text})"
