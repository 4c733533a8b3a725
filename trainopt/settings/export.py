"""``trainopt export``: the winning settings as text to paste into a training script.

Formats: plain PyTorch (``torch``), PyTorch Lightning (``lightning``), Hugging Face
``TrainingArguments`` (``hf``) and ``best.yaml`` itself (``yaml``). Every output starts
with where the settings were measured and how much faster they were, and names every
knob: as code where the target can express it, otherwise as a comment saying what to do,
so no measured setting is silently lost on the way into a training script.

The code is rendered from ``trainopt.knobs.kwargs``' data (backend flags, DataLoader keyword
arguments, compile mode, autocast dtype, optimizer keyword arguments), the same data the
trial applied, so every value that differs from PyTorch's default comes out as code. The
backend flags are always written as code: PyTorch's own TF32 defaults differ between
matmuls (off) and cuDNN (on), so leaving either out would not reproduce what was measured.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import yaml

from trainopt.contract import distributed as dist_mod
from trainopt.errors import UserError
from trainopt.knobs import kwargs as apply
from trainopt.knobs.catalog import KNOBS, format_value
from trainopt.settings.production import SETTINGS_KIND, SETTINGS_SCHEMA_VERSION, TrainSettings, load_settings

__all__ = ["ExportError", "FORMATS", "render_export", "render_settings"]


class ExportError(UserError):
    """Nothing to export at the given path, or an unknown format."""


# Which knob each backend flag carries, for the comment beside its line.
_FLAG_KNOB = {
    "torch.backends.cudnn.benchmark": "cudnn_benchmark",
    "torch.backends.cuda.matmul.allow_tf32": "tf32",
    "torch.backends.cudnn.allow_tf32": "tf32",
}
# DataLoader keyword -> (knob, TrainingArguments keyword).
_LOADER_ARGS = {
    "batch_size": ("batch_size", "per_device_train_batch_size"),
    "num_workers": ("num_workers", "dataloader_num_workers"),
    "pin_memory": ("pin_memory", "dataloader_pin_memory"),
    "drop_last": (None, "dataloader_drop_last"),
    "persistent_workers": ("persistent_workers", "dataloader_persistent_workers"),
    "prefetch_factor": ("prefetch_factor", "dataloader_prefetch_factor"),
}
_LIGHTNING_PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
# ddp_* knob -> its TrainingArguments field (None: TrainingArguments has none; listed as a comment).
# Plain torch and Lightning's DDPStrategy take apply.DDP_KWARGS' DistributedDataParallel arguments.
_HF_DDP_ARGS = {
    "ddp_bucket_cap_mb": "ddp_bucket_cap_mb",
    "ddp_gradient_as_bucket_view": None,
    "ddp_static_graph": None,
    "ddp_find_unused_parameters": "ddp_find_unused_parameters",
    "ddp_broadcast_buffers": "ddp_broadcast_buffers",
}


def _one_line(value: Any) -> str:
    # Header text comes from the file; a newline in it must not end the comment and
    # turn the rest into code in the pasted snippet.
    return re.sub(r"\s+", " ", str(value)).strip()


def _knob(s: TrainSettings, name: str) -> str:
    """``name: value`` as written in best.yaml, for comments."""
    return f"{name}: {format_value(s.settings[name])}"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _header(s: TrainSettings, source: str) -> list[str]:
    p = s.provenance
    env = p.get("env") if isinstance(p.get("env"), dict) else {}
    lines = [f"# trainopt settings from {_one_line(source)}"]
    if not p:
        lines.append("# measured on: unknown (the file has no provenance section)")
    else:
        where = str(env.get("device_name") or "unknown device")
        if env.get("device_type"):
            where += f" ({env['device_type']})"
        if env.get("torch"):
            where += f", torch {env['torch']}"
        lines.append(f"# measured on: {_one_line(where)}")
        if p.get("search") or p.get("measured_at"):
            lines.append(f"# search: {_one_line(p.get('search') or '?')}, finished {_one_line(p.get('measured_at') or '?')}")
        speedup = _number(p.get("speedup"))
        if speedup is not None:
            text = f"# speedup: {speedup:.2f}x over the baseline"
            ci = p.get("speedup_ci")
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_number(c) is not None for c in ci):
                text += f" (interval {float(ci[0]):.2f}x to {float(ci[1]):.2f}x)"
            if p.get("verdict"):
                text += f", verdict: {_one_line(p['verdict'])}"
            lines.append(text)
        if p.get("complete") is False:
            lines.append("# note: the search did not finish; these are the best settings confirmed so far")
    if s.lr_scale_hint:
        lines.append(f"# learning rate: {_one_line(s.lr_scale_hint)}")
    lines.append(f"# device: {s.device}")
    if s.distributed:
        n = s.distributed["nproc_per_node"]
        lines.append(
            f"# data parallel: {n} processes on one node, batch_size per process "
            f"(effective batch {dist_mod.effective_batch(s.settings, n)} = batch_size x grad_accum x {n})"
        )
        lines.append(f"# launch: {s.launch_command()}")
    return lines


def _ddp_unused(s: TrainSettings) -> str:
    """The comment naming the DDP knobs of single-process settings, so none is silently absent."""
    return "# " + ", ".join(_knob(s, k) for k in apply.DDP_KWARGS) + " -> measured as one process (no distributed block)"


def _ddp_kwarg_lines(s: TrainSettings, indent: str) -> list[str]:
    """``argument=value,  # knob: value`` for every DDP knob, from the applier's own arguments."""
    kwargs = apply.ddp_kwargs(s.settings)
    lines = []
    for knob, kwarg in apply.DDP_KWARGS.items():
        if kwarg not in kwargs:
            lines.append(f"{indent}# {_knob(s, knob)} -> PyTorch's default bucket size (25 MB)")
        elif kwarg == "broadcast_buffers":
            lines.append(f"{indent}{kwarg}={kwargs[kwarg]!r},  # {_knob(s, knob)} (PyTorch 2.13+ names it forward_sync_buffers)")
        else:
            lines.append(f"{indent}{kwarg}={kwargs[kwarg]!r},  # {_knob(s, knob)}")
    return lines


