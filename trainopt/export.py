"""``trainopt export``: the winning settings as text to paste into a training script.

Formats: plain PyTorch (``torch``), PyTorch Lightning (``lightning``), Hugging Face
``TrainingArguments`` (``hf``) and ``best.yaml`` itself (``yaml``). Every output starts
with where the settings were measured and how much faster they were, and names every
knob: as code where the target can express it, otherwise as a comment saying what to do,
so no measured setting is silently lost on the way into a training script.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import yaml

from trainopt import distributed as dist_mod
from trainopt.errors import UserError
from trainopt.knobs import KNOBS, format_value
from trainopt.settings import SETTINGS_KIND, SETTINGS_SCHEMA_VERSION, TrainSettings, load_settings

__all__ = ["ExportError", "FORMATS", "render_export", "render_settings"]


class ExportError(UserError):
    """Nothing to export at the given path, or an unknown format."""


_COMPILE_MODE_ARG = {"default": "", "reduce-overhead": ', mode="reduce-overhead"', "max-autotune": ', mode="max-autotune"'}
_AMP_DTYPE = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}
_LIGHTNING_PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


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


_DDP_KNOB_NAMES = tuple(dist_mod.DDP_KNOBS)


def _ddp_unused(s: TrainSettings) -> str:
    """The comment naming the DDP knobs of single-process settings, so none is silently absent."""
    return "# " + ", ".join(_knob(s, k) for k in _DDP_KNOB_NAMES) + " -> measured as one process (no distributed block)"


def _ddp_kwarg_lines(s: TrainSettings, indent: str) -> list[str]:
    """``kwarg=value,  # knob: value`` for every DDP knob (bucket_cap_mb null as a comment)."""
    kwargs = dist_mod.ddp_kwargs(s.settings)
    lines = []
    for knob, kwarg in dist_mod.DDP_KNOBS.items():
        if kwarg == "broadcast_buffers":
            lines.append(
                f"{indent}{kwarg}={kwargs[kwarg]!r},  # {_knob(s, knob)} (PyTorch 2.13+ names it forward_sync_buffers)"
            )
        elif kwarg in kwargs:
            lines.append(f"{indent}{kwarg}={kwargs[kwarg]!r},  # {_knob(s, knob)}")
        else:
            lines.append(f"{indent}# {_knob(s, knob)} -> PyTorch's default bucket size (25 MB)")
    return lines


def _backend_expr(s: TrainSettings) -> str:
    backend = s.distributed.get("backend", "auto")
    if backend == "auto":
        return '"nccl" if torch.cuda.is_available() else "gloo"'
    return f'"{backend}"'


def _loader_lines(s: TrainSettings, indent: str, pin_on: bool, sampler: bool = False) -> list[str]:
    """The DataLoader keyword lines, every input knob present as code or comment."""
    v = s.settings
    per = " per process" if s.distributed else ""
    lines = [
        f"{indent}batch_size={v['batch_size']},  # {_knob(s, 'batch_size')}{per}",
        f"{indent}sampler=sampler,  # the sampler shuffles; no shuffle=True" if sampler else f"{indent}shuffle=True,",
        f"{indent}drop_last=True,  # every batch the same shape, as measured (a compiled model would recompile)",
        f"{indent}num_workers={v['num_workers']},  # {_knob(s, 'num_workers')}",
    ]
    if v["pin_memory"] and not pin_on:
        lines.append(f"{indent}pin_memory=False,  # {_knob(s, 'pin_memory')}, but pinning helps CUDA copies only")
    else:
        lines.append(f"{indent}pin_memory={v['pin_memory']},  # {_knob(s, 'pin_memory')}")
    if v["num_workers"] > 0:
        lines.append(f"{indent}persistent_workers={v['persistent_workers']},  # {_knob(s, 'persistent_workers')}")
        if v["prefetch_factor"] is not None:
            lines.append(f"{indent}prefetch_factor={v['prefetch_factor']},  # {_knob(s, 'prefetch_factor')}")
        else:
            lines.append(f"{indent}# {_knob(s, 'prefetch_factor')} -> DataLoader's default")
    else:
        lines.append(f"{indent}# {_knob(s, 'persistent_workers')}, {_knob(s, 'prefetch_factor')}: apply only with num_workers > 0")
    return lines


