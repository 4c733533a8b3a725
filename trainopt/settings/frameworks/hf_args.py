"""The settings as keyword arguments for Hugging Face ``TrainingArguments`` (transformers 5).

Written: ``use_cpu`` whenever the settings were measured on a CPU (``device: auto`` that ran
on one included; without it, ``bf16=True`` fails on a CPU), the batch size, the optimizer
implementation as ``optim`` (the Trainer's own default on torch 2.8+ is fused AdamW, which
was not measured unless ``optimizer_impl: fused``), the loader fields whose Trainer
defaults differ from what was measured, the DDP fields of a data-parallel measurement
(``ddp_find_unused_parameters`` always: the Trainer's default is True), and each knob the
search established. ``logging_nan_inf_filter=False`` comes with sparse loss reads: with the
filter on, the Trainer checks every step's loss for NaN on the host, which is a read each step.
"""

from __future__ import annotations

from typing import Any

from trainopt.knobs import kwargs as apply
from trainopt.knobs.catalog import format_value
from trainopt.settings.frameworks.common import (
    ddp_keywords,
    device_note,
    left,
    measured_optimizer,
    optimizer_text,
    script_only,
)
from trainopt.settings.frameworks.records import Argument, FrameworkArgs, Unexpressed, note
from trainopt.settings.record import SettingsRecord

__all__ = ["OPTIM", "hf_args"]

# optimizer_impl -> TrainingArguments.optim (AdamW; adamw_torch runs torch's default kernels:
# foreach on CUDA, a per-parameter loop on a CPU).
OPTIM = {"default": "adamw_torch", "foreach": "adamw_torch", "fused": "adamw_torch_fused"}
_LOG_DEFAULT = 500
# torch.optim.AdamW's defaults: TrainingArguments' own differ (learning_rate 5e-5, weight_decay
# 0.0), so each hyperparameter of a measured AdamW is written, given or not.
ADAMW_DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2}
# The AdamW hyperparameters that have a TrainingArguments field.
_ADAMW_FIELDS = ("lr", "betas", "eps", "weight_decay", "foreach", "fused")
# ddp knob -> its TrainingArguments field (gradient_as_bucket_view has none).
_DDP_FIELDS = {
    "ddp_bucket_cap_mb": "ddp_bucket_cap_mb",
    "ddp_static_graph": "ddp_static_graph",
    "ddp_find_unused_parameters": "ddp_find_unused_parameters",
    "ddp_broadcast_buffers": "ddp_broadcast_buffers",
}


def _device(record: SettingsRecord, device_type: str) -> tuple[list[Argument], list[Unexpressed]]:
    where = device_note(record, device_type)
    if device_type == "cpu":
        return [Argument("use_cpu", True, ("device",), where)], []
    index = record.device.partition(":")[2]
    if index:
        return [], [Unexpressed("device", record.device, "TrainingArguments has no GPU index",
                                f"run the script with CUDA_VISIBLE_DEVICES={index}")]
    return [Argument(None, None, ("device",), f"{where} -> the Trainer picks the GPU")], []