def _backend_expr(s: TrainSettings) -> str:
    backend = s.distributed["backend"]
    if backend == "auto":
        return '"nccl" if torch.cuda.is_available() else "gloo"'
    return f'"{backend}"'


def _hf_ddp(s: TrainSettings) -> list[str]:
    """TrainingArguments' DDP fields; the knobs it has no field for are listed as comments."""
    if not s.distributed:
        return [_ddp_unused(s)]
    backend = s.distributed["backend"]
    if backend == "auto":
        lines = ["# distributed.backend: auto -> the Trainer picks nccl on CUDA, gloo on CPU"]
    else:
        lines = [f'ddp_backend="{backend}",  # distributed.backend: {backend}']
    kwargs = apply.ddp_kwargs(s.settings)
    missing = []
    for knob, field in _HF_DDP_ARGS.items():
        kwarg = apply.DDP_KWARGS[knob]
        if field is None:
            missing.append(knob)
        elif kwarg not in kwargs:
            lines.append(f"# {_knob(s, knob)} -> PyTorch's default bucket size (25 MB)")
        else:
            lines.append(f"{field}={kwargs[kwarg]!r},  # {_knob(s, knob)}")
    lines.append(
        f"# {', '.join(_knob(s, k) for k in missing)} -> TrainingArguments has no field for these; "
        "pass them to DistributedDataParallel through accelerate's DistributedDataParallelKwargs"
    )
    return lines


def _device_type(s: TrainSettings) -> str:
    return apply.device_type_of(s.device)


def _loader_kwargs(s: TrainSettings) -> dict[str, Any]:
    return apply.loader_kwargs(s.settings, _device_type(s))


def _loader_comment(s: TrainSettings, key: str) -> str:
    knob = _LOADER_ARGS[key][0]
    if knob is None:
        return "every batch the same shape, as measured (a compiled model would recompile)"
    if key == "pin_memory" and s.settings["pin_memory"] and not apply.pins_memory(s.settings, _device_type(s)):
        return f"{_knob(s, knob)}, but pinning helps CUDA copies only"
    return _knob(s, knob)


def _loader_leftovers(s: TrainSettings, kwargs: dict[str, Any]) -> list[str]:
    """Comments for the input knobs the loader does not take with these settings."""
    missing = [name for name in ("persistent_workers", "prefetch_factor") if name not in kwargs]
    if not missing:
        return []
    if s.settings["num_workers"] == 0:
        return [f"# {', '.join(_knob(s, n) for n in missing)}: apply only with num_workers > 0"]
    return [f"# {_knob(s, 'prefetch_factor')} -> DataLoader's default"]