def _pin_applies(s: TrainSettings) -> bool:
    # pin_memory was measured only where it can matter: copies to a CUDA device.
    return bool(s.settings["pin_memory"]) and s.device != "cpu"


def _threads_line(s: TrainSettings) -> str:
    if s.settings["threads"] is not None:
        return f"torch.set_num_threads({s.settings['threads']})  # {_knob(s, 'threads')}"
    return f"# {_knob(s, 'threads')} -> PyTorch's default thread count"


def _cudnn_line(s: TrainSettings) -> str:
    if s.settings["cudnn_benchmark"]:
        return f"torch.backends.cudnn.benchmark = True  # {_knob(s, 'cudnn_benchmark')}"
    return f"# {_knob(s, 'cudnn_benchmark')} -> leave torch.backends.cudnn.benchmark off"


def _tf32_lines(s: TrainSettings) -> list[str]:
    if s.settings["tf32"]:
        return [
            f"torch.backends.cuda.matmul.allow_tf32 = True  # {_knob(s, 'tf32')}",
            "torch.backends.cudnn.allow_tf32 = True",
        ]
    return [f"# {_knob(s, 'tf32')} -> TF32 off, as measured (torch.backends.cudnn.allow_tf32 = False for convolutions too)"]


def _compile_call(s: TrainSettings) -> str:
    return f"model = torch.compile(model{_COMPILE_MODE_ARG[s.settings['compile']]})  # {_knob(s, 'compile')}"


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
            "import os",
            "import torch.distributed as dist",
            "from torch.nn.parallel import DistributedDataParallel",
            "from torch.utils.data.distributed import DistributedSampler",
            "",
            f"dist.init_process_group({_backend_expr(s)})  # distributed.backend: {s.distributed.get('backend', 'auto')}",
        ]
        if s.device == "cpu":
            lines.append(f"device = torch.device(\"cpu\")  # device: {s.device}")
        else:
            lines += [
                f"# device: {s.device} -> one GPU per process",
                'device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")',
            ]
    else:
        lines += ["", f"device = {_device_expr(s)}  # device: {s.device}"]
    lines += [_threads_line(s), _cudnn_line(s), *_tf32_lines(s), ""]
    if ddp:
        sk = dist_mod.sampler_kwargs(0)
        lines.append(
            "sampler = DistributedSampler(dataset, "
            + ", ".join(f"{k}={val!r}" for k, val in sk.items())
            + ")  # each process reads its own shard"
        )
    lines += [
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *_loader_lines(s, "    ", _pin_applies(s), sampler=ddp),
        ")",
        "",
        "model = model.to(device)  # your nn.Module",
    ]
    if v["channels_last"]:
        lines.append(f"model = model.to(memory_format=torch.channels_last)  # {_knob(s, 'channels_last')}")
    else:
        lines.append(f"# {_knob(s, 'channels_last')} -> default memory format")
    lines.append("model.train()")
    if ddp:
        lines += [
            "model = DistributedDataParallel(",
            "    model,",
            '    device_ids=[device.index] if device.type == "cuda" else None,',
            *_ddp_kwarg_lines(s, "    "),
            ")",
        ]
    opt_kwargs = {"default": "", "foreach": ", foreach=True", "fused": ", fused=True"}[v["optimizer_impl"]]
    lines.append(
        f"optimizer = torch.optim.SGD(model.parameters(), lr=0.1{opt_kwargs})  "
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
    if _pin_applies(s):
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
        body.append(f"    with torch.autocast(device.type, dtype={_AMP_DTYPE[v['amp']]}):  # {_knob(s, 'amp')}")
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
    return "\n".join(lines) + "\n"


def _lightning_device(s: TrainSettings) -> list[str]:
    note = f"# device: {s.device}"
    if s.device == "auto":
        return [f'    accelerator="auto",  {note}', "    devices=1,"]
    if s.device == "cpu":
        return [f'    accelerator="cpu",  {note}', "    devices=1,"]
    index = s.device.partition(":")[2]
    return [f'    accelerator="gpu",  {note}', f"    devices=[{index}]," if index else "    devices=1,"]


def _render_lightning(s: TrainSettings, header: list[str]) -> str:
    v = s.settings
    lines = header + [
        "import lightning as L",
        *(["from lightning.pytorch.strategies import DDPStrategy"] if s.distributed else []),
        "import torch",
        "from torch.utils.data import DataLoader",
        "",
        _threads_line(s),
    ]
    if v["tf32"]:
        lines.append(f'torch.set_float32_matmul_precision("high")  # {_knob(s, "tf32")}')
    else:
        lines.append(f'# {_knob(s, "tf32")} -> keep torch.set_float32_matmul_precision("highest"), the default')
    lines += [
        "",
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *_loader_lines(s, "    ", _pin_applies(s)),
        ")",
        "",
        "# In your LightningModule:",
    ]
    if v["channels_last"]:
        lines += [
            f"#   {_knob(s, 'channels_last')} -> before fit: model = model.to(memory_format=torch.channels_last),",
            "#   and in training_step: x = x.contiguous(memory_format=torch.channels_last) for 4-D inputs",
        ]
    else:
        lines.append(f"#   {_knob(s, 'channels_last')} -> default memory format")
    opt = {
        "default": "default optimizer arguments",
        "foreach": "pass foreach=True to your optimizer in configure_optimizers()",
        "fused": "pass fused=True to your optimizer in configure_optimizers()",
    }[v["optimizer_impl"]]
    lines.append(f"#   {_knob(s, 'optimizer_impl')} -> {opt}")
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
            f"        process_group_backend={_backend_expr(s)},  # distributed.backend: {s.distributed.get('backend', 'auto')}",
            *_ddp_kwarg_lines(s, "        "),
            "    ),  # accumulation steps skip the all-reduce (no_sync) by themselves",
        ]
    else:
        lines += _lightning_device(s)
    lines += [
        f'    precision="{_LIGHTNING_PRECISION[v["amp"]]}",  # {_knob(s, "amp")}',
        f"    accumulate_grad_batches={v['grad_accum']},  # {_knob(s, 'grad_accum')}",
        f"    benchmark={v['cudnn_benchmark']},  # {_knob(s, 'cudnn_benchmark')}",
    ]
    if v["sync_every"]:
        lines.append(f"    log_every_n_steps={v['sync_every']},  # {_knob(s, 'sync_every')}")
    else:
        lines.append(
            f"    # {_knob(s, 'sync_every')} -> the loss was never read during training; "
            "log rarely and keep prog_bar=False in self.log"
        )
    lines += [")", "trainer.fit(model, train_dataloaders=loader)"]
    return "\n".join(lines) + "\n"