def _ddp(record: SettingsRecord, buffer_kwarg: str) -> tuple[list[Argument], list[Unexpressed]]:
    v = record.settings
    if not record.distributed:
        return [Argument(None, None, tuple(apply.DDP_KWARGS),
                         note(v, *apply.DDP_KWARGS) + " -> measured as one process (no distributed block)")], []
    args: list[Argument] = []
    out: list[Unexpressed] = []
    backend = record.distributed["backend"]
    if backend == "auto":
        args.append(Argument(None, None, ("distributed.backend",), "distributed.backend: auto -> the Trainer picks nccl on CUDA, "
                                                                   "gloo on a CPU"))
    else:
        args.append(Argument("ddp_backend", backend, ("distributed.backend",), f"distributed.backend: {backend}"))
    established = {name: value for name, _, value in ddp_keywords(record, buffer_kwarg)}
    # The Trainer's default is find_unused_parameters=True for models without activation
    # checkpointing, a graph search every step that was not measured unless the knob says so.
    args.append(Argument("ddp_find_unused_parameters", v["ddp_find_unused_parameters"], ("ddp_find_unused_parameters",),
                         note(v, "ddp_find_unused_parameters") + ("" if "ddp_find_unused_parameters" in established else
                                                                  " (the Trainer's own default is True)")))
    for name in ("ddp_bucket_cap_mb", "ddp_static_graph"):
        if name in established:
            args.append(Argument(_DDP_FIELDS[name], established[name], (name,), note(v, name)))
        else:
            args.append(left(record, name, "DistributedDataParallel's default"))
    if "ddp_broadcast_buffers" not in established:
        args.append(left(record, "ddp_broadcast_buffers", "DistributedDataParallel's default"))
    elif buffer_kwarg == "broadcast_buffers":
        args.append(Argument("ddp_broadcast_buffers", v["ddp_broadcast_buffers"], ("ddp_broadcast_buffers",),
                             note(v, "ddp_broadcast_buffers")))
    else:
        out.append(Unexpressed(
            "ddp_broadcast_buffers", format_value(v["ddp_broadcast_buffers"]),
            "the Trainer passes this field to DistributedDataParallel as broadcast_buffers, which this torch deprecates "
            "(a FutureWarning at every wrap) and which, unlike the measured forward_sync_buffers, also skips the buffer "
            "sync at start-up",
            "either accept that and set ddp_broadcast_buffers=False, or set trainer.model_wrapped.forward_sync_buffers = "
            "False once the Trainer has wrapped the model (a TrainerCallback's on_step_begin)"))
    if "ddp_gradient_as_bucket_view" in established:
        out.append(Unexpressed(
            "ddp_gradient_as_bucket_view", "true", "TrainingArguments has no field for it, and the Trainer builds the "
            "DistributedDataParallel keyword arguments itself",
            "train with the settings' own loop (s.prepare_model wraps DDP with it), or wrap the model yourself"))
    else:
        args.append(left(record, "ddp_gradient_as_bucket_view", "DistributedDataParallel's default"))
    return args, out


def _amp(record: SettingsRecord) -> Argument:
    amp = record.settings["amp"]
    if amp == "bf16":
        return Argument("bf16", True, ("amp",), note(record.settings, "amp"))
    if amp == "fp16":
        return Argument("fp16", True, ("amp",), note(record.settings, "amp") + " (the Trainer adds the GradScaler)")
    return left(record, "amp", "full precision, the Trainer's default")


def _sync(record: SettingsRecord) -> list[Argument]:
    v = record.settings
    every = v["sync_every"]
    if "sync_every" not in record.established:
        return [left(record, "sync_every", f"trainopt's default, not a decision: the Trainer's logging_steps ({_LOG_DEFAULT}) "
                                           "stays; its NaN filter reads the loss every step, as measured")]
    sparse = Argument("logging_nan_inf_filter", False, ("sync_every",),
                      "the NaN/inf filter would read the loss on the host at every step")
    if every == 0:
        return [Argument("logging_strategy", "no", ("sync_every",), f"{note(v, 'sync_every')}: the loss was never read"), sparse]
    return [Argument("logging_steps", every, ("sync_every",), f"{note(v, 'sync_every')} optimizer steps"),
            *([sparse] if every > 1 else [])]


def _compile(record: SettingsRecord, device_type: str) -> tuple[list[Argument], list[Unexpressed]]:
    v = record.settings
    compiled, mode = apply.compile_mode(v)
    if not compiled:
        return [left(record, "compile", "not compiled")], []
    args = [Argument("torch_compile", True, ("compile",), note(v, "compile"))]
    if mode:
        args.append(Argument("torch_compile_mode", mode, ("compile",), note(v, "compile")))
    # Drop the last, smaller batch: a compiled model recompiles on a new shape.
    args.append(Argument("dataloader_drop_last", True, ("compile",), "every batch the same shape, as measured"))
    out = []
    if v["tf32"] is None and device_type == "cuda":
        out.append(Unexpressed(
            "tf32", "null", "TrainingArguments(torch_compile=True) switches TF32 on on Ampere and newer GPUs when tf32 is "
            "unset, and tf32=False would switch cuDNN's TF32 off too (PyTorch's default, measured, is matmuls off, cuDNN on)",
            "after building TrainingArguments, call s.apply_backend_flags() or set "
            "torch.backends.cuda.matmul.allow_tf32 = False"))
    return args, out