def _loader_lines(s: TrainSettings, indent: str, sampler: bool = False) -> list[str]:
    """The DataLoader keyword lines, every input knob present as code or comment."""
    kwargs = _loader_kwargs(s)
    lines = [f"{indent}sampler=sampler,  # the sampler shuffles; no shuffle=True" if sampler else f"{indent}shuffle=True,"]
    lines += [f"{indent}{key}={value!r},  # {_loader_comment(s, key)}" for key, value in kwargs.items()]
    return lines + [indent + line for line in _loader_leftovers(s, kwargs)]


def _backend_lines(s: TrainSettings) -> list[str]:
    """Threads and every backend flag, as the trial set them."""
    if s.settings["threads"] is not None:
        lines = [f"torch.set_num_threads({s.settings['threads']})  # {_knob(s, 'threads')}"]
    else:
        lines = [f"# {_knob(s, 'threads')} -> PyTorch's default thread count"]
    lines += [f"{flag} = {value}  # {_knob(s, _FLAG_KNOB[flag])}" for flag, value in apply.backend_flags(s.settings).items()]
    if s.settings["tf32"] is None:
        lines.append(f"# {_knob(s, 'tf32')} -> PyTorch's TF32 defaults (cuDNN convolutions on, matmuls off)")
    return lines


def _compile_call(s: TrainSettings) -> str:
    _, mode = apply.compile_mode(s.settings)
    arg = f", mode={mode!r}".replace("'", '"') if mode else ""
    return f"model = torch.compile(model{arg})  # {_knob(s, 'compile')}"


def _model_format_line(s: TrainSettings) -> str:
    if s.settings["channels_last"]:
        return f"model = model.to(memory_format=torch.channels_last)  # {_knob(s, 'channels_last')}"
    return f"# {_knob(s, 'channels_last')} -> default memory format"


def _optimizer_args(s: TrainSettings) -> str:
    return "".join(f", {k}={v}" for k, v in apply.optimizer_kwargs(s.settings["optimizer_impl"]).items())


def _amp_dtype(s: TrainSettings) -> str | None:
    name = apply.AMP_DTYPES[s.settings["amp"]]
    return f"torch.{name}" if name else None


def _device_expr(s: TrainSettings) -> str:
    if s.device == "auto":
        return 'torch.device("cuda" if torch.cuda.is_available() else "cpu")'
    return f'torch.device("{s.device}")'