def _render_hf(s: TrainSettings, header: list[str]) -> str:
    v = s.settings
    workers = v["num_workers"]
    lines = header + [
        "import torch",
        "from transformers import TrainingArguments",
        "",
        _threads_line(s),
        _cudnn_line(s),
    ]
    if v["channels_last"]:
        lines.append(
            f"model = model.to(memory_format=torch.channels_last)  # {_knob(s, 'channels_last')}; "
            "4-D inputs: convert them in your data collator"
        )
    else:
        lines.append(f"# {_knob(s, 'channels_last')} -> default memory format")
    if s.device == "auto":
        lines.append("# device: auto -> the Trainer picks CUDA when available")
    elif s.device.startswith("cuda:"):
        lines.append(f"# device: {s.device} -> run with CUDA_VISIBLE_DEVICES={s.device.partition(':')[2]}")
    if s.distributed:
        lines.append(f"# run the script with: {s.launch_command()}")
    lines += [
        "",
        "args = TrainingArguments(",
        '    output_dir="out",  # your output folder',
    ]
    if s.device == "cpu":
        lines.append("    use_cpu=True,  # device: cpu")
    lines += _hf_ddp_lines(s)
    lines += [
        f"    per_device_train_batch_size={v['batch_size']},  # {_knob(s, 'batch_size')}",
        f"    gradient_accumulation_steps={v['grad_accum']},  # {_knob(s, 'grad_accum')}",
    ]
    if v["amp"] == "bf16":
        lines.append(f"    bf16=True,  # {_knob(s, 'amp')}")
    elif v["amp"] == "fp16":
        lines.append(f"    fp16=True,  # {_knob(s, 'amp')} (the Trainer adds the GradScaler)")
    else:
        lines.append(f"    # {_knob(s, 'amp')} -> leave bf16 and fp16 False (full precision)")
    lines += [
        f"    tf32={v['tf32']},  # {_knob(s, 'tf32')}",
        "    dataloader_drop_last=True,  # every batch the same shape, as measured",
        f"    dataloader_num_workers={workers},  # {_knob(s, 'num_workers')}",
        # The Trainer pins memory unless told not to, so the measured value is always written.
        f"    dataloader_pin_memory={_pin_applies(s)},  # {_knob(s, 'pin_memory')}",
    ]
    if workers > 0:
        lines.append(f"    dataloader_persistent_workers={v['persistent_workers']},  # {_knob(s, 'persistent_workers')}")
        if v["prefetch_factor"] is not None:
            lines.append(f"    dataloader_prefetch_factor={v['prefetch_factor']},  # {_knob(s, 'prefetch_factor')}")
        else:
            lines.append(f"    # {_knob(s, 'prefetch_factor')} -> DataLoader's default")
    else:
        lines.append(f"    # {_knob(s, 'persistent_workers')}, {_knob(s, 'prefetch_factor')}: apply only with workers")
    if v["compile"] != "off":
        lines.append(f"    torch_compile=True,  # {_knob(s, 'compile')}")
        if v["compile"] != "default":
            lines.append(f'    torch_compile_mode="{v["compile"]}",')
    else:
        lines.append(f"    # {_knob(s, 'compile')} -> leave torch_compile False")
    if v["sync_every"]:
        lines.append(f"    logging_steps={v['sync_every']},  # {_knob(s, 'sync_every')}")
    else:
        lines.append(f'    logging_strategy="no",  # {_knob(s, "sync_every")}: the loss was never read during training')
    if v["optimizer_impl"] == "fused":
        lines.append(
            f'    optim="adamw_torch_fused",  # {_knob(s, "optimizer_impl")}; '
            "for another optimizer pass fused=True to its constructor"
        )
    elif v["optimizer_impl"] == "foreach":
        lines.append(
            f"    # {_knob(s, 'optimizer_impl')} -> the default adamw_torch uses foreach kernels on CUDA; "
            "for your own optimizer pass foreach=True"
        )
    else:
        lines.append(f"    # {_knob(s, 'optimizer_impl')} -> the default optimizer implementation")
    lines.append(")")
    return "\n".join(lines) + "\n"


