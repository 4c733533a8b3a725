"""The settings as keyword arguments for PyTorch Lightning's ``Trainer``.

Written: the device (``accelerator``, ``devices``), the DDP strategy of a data-parallel
measurement, and each knob the search established (``trainopt.settings.record.SettingsRecord.established``)
that the Trainer takes: ``precision`` (or, for fp16 on a CPU, the precision plugin, because
Lightning would silently train ``16-mixed`` as bf16 there), ``accumulate_grad_batches``,
``benchmark``, ``log_every_n_steps``. Knobs at trainopt's defaults leave Lightning's defaults
alone. The loader, the optimizer, compile, threads and the backend flags belong to the
training script and the LightningModule: they are ``Unexpressed`` records saying what to do.
"""

from __future__ import annotations

from trainopt.knobs import kwargs as apply
from trainopt.knobs.catalog import KNOBS, format_value
from trainopt.settings.frameworks.common import (
    ddp_keywords,
    device_note,
    left,
    measured_optimizer,
    optimizer_text,
    script_only,
)
from trainopt.settings.frameworks.records import Argument, Call, FrameworkArgs, Unexpressed, note
from trainopt.settings.record import SettingsRecord

__all__ = ["PRECISION", "lightning_args"]

PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}
_LOADER_KNOBS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
# Lightning reads logged values when its logger writes them, every log_every_n_steps optimizer steps.
_LOG_DEFAULT = 50


def _device(record: SettingsRecord, device_type: str, buffer_kwarg: str) -> list[Argument]:
    where = device_note(record, device_type)
    if record.distributed:
        n = record.distributed["nproc_per_node"]
        backend = record.distributed["backend"]
        accel = "cpu" if device_type == "cpu" else "gpu"
        return [
            Argument("accelerator", accel, ("device",), where),
            Argument("devices", n, ("distributed.nproc_per_node",),
                     f"distributed.nproc_per_node: {n} (Lightning starts the processes, or run under torchrun); it gives "
                     f"your DataLoader a DistributedSampler; effective batch = batch_size x grad_accum x {n}"),
            Argument("strategy", _strategy(record, buffer_kwarg),
                     ("distributed.backend", *(name for name, _, _ in ddp_keywords(record, buffer_kwarg))),
                     f"distributed.backend: {backend}; Lightning runs accumulation steps under no_sync() by itself"),
        ]
    if device_type == "cpu":
        return [Argument("accelerator", "cpu", ("device",), where), Argument("devices", 1, ("device",), "one process")]
    index = record.device.partition(":")[2]
    return [Argument("accelerator", "gpu", ("device",), where),
            Argument("devices", [int(index)] if index else 1, ("device",), f"GPU {index}" if index else "one GPU")]


def _strategy(record: SettingsRecord, buffer_kwarg: str) -> Call:
    kwargs = []
    notes = []
    backend = record.distributed["backend"]
    if backend != "auto":
        kwargs.append(("process_group_backend", backend))
        notes.append(("process_group_backend", f"distributed.backend: {backend}"))
    for name, keyword, value in ddp_keywords(record, buffer_kwarg):
        kwargs.append((keyword, value))
        notes.append((keyword, note(record.settings, name)))
    return Call("lightning.pytorch.strategies", "DDPStrategy", (), tuple(kwargs), tuple(notes))


def _amp(record: SettingsRecord, device_type: str) -> Argument:
    amp = record.settings["amp"]
    if "amp" not in record.established:
        return left(record, "amp", "Lightning's default precision, 32-true")
    if amp == "fp16" and device_type == "cpu":
        # Lightning turns precision="16-mixed" into bf16-mixed on a CPU (with only a log
        # line); the plugin keeps the fp16 autocast and its GradScaler that were measured.
        plugin = Call("lightning.pytorch.plugins.precision", "MixedPrecision", ("16-mixed", "cpu"),
                      (("scaler", Call("torch.amp", "GradScaler", ("cpu",))),))
        return Argument("plugins", [plugin], ("amp",),
                        'amp: fp16 -> precision="16-mixed" would train bf16 on a CPU (Lightning substitutes it); '
                        "this plugin keeps fp16 autocast with a GradScaler, as measured")
    return Argument("precision", PRECISION[amp], ("amp",), note(record.settings, "amp"))


def _sync(record: SettingsRecord) -> tuple[Argument | None, Unexpressed | None]:
    every = record.settings["sync_every"]
    if "sync_every" not in record.established:
        return left(record, "sync_every", f"trainopt's default, not a decision: Lightning's log_every_n_steps ({_LOG_DEFAULT}) "
                                          "stays"), None
    if every:
        return Argument("log_every_n_steps", every, ("sync_every",), f"{note(record.settings, 'sync_every')} optimizer steps"), None
    return None, Unexpressed(
        "sync_every", "0", "the measured loop never read the loss; Lightning reads logged values whenever its logger "
        f"writes them (every log_every_n_steps optimizer steps, {_LOG_DEFAULT} by default) and prog_bar=True values at "
        "every progress-bar refresh",
        "log without prog_bar=True and rarely (a large log_every_n_steps), or pass logger=False")