def _render_torch(s: TrainSettings, header: list[str]) -> str:
    v = s.settings
    accum, every = v["grad_accum"], v["sync_every"]
    fp16 = v["amp"] == "fp16"
    ddp = bool(s.distributed)
    lines = header + ["import torch", "from torch.utils.data import DataLoader"]
    if ddp:
        lines += [
            "import contextlib",
            "import gc",
            "import os",
            "import torch.distributed as dist",
            "from torch.nn.parallel import DistributedDataParallel",
            "from torch.utils.data.distributed import DistributedSampler",
            "",
            f"dist.init_process_group({_backend_expr(s)})  # distributed.backend: {s.distributed['backend']}",
        ]
        if s.device == "cpu":
            lines.append(f'device = torch.device("cpu")  # device: {s.device}')
        else:
            lines.append(
                'device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() '
                f'else torch.device("cpu")  # device: {s.device}, one GPU per process'
            )
    else:
        lines += ["", f"device = {_device_expr(s)}  # device: {s.device}"]
    lines += [*_backend_lines(s), ""]
    if ddp:
        sampler_args = ", ".join(f"{k}={val!r}" for k, val in apply.sampler_kwargs(0).items())
        lines.append(f"sampler = DistributedSampler(dataset, {sampler_args})  # each process reads its own shard")
    lines += [
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *_loader_lines(s, "    ", sampler=ddp),
        ")",
        "",
        "model = model.to(device)  # your nn.Module",
    ]
    lines.append(_model_format_line(s))
    lines.append("model.train()")
    if ddp:
        lines += [
            "model = DistributedDataParallel(",
            "    model,",
            '    device_ids=[device.index] if device.type == "cuda" else None,',
            *_ddp_kwarg_lines(s, "    "),
            ")",
        ]
    lines.append(
        f"optimizer = torch.optim.SGD(model.parameters(), lr=0.1{_optimizer_args(s)})  "
        f"# your optimizer; {_knob(s, 'optimizer_impl')}"
    )
    if v["compile"] != "off":
        lines.append(_compile_call(s))
    else:
        lines.append(f"# {_knob(s, 'compile')} -> not compiled")
    if not ddp:
        lines.append(_ddp_unused(s))
    if fp16:
        lines.append(f"scaler = torch.amp.GradScaler(device.type)  # {_knob(s, 'amp')} needs loss scaling")
    lines += [f"grad_accum = {accum}  # {_knob(s, 'grad_accum')}", ""]
    if ddp:
        lines.append("# at the start of every epoch: sampler.set_epoch(epoch), so each epoch shuffles anew, as measured")
    lines.append("for step, (x, y) in enumerate(loader):")
    if apply.pins_memory(v, _device_type(s)):
        lines += [
            "    x = x.to(device, non_blocking=True)  # from pinned memory",
            "    y = y.to(device, non_blocking=True)",
        ]
    else:
        lines += ["    x = x.to(device)", "    y = y.to(device)"]
    if v["channels_last"]:
        lines.append("    x = x.contiguous(memory_format=torch.channels_last)  # 4-D inputs only")
    body = []
    if v["amp"] != "off":
        body.append(f"    with torch.autocast(device.type, dtype={_amp_dtype(s)}):  # {_knob(s, 'amp')}")
        body.append("        loss = loss_fn(model(x), y)  # your loss")
    else:
        body.append(f"    loss = loss_fn(model(x), y)  # your loss; {_knob(s, 'amp')} (full precision)")
    divided = "loss / grad_accum" if accum > 1 else "loss"
    if fp16:
        body.append(f"    scaler.scale({divided}).backward()")
    else:
        body.append(f"    ({divided}).backward()" if accum > 1 else "    loss.backward()")
    if ddp and accum > 1:
        # Forward and backward both inside no_sync(): DDP decides in forward whether backward all-reduces.
        lines.append("    sync = (step + 1) % grad_accum == 0  # accumulation steps skip the gradient all-reduce")
        lines.append("    with contextlib.nullcontext() if sync else model.no_sync():")
        body = ["    " + line for line in body]
    lines += body
    lines.append("    if (step + 1) % grad_accum == 0:")
    if fp16:
        lines += ["        scaler.step(optimizer)", "        scaler.update()"]
    else:
        lines.append("        optimizer.step()")
    lines.append("        optimizer.zero_grad(set_to_none=True)")
    if every:
        lines += [
            f"        if ((step + 1) // grad_accum) % {every} == 0:  # {_knob(s, 'sync_every')} optimizer steps",
            "            print(f\"step {(step + 1) // grad_accum}: loss {loss.item():.4f}\")  # .item() waits for the device",
        ]
    else:
        lines.append(f"    # {_knob(s, 'sync_every')} -> the loss was never read during training (no loss.item())")
    if ddp:
        lines += [
            "",
            "# at the end: free DDP's reducer before the process group (left to interpreter exit,",
            "# gloo can abort a rank that finished, and torchrun then reports the job as failed)",
            "del model, optimizer",
            "gc.collect()",
            "dist.destroy_process_group()",
        ]
    return "\n".join(lines) + "\n"


def _lightning_device(s: TrainSettings) -> list[str]:
    note = f"# device: {s.device}"
    if s.device == "auto":
        return [f'    accelerator="auto",  {note}', "    devices=1,"]
    if s.device == "cpu":
        return [f'    accelerator="cpu",  {note}', "    devices=1,"]
    index = s.device.partition(":")[2]
    return [f'    accelerator="gpu",  {note}', f"    devices=[{index}]," if index else "    devices=1,"]


def _lightning_sync(s: TrainSettings) -> list[str]:
    if s.settings["sync_every"]:
        return [f"log_every_n_steps={s.settings['sync_every']},  # {_knob(s, 'sync_every')}"]
    return [f"# {_knob(s, 'sync_every')} -> the loss was never read during training; log rarely and keep prog_bar=False in self.log"]


def _hf_amp(s: TrainSettings) -> list[str]:
    amp = s.settings["amp"]
    if amp == "bf16":
        return [f"bf16=True,  # {_knob(s, 'amp')}"]
    if amp == "fp16":
        return [f"fp16=True,  # {_knob(s, 'amp')} (the Trainer adds the GradScaler)"]
    return [f"# {_knob(s, 'amp')} -> leave bf16 and fp16 False (full precision)"]