def _hf_ddp_lines(s: TrainSettings) -> list[str]:
    """TrainingArguments' DDP fields; the knobs it has no field for are listed as comments."""
    v = s.settings
    if not s.distributed:
        return ["    " + _ddp_unused(s)]
    backend = s.distributed.get("backend", "auto")
    lines = []
    if backend == "auto":
        lines.append("    # distributed.backend: auto -> the Trainer picks nccl on CUDA, gloo on CPU")
    else:
        lines.append(f'    ddp_backend="{backend}",  # distributed.backend: {backend}')
    if v["ddp_bucket_cap_mb"] is not None:
        lines.append(f"    ddp_bucket_cap_mb={v['ddp_bucket_cap_mb']},  # {_knob(s, 'ddp_bucket_cap_mb')}")
    else:
        lines.append(f"    # {_knob(s, 'ddp_bucket_cap_mb')} -> PyTorch's default bucket size (25 MB)")
    lines += [
        f"    ddp_find_unused_parameters={v['ddp_find_unused_parameters']},  # {_knob(s, 'ddp_find_unused_parameters')}",
        f"    ddp_broadcast_buffers={v['ddp_broadcast_buffers']},  # {_knob(s, 'ddp_broadcast_buffers')}",
        f"    # {_knob(s, 'ddp_gradient_as_bucket_view')}, {_knob(s, 'ddp_static_graph')} -> TrainingArguments has no field "
        "for these; pass them to DistributedDataParallel through accelerate's DistributedDataParallelKwargs",
    ]
    return lines


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
