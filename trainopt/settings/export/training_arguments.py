"""The ``hf`` export: the settings as Hugging Face ``TrainingArguments``, every knob named."""

from __future__ import annotations

from typing import Callable

from trainopt.knobs import kwargs as apply
from trainopt.settings.export.lines import (
    backend_lines,
    ddp_unused,
    knob,
    loader_comment,
    loader_kwargs,
    loader_leftovers,
    model_format_line,
)
from trainopt.settings.production import TrainSettings

__all__ = ["render"]

# DataLoader keyword -> its TrainingArguments field.
_LOADER_FIELDS = {
    "batch_size": "per_device_train_batch_size",
    "num_workers": "dataloader_num_workers",
    "pin_memory": "dataloader_pin_memory",
    "drop_last": "dataloader_drop_last",
    "persistent_workers": "dataloader_persistent_workers",
    "prefetch_factor": "dataloader_prefetch_factor",
}
# ddp_* knob -> its TrainingArguments field (None: TrainingArguments has none; listed as a comment).
_DDP_FIELDS = {
    "ddp_bucket_cap_mb": "ddp_bucket_cap_mb",
    "ddp_gradient_as_bucket_view": None,
    "ddp_static_graph": None,
    "ddp_find_unused_parameters": "ddp_find_unused_parameters",
    "ddp_broadcast_buffers": "ddp_broadcast_buffers",
}


def _ddp(s: TrainSettings) -> list[str]:
    """TrainingArguments' DDP fields; the knobs it has no field for are listed as comments."""
    if not s.distributed:
        return [ddp_unused(s)]
    backend = s.distributed["backend"]
    if backend == "auto":
        lines = ["# distributed.backend: auto -> the Trainer picks nccl on CUDA, gloo on CPU"]
    else:
        lines = [f'ddp_backend="{backend}",  # distributed.backend: {backend}']
    kwargs = apply.ddp_kwargs(s.settings)
    missing = []
    for name, field in _DDP_FIELDS.items():
        kwarg = apply.DDP_KWARGS[name]
        if field is None:
            missing.append(name)
        elif kwarg not in kwargs:
            lines.append(f"# {knob(s, name)} -> PyTorch's default bucket size (25 MB)")
        else:
            lines.append(f"{field}={kwargs[kwarg]!r},  # {knob(s, name)}")
    lines.append(
        f"# {', '.join(knob(s, k) for k in missing)} -> TrainingArguments has no field for these; "
        "pass them to DistributedDataParallel through accelerate's DistributedDataParallelKwargs"
    )
    return lines


def _amp(s: TrainSettings) -> list[str]:
    amp = s.settings["amp"]
    if amp == "bf16":
        return [f"bf16=True,  # {knob(s, 'amp')}"]
    if amp == "fp16":
        return [f"fp16=True,  # {knob(s, 'amp')} (the Trainer adds the GradScaler)"]
    return [f"# {knob(s, 'amp')} -> leave bf16 and fp16 False (full precision)"]


def _compile(s: TrainSettings) -> list[str]:
    compiled, mode = apply.compile_mode(s.settings)
    if not compiled:
        return [f"# {knob(s, 'compile')} -> leave torch_compile False"]
    return [f"torch_compile=True,  # {knob(s, 'compile')}"] + ([f'torch_compile_mode="{mode}",'] if mode else [])


def _sync(s: TrainSettings) -> list[str]:
    if s.settings["sync_every"]:
        return [f"logging_steps={s.settings['sync_every']},  # {knob(s, 'sync_every')}"]
    return [f'logging_strategy="no",  # {knob(s, "sync_every")}: the loss was never read during training']


def _optimizer(s: TrainSettings) -> list[str]:
    impl = s.settings["optimizer_impl"]
    if impl == "fused":
        return [f'optim="adamw_torch_fused",  # {knob(s, "optimizer_impl")}; for another optimizer pass fused=True to its constructor']
    if impl == "foreach":
        return [f"# {knob(s, 'optimizer_impl')} -> the default adamw_torch uses foreach kernels on CUDA; for your own optimizer pass foreach=True"]
    return [f"# {knob(s, 'optimizer_impl')} -> the default optimizer implementation"]


# How each knob that TrainingArguments takes as an argument is written for it, once per
# knob, in the order the arguments are written. The backend flags are written above
# TrainingArguments, so it needs no line for cudnn_benchmark.
_TRAINER_ARGS: dict[str, Callable[[TrainSettings], list[str]]] = {
    "amp": _amp,
    "grad_accum": lambda s: [f"gradient_accumulation_steps={s.settings['grad_accum']},  # {knob(s, 'grad_accum')}"],
    # The Trainer sets the matmul TF32 flag from this argument; the lines above set both flags.
    "tf32": lambda s: [f"tf32={s.settings['tf32']},  # {knob(s, 'tf32')}"],
    "sync_every": _sync,
    "compile": _compile,
    "optimizer_impl": _optimizer,
}


def render(s: TrainSettings, header: list[str]) -> str:
    """Hugging Face ``TrainingArguments`` with every knob it has a field for; the rest as comments.

    Args:
        s: The settings.
        header: The comment lines to start with.
    """
    v = s.settings
    lines = header + [
        "import torch",
        "from transformers import TrainingArguments",
        "",
        *backend_lines(s),
    ]
    lines.append(model_format_line(s))
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
    lines += ["    " + line for line in _ddp(s)]
    for write in _TRAINER_ARGS.values():
        lines += ["    " + line for line in write(s)]
    # Every loader argument is written: the Trainer's own defaults differ from DataLoader's
    # (it pins memory unless told not to).
    kwargs = loader_kwargs(s)
    for key, value in kwargs.items():
        lines.append(f"    {_LOADER_FIELDS[key]}={value!r},  # {loader_comment(s, key)}")
    lines += ["    " + line for line in loader_leftovers(s, kwargs)]
    lines.append(")")
    return "\n".join(lines) + "\n"