def _hf_compile(s: TrainSettings) -> list[str]:
    compiled, mode = apply.compile_mode(s.settings)
    if not compiled:
        return [f"# {_knob(s, 'compile')} -> leave torch_compile False"]
    return [f"torch_compile=True,  # {_knob(s, 'compile')}"] + ([f'torch_compile_mode="{mode}",'] if mode else [])


def _hf_sync(s: TrainSettings) -> list[str]:
    if s.settings["sync_every"]:
        return [f"logging_steps={s.settings['sync_every']},  # {_knob(s, 'sync_every')}"]
    return [f'logging_strategy="no",  # {_knob(s, "sync_every")}: the loss was never read during training']


def _hf_optimizer(s: TrainSettings) -> list[str]:
    impl = s.settings["optimizer_impl"]
    if impl == "fused":
        return [f'optim="adamw_torch_fused",  # {_knob(s, "optimizer_impl")}; for another optimizer pass fused=True to its constructor']
    if impl == "foreach":
        return [f"# {_knob(s, 'optimizer_impl')} -> the default adamw_torch uses foreach kernels on CUDA; for your own optimizer pass foreach=True"]
    return [f"# {_knob(s, 'optimizer_impl')} -> the default optimizer implementation"]


def _lightning_optimizer(s: TrainSettings) -> list[str]:
    extra = _optimizer_args(s).lstrip(", ")
    what = f"pass {extra} to your optimizer in configure_optimizers()" if extra else "default optimizer arguments"
    return [f"# {_knob(s, 'optimizer_impl')} -> {what}"]


# How each knob that a trainer takes as an argument is written for it, once per knob:
# (Lightning's Trainer, Hugging Face's TrainingArguments). None: the knob is written
# elsewhere for that framework (backend flags and the loader above, compile for Lightning).
_TRAINER_ARGS: dict[str, tuple[Callable[[TrainSettings], list[str]] | None, Callable[[TrainSettings], list[str]] | None]] = {
    "amp": (
        lambda s: [f'precision="{_LIGHTNING_PRECISION[s.settings["amp"]]}",  # {_knob(s, "amp")}'],
        _hf_amp,
    ),
    "grad_accum": (
        lambda s: [f"accumulate_grad_batches={s.settings['grad_accum']},  # {_knob(s, 'grad_accum')}"],
        lambda s: [f"gradient_accumulation_steps={s.settings['grad_accum']},  # {_knob(s, 'grad_accum')}"],
    ),
    # Lightning sets cudnn.benchmark from its argument, so it repeats the flag set above.
    "cudnn_benchmark": (lambda s: [f"benchmark={s.settings['cudnn_benchmark']},  # {_knob(s, 'cudnn_benchmark')}"], None),
    # The Trainer sets the matmul TF32 flag from this argument; the lines above set both flags.
    "tf32": (None, lambda s: [f"tf32={s.settings['tf32']},  # {_knob(s, 'tf32')}"]),
    "sync_every": (_lightning_sync, _hf_sync),
    "compile": (None, _hf_compile),
    "optimizer_impl": (_lightning_optimizer, _hf_optimizer),
}


def _trainer_arg_lines(s: TrainSettings, framework: str) -> list[str]:
    column = {"lightning": 0, "hf": 1}[framework]
    lines = []
    for render in (pair[column] for pair in _TRAINER_ARGS.values()):
        if render is not None:
            lines += ["    " + line for line in render(s)]
    return lines


def _render_lightning(s: TrainSettings, header: list[str]) -> str:
    v = s.settings
    lines = header + [
        "import lightning as L",
        *(["from lightning.pytorch.strategies import DDPStrategy"] if s.distributed else []),
        "import torch",
        "from torch.utils.data import DataLoader",
        "",
        *_backend_lines(s),
        "",
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *_loader_lines(s, "    "),
        ")",
        "",
        _model_format_line(s),
        "# In your LightningModule:",
    ]
    if v["channels_last"]:
        lines.append("#   in training_step: x = x.contiguous(memory_format=torch.channels_last) for 4-D inputs")
    if v["compile"] != "off":
        lines.append(_compile_call(s))
    else:
        lines.append(f"# {_knob(s, 'compile')} -> not compiled")
    if not s.distributed:
        lines.append(_ddp_unused(s))
    lines += ["", "trainer = L.Trainer("]
    if s.distributed:
        n = s.distributed["nproc_per_node"]
        accel = {"cpu": '"cpu"', "auto": '"auto"'}.get(s.device, '"gpu"')
        lines += [
            f"    accelerator={accel},  # device: {s.device}",
            f"    devices={n},  # distributed.nproc_per_node: {n} (Lightning starts the processes, or run under torchrun)",
            "    num_nodes=1,",
            "    strategy=DDPStrategy(",
            f"        process_group_backend={_backend_expr(s)},  # distributed.backend: {s.distributed['backend']}",
            *_ddp_kwarg_lines(s, "        "),
            "    ),  # Lightning runs accumulation steps under no_sync() by itself",
        ]
    else:
        lines += _lightning_device(s)
    lines += _trainer_arg_lines(s, "lightning")
    lines += [")", "trainer.fit(model, train_dataloaders=loader)"]
    return "\n".join(lines) + "\n"