def _adamw_arguments(optimizer: dict[str, Any]) -> list[Argument]:
    """learning_rate, weight_decay, adam_beta1/2 and adam_epsilon of a measured AdamW."""
    given = optimizer.get("args") or {}
    h = {**ADAMW_DEFAULTS, **given}
    betas = list(h["betas"])
    why = "optimizer.args" if optimizer.get("source") == "spec" else f"from {optimizer.get('source')}"

    def said(key: str) -> str:
        return f"{key}: {given[key]!r} ({why})" if key in given else f"{key}: torch's AdamW default, as measured"

    return [
        Argument("learning_rate", h["lr"], ("code.optimizer",), said("lr") + " (the Trainer's own default is 5e-5)"),
        Argument("weight_decay", h["weight_decay"], ("code.optimizer",), said("weight_decay") + " (the Trainer's own is 0.0)"),
        Argument("adam_beta1", betas[0], ("code.optimizer",), said("betas")),
        Argument("adam_beta2", betas[1], ("code.optimizer",), said("betas")),
        Argument("adam_epsilon", h["eps"], ("code.optimizer",), said("eps")),
    ]


def _optimizer(record: SettingsRecord, device_type: str) -> tuple[list[Argument], list[Unexpressed]]:
    impl = record.settings["optimizer_impl"]
    measured = measured_optimizer(record)
    adamw = measured is not None and measured.get("class") == "torch.optim.AdamW" and not (
        measured.get("source") == "spec" and ":" in str(measured.get("name"))) and set(
        measured.get("args") or {}) <= set(_ADAMW_FIELDS)
    what = {"default": "AdamW with torch's default kernels", "foreach": "AdamW with torch's default kernels, foreach on CUDA",
            "fused": "AdamW with fused kernels"}[impl]
    args = [Argument("optim", OPTIM[impl], ("optimizer_impl",),
                     f"{note(record.settings, 'optimizer_impl')} -> {what} (the Trainer's own default on torch 2.8+ is "
                     "adamw_torch_fused); for another optimizer keep this implementation")]
    # trainopt never clips gradients; the Trainer clips at 1.0 unless told otherwise.
    args.append(Argument("max_grad_norm", 0.0, (), "no gradient clipping, as measured (the Trainer clips at 1.0 by default)"))
    out: list[Unexpressed] = []
    if measured is None or adamw:
        # Without a recorded optimizer (a hand-written best.yaml), the Trainer's AdamW is the one meant.
        if measured is not None:
            args += _adamw_arguments(measured)
        if impl == "foreach" and device_type != "cuda":
            kwargs = _kwargs_text(measured, record) if measured else "{'lr': args.learning_rate, 'foreach': True}"
            out.append(Unexpressed("optimizer_impl", "foreach", "TrainingArguments cannot ask for foreach kernels; "
                                   "adamw_torch runs a per-parameter loop on a CPU",
                                   f"pass optimizer_cls_and_kwargs=(torch.optim.AdamW, {kwargs}) to Trainer"))
        return args, out
    built = optimizer_text(measured, record.settings)
    lr = (measured.get("args") or {}).get("lr")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        args.append(Argument("learning_rate", lr, ("code.optimizer",),
                             "the measured learning rate, for the Trainer's schedule (the optimizer is below)"))
    out.append(Unexpressed("code.optimizer", built, "TrainingArguments builds AdamW; the settings were measured "
                           "with another optimizer (or a factory of the spec's)",
                           f"pass optimizer_cls_and_kwargs=({measured.get('class') or measured.get('name')}, "
                           f"{_kwargs_text(measured, record)}) to Trainer, or build it yourself: {built}"))
    return args, out