def lightning_args(record: SettingsRecord, device_type: str, buffer_kwarg: str = "forward_sync_buffers") -> FrameworkArgs:
    """The ``lightning.Trainer`` keyword arguments for settings measured on ``device_type``.

    Args:
        record: The settings.
        device_type: ``cpu`` or ``cuda``: what the settings were measured on.
        buffer_kwarg: DistributedDataParallel's keyword for the buffer broadcast in the
            installed torch (``forward_sync_buffers`` from PyTorch 2.13, else ``broadcast_buffers``).
    """
    v = record.settings
    args = _device(record, device_type, buffer_kwarg)
    args.append(_amp(record, device_type))
    if "grad_accum" in record.established:
        args.append(Argument("accumulate_grad_batches", v["grad_accum"], ("grad_accum",), note(v, "grad_accum")))
    else:
        args.append(left(record, "grad_accum", "Lightning's default, 1"))
    if "cudnn_benchmark" in record.established:
        # Lightning sets torch.backends.cudnn.benchmark from this argument.
        args.append(Argument("benchmark", v["cudnn_benchmark"], ("cudnn_benchmark",), note(v, "cudnn_benchmark")))
    else:
        args.append(left(record, "cudnn_benchmark", "Lightning keeps torch.backends.cudnn.benchmark as the script set it"))
    sync_arg, sync_missing = _sync(record)
    if sync_arg:
        args.append(sync_arg)
    unexpressed = [sync_missing] if sync_missing else []
    script, quiet = script_only(record, "lightning", device_type)
    unexpressed += script
    args += quiet
    unexpressed += _loader(record, device_type)
    unexpressed += _module(record)
    named = {u.setting for u in unexpressed}
    rest = [n for n in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor") if n not in named]
    if rest:
        args.append(Argument(None, None, tuple(rest), note(v, *rest) + " -> DataLoader's defaults"))
    if "optimizer_impl" not in named:
        args.append(left(record, "optimizer_impl", "your optimizer's default implementation"))
    if "compile" not in named:
        args.append(left(record, "compile", "not compiled"))
    if not record.distributed:
        args.append(Argument(None, None, tuple(apply.DDP_KWARGS),
                             note(v, *apply.DDP_KWARGS) + " -> measured as one process (no distributed block)"))
    else:
        done = {n for n, _, _ in ddp_keywords(record, buffer_kwarg)}
        rest = [n for n in apply.DDP_KWARGS if n not in done]
        if rest:
            args.append(Argument(None, None, tuple(rest), note(v, *rest) + " -> DistributedDataParallel's defaults"))
    return FrameworkArgs("lightning", "lightning.Trainer", tuple(args), tuple(unexpressed))


def _loader(record: SettingsRecord, device_type: str) -> list[Unexpressed]:
    """The loader knobs: the Trainer takes the script's DataLoader, so each is what to build it with."""
    v = record.settings
    shown = [n for n in _LOADER_KNOBS if n == "batch_size" or n in record.established]
    out = [Unexpressed(n, format_value(v[n]), "the Trainer takes your DataLoader as it is",
                       "build it with DataLoader(dataset, shuffle=True, **s.dataloader_kwargs())"
                       + (", which pins only towards CUDA" if n == "pin_memory" and device_type != "cuda" else ""))
           for n in shown]
    collate = (record.code or {}).get("collate")
    if collate:
        out.append(Unexpressed("code.collate", collate, "the Trainer takes your DataLoader as it is",
                               "pass collate_fn=s.collate_fn to the DataLoader (s.dataloader_kwargs() includes it)"))
    own = (record.code or {}).get("data_batch_size")
    if own is not None:
        out.append(Unexpressed(
            "code.data_batch_size", format_value(own),
            "the data came from your LightningDataModule's (or LightningModule's) train_dataloader(), whose DataLoader "
            f"asked for batch_size={own}; trainopt measured batch_size: {v['batch_size']} instead",
            f"build that DataLoader with batch_size={v['batch_size']} and the rest of s.dataloader_kwargs(); the Trainer "
            "calls prepare_data() and setup('fit') before train_dataloader(), as the trials did"))
    return out


def _module(record: SettingsRecord) -> list[Unexpressed]:
    """The optimizer and compile: written in the LightningModule, not given to the Trainer."""
    v = record.settings
    out = []
    measured = measured_optimizer(record)
    if measured is not None:
        built = optimizer_text(measured, record.settings, "self.parameters()")
        if measured.get("source") == "configure_optimizers":
            reason, instead = ("the optimizer is built in your configure_optimizers(), and it built this one in the "
                               "trials", f"keep configure_optimizers() returning {built}")
        else:
            reason, instead = ("the Trainer steps the optimizer your configure_optimizers() returns, and the settings were "
                               "measured with this one", f"return {built} from configure_optimizers()")
        out.append(Unexpressed("code.optimizer", built, reason, instead))
    if v["optimizer_impl"] != KNOBS["optimizer_impl"].default:
        extra = ", ".join(f"{k}=True" for k in apply.optimizer_kwargs(v["optimizer_impl"]))
        out.append(Unexpressed("optimizer_impl", v["optimizer_impl"], "the optimizer is built in your configure_optimizers()",
                               f"pass {extra} to its constructor (**s.optimizer_kwargs())"))
    compiled, mode = apply.compile_mode(v)
    if compiled:
        arg = f", mode={mode!r}" if mode else ""
        out.append(Unexpressed(
            "compile", v["compile"],
            "the Trainer has no compile argument, and torch.compile(lightning_module) fails at the first self.log() "
            "(InternalTorchDynamoError: 'method' object has no attribute '__dict__')",
            f"compile the inner nn.Module, as was measured: self.net = torch.compile(self.net{arg}) in your "
            "LightningModule's __init__ (or configure_model)"))
    return out