def _render_hf(s: TrainSettings, header: list[str]) -> str:
    v = s.settings
    lines = header + [
        "import torch",
        "from transformers import TrainingArguments",
        "",
        *_backend_lines(s),
    ]
    lines.append(_model_format_line(s))
    if v["channels_last"]:
        lines.append("# 4-D inputs: convert them with x.contiguous(memory_format=torch.channels_last) in your data collator")
    if s.device == "auto":
        lines.append("# device: auto -> the Trainer picks CUDA when available")
    elif s.device.startswith("cuda:"):
        lines.append(f"# device: {s.device} -> run with CUDA_VISIBLE_DEVICES={s.device.partition(':')[2]}")
    lines += [
        "",
        "args = TrainingArguments(",
        '    output_dir="out",  # your output folder',
    ]
    if s.distributed:
        lines.insert(len(lines) - 3, f"# run the script with: {s.launch_command()}")
    if s.device == "cpu":
        lines.append("    use_cpu=True,  # device: cpu")
    lines += ["    " + line for line in _hf_ddp(s)]
    lines += _trainer_arg_lines(s, "hf")
    # Every loader argument is written: the Trainer's own defaults differ from DataLoader's
    # (it pins memory unless told not to).
    kwargs = _loader_kwargs(s)
    for key, value in kwargs.items():
        lines.append(f"    {_LOADER_ARGS[key][1]}={value!r},  # {_loader_comment(s, key)}")
    lines += ["    " + line for line in _loader_leftovers(s, kwargs)]
    lines.append(")")
    return "\n".join(lines) + "\n"


def _render_yaml(s: TrainSettings, header: list[str]) -> str:
    doc = {
        "schema_version": SETTINGS_SCHEMA_VERSION,
        "kind": SETTINGS_KIND,
        "device": s.device,
        "settings": {name: s.settings[name] for name in KNOBS},
    }
    if s.distributed:
        doc["distributed"] = dict(s.distributed)
    return "\n".join(header) + "\n" + yaml.safe_dump(doc, sort_keys=False)


FORMATS: dict[str, Callable[[TrainSettings, list[str]], str]] = {
    "torch": _render_torch,
    "lightning": _render_lightning,
    "hf": _render_hf,
    "yaml": _render_yaml,
}


def render_settings(settings: TrainSettings, fmt: str, source: str = "best.yaml") -> str:
    """Render already-loaded settings in one format.

    Args:
        settings: The settings.
        fmt: One of ``FORMATS``.
        source: Named in the header as where the settings came from.

    Raises:
        ExportError: Unknown format.
    """
    render = FORMATS.get(fmt)
    if render is None:
        raise ExportError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}; pick one of those")
    return render(settings, _header(settings, source))


def render_export(path: Path, fmt: str) -> str:
    """Render the winning settings of a search output folder or a ``best.yaml``.

    Args:
        path: A search output folder (with ``best.yaml`` in it) or a ``best.yaml`` file.
        fmt: ``torch``, ``lightning``, ``hf`` or ``yaml``.

    Returns:
        Ready-to-paste text starting with a comment header.

    Raises:
        ExportError: The path does not exist, the folder has no best.yaml, or the
            format is unknown.
        SettingsError: The best.yaml is invalid.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}; pick one of those")
    if not path.exists():
        raise ExportError(f"{path}: no such file or folder; pass a search output folder or its best.yaml")
    if path.is_dir():
        best = path / "best.yaml"
        if not best.is_file():
            raise ExportError(
                f"{path}: no best.yaml in this folder; run `trainopt search SPEC --out {path}` first, "
                f"or pass the best.yaml file itself"
            )
        path = best
    # The export is text for another machine, so a fingerprint mismatch here is no warning.
    return render_settings(load_settings(path, warn=False), fmt, source=str(path))