def _kwargs_text(optimizer: dict[str, Any], record: SettingsRecord) -> str:
    kwargs = {**(optimizer.get("args") or {}), **apply.optimizer_kwargs(record.settings["optimizer_impl"])}
    return "{" + ", ".join(f"{k!r}: {tuple(v) if isinstance(v, list) else v!r}" for k, v in kwargs.items()) + "}"


def _loader(record: SettingsRecord, device_type: str) -> list[Argument]:
    v = record.settings
    args = [Argument("per_device_train_batch_size", v["batch_size"], ("batch_size",), note(v, "batch_size"))]
    for name, field in (("num_workers", "dataloader_num_workers"), ("persistent_workers", "dataloader_persistent_workers"),
                        ("prefetch_factor", "dataloader_prefetch_factor")):
        applies = name == "num_workers" or v["num_workers"] > 0
        if name in record.established and applies:
            args.append(Argument(field, v[name], (name,), note(v, name)))
        else:
            args.append(left(record, name, "the Trainer's default" if applies else "applies only with num_workers > 0"))
    pinned = apply.pins_memory(v, device_type)
    if device_type == "cuda" and not pinned:
        # The Trainer pins by default (use_cpu turns pinning off itself).
        args.append(Argument("dataloader_pin_memory", False, ("pin_memory",), note(v, "pin_memory")))
    else:
        why = "the Trainer pins towards CUDA by default" if pinned else "use_cpu=True turns pinning off"
        args.append(left(record, "pin_memory", why))
    return args


def hf_args(record: SettingsRecord, device_type: str, buffer_kwarg: str = "forward_sync_buffers") -> FrameworkArgs:
    """The ``transformers.TrainingArguments`` keyword arguments for settings measured on ``device_type``.

    Args:
        record: The settings.
        device_type: ``cpu`` or ``cuda``: what the settings were measured on.
        buffer_kwarg: DistributedDataParallel's keyword for the buffer broadcast in the
            installed torch (``forward_sync_buffers`` from PyTorch 2.13, else ``broadcast_buffers``).
    """
    v = record.settings
    args, unexpressed = _device(record, device_type)
    ddp_args, ddp_out = _ddp(record, buffer_kwarg)
    args += ddp_args
    unexpressed += ddp_out
    args += _loader(record, device_type)
    args.append(_amp(record))
    if "grad_accum" in record.established:
        args.append(Argument("gradient_accumulation_steps", v["grad_accum"], ("grad_accum",), note(v, "grad_accum")))
    else:
        args.append(left(record, "grad_accum", "the Trainer's default, 1"))
    if v["tf32"] is not None and device_type == "cuda":
        # The Trainer sets TF32 for matmuls and convolutions from this field.
        args.append(Argument("tf32", v["tf32"], ("tf32",), note(v, "tf32")))
    else:
        args.append(left(record, "tf32", "PyTorch's TF32 defaults" if v["tf32"] is None else
                                          "no effect on a CPU (tf32=True raises there)"))
    args += _sync(record)
    compile_args, compile_out = _compile(record, device_type)
    args += compile_args
    unexpressed += compile_out
    optim, optim_out = _optimizer(record, device_type)
    args += optim
    unexpressed += optim_out
    script, quiet = script_only(record, "hf", device_type)
    unexpressed += script
    args += quiet
    if not v["cudnn_benchmark"]:
        args.append(left(record, "cudnn_benchmark", "PyTorch's default"))
    collate = (record.code or {}).get("collate")
    if collate:
        unexpressed.append(Unexpressed("code.collate", collate, "TrainingArguments holds no code",
                                       "pass data_collator=s.collate_fn to Trainer"))
    return FrameworkArgs("hf", "transformers.TrainingArguments", tuple(args), tuple(unexpressed))
