"""The ``torch`` export: a plain PyTorch training loop that applies every knob as the trial did.

With a ``distributed`` block it is the data-parallel loop the trials ran under torchrun:
DistributedSampler, DistributedDataParallel with the ``ddp_*`` knobs' arguments,
``no_sync()`` on accumulation steps, and a teardown that frees DDP before the process group.
With best.yaml's ``code:`` section it is the loop of the spec's own training code: the
DataLoader gets the ``collate_fn`` (``data.collate``), and the loop moves whole batches and
computes the loss as ``model_loss(model, batch)`` (``loss: model``: the batch into the model as
the trial called it, the loss read from the output as the trial read it),
``step(model, batch)`` (``step``, imported from its module or file), or a LightningModule's
``training_step(batch, batch_idx)`` (the ``lightning`` form). The optimizer is the one the
trials built (``code.optimizer``): its class or the spec's factory, with its arguments.
"""

from __future__ import annotations

from trainopt.knobs import kwargs as apply
from trainopt.settings.export.lines import (
    backend_expr,
    backend_lines,
    compile_call,
    ddp_kwarg_lines,
    ddp_unused,
    device_type,
    knob,
    import_of,
    loader_lines,
    model_format_line,
    optimizer_lines,
)
from trainopt.settings.production import TrainSettings

__all__ = ["render"]

def _form(s: TrainSettings) -> str:
    """``pair``, ``model``, ``step`` or ``lightning``: how the measured loop turned a batch into the loss."""
    code = s.code or {}
    if code.get("form"):
        return code["form"]
    if code.get("step"):
        return "step"
    return "model" if code.get("loss") == "model" else "pair"


def _to_device_lines(s: TrainSettings) -> list[str]:
    """A helper that moves a whole batch as the trial did: every tensor, channels-last for 4-D floating ones."""
    pinned = apply.pins_memory(s.settings, device_type(s))
    lines = [
        "",
        "def to_device(batch):",
        '    """Every tensor of the batch on the device, as measured; the batch keeps its structure."""',
        "    if isinstance(batch, torch.Tensor):",
        "        batch = batch.to(device, non_blocking=True)  # from pinned memory" if pinned else "        batch = batch.to(device)",
    ]
    if s.settings["channels_last"]:
        lines += [
            f"        if batch.dim() == 4 and batch.is_floating_point():  # {knob(s, 'channels_last')}",
            "            batch = batch.contiguous(memory_format=torch.channels_last)",
        ]
    return lines + [
        "        return batch",
        "    if isinstance(batch, Mapping):",
        "        return {key: to_device(value) for key, value in batch.items()}",
        "    if isinstance(batch, (tuple, list)):",
        "        moved = [to_device(item) for item in batch]",
        '        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)',
        "    return batch  # a dataclass batch: move its tensor fields the same way",
        "",
        "",
    ]


def _model_loss_lines() -> list[str]:
    """``loss: model`` as the trials read it: the whole batch into the model, the loss out of its output."""
    return [
        "def model_loss(model, batch):",
        '    """The model called with the whole batch, and the loss read from its output, as measured."""',
        "    if isinstance(batch, Mapping):",
        "        output = model(**batch)",
        "    elif isinstance(batch, (tuple, list)):",
        "        output = model(*batch)",
        "    else:",
        "        output = model(batch)",
        "    if isinstance(output, torch.Tensor):",
        "        return output",
        '    if isinstance(output, Mapping) and "loss" in output:',
        '        return output["loss"]',
        '    if getattr(output, "loss", None) is not None:',
        "        return output.loss",
        "    if isinstance(output, Mapping):",
        "        return sum(output.values())  # a dict of losses: their sum",
        "    # a tuple such as (logits, loss): its one scalar tensor",
        "    return next(item for item in output if isinstance(item, torch.Tensor) and item.numel() == 1)",
        "",
        "",
    ]


def _own_data_lines(batch_size: int) -> list[str]:
    """Where the data set comes from when the LightningModule (or its data module) supplied it."""
    return [
        "# the data set of your LightningDataModule (or LightningModule), as measured: Lightning's order first,",
        "# datamodule.prepare_data(); datamodule.setup(\"fit\"); dataset = datamodule.train_dataloader().dataset",
        f"# its own DataLoader asked for batch_size={batch_size}; the measured batch_size below replaces it",
    ]


def _training_step_lines() -> list[str]:
    """The LightningModule trained by its training_step, as the trials trained it."""
    return [
        "model.log = model.log_dict = lambda *args, **kwargs: None  # no Trainer collects metrics here, as measured",
        'model.setup("fit")  # Lightning calls it before training',
        "",
        "",
        "class TrainingStep(torch.nn.Module):",
        '    """The LightningModule with training_step as forward, so DDP and torch.compile wrap the step, as measured."""',
        "",
        "    def __init__(self, module):",
        "        super().__init__()",
        "        self.module = module",
        "",
        "    def forward(self, batch, batch_idx):",
        "        return self.module.training_step(batch, batch_idx)",
        "",
        "",
        "model = TrainingStep(model)",
    ]


def _amp_dtype(s: TrainSettings) -> str | None:
    name = apply.AMP_DTYPES[s.settings["amp"]]
    return f"torch.{name}" if name else None


def _device_expr(s: TrainSettings) -> str:
    if s.device == "auto":
        return 'torch.device("cuda" if torch.cuda.is_available() else "cpu")'
    return f'torch.device("{s.device}")'


def render(s: TrainSettings, header: list[str]) -> str:
    """A plain PyTorch training script: loader, model, optimizer and the loop, as measured.

    Args:
        s: The settings.
        header: The comment lines to start with.
    """
    v = s.settings
    accum, every = v["grad_accum"], v["sync_every"]
    fp16 = v["amp"] == "fp16"
    ddp = bool(s.distributed)
    form = _form(s)
    code = s.code or {}
    lines = header + (["from collections.abc import Mapping", ""] if form != "pair" else [])
    lines += ["import torch", "from torch.utils.data import DataLoader"]
    collate = step_call = None
    if code.get("collate"):
        collate, imported = import_of(code["collate"], "data.collate", "collate_fn")
        lines += imported
    if form == "step":
        step_call, imported = import_of(code["step"], "step", "train_step")
        lines += imported
    optimizer_imports, optimizer_built = optimizer_lines(s)
    lines += optimizer_imports
    if ddp:
        lines += [
            "import contextlib",
            "import gc",
            "import os",
            "import torch.distributed as dist",
            "from torch.nn.parallel import DistributedDataParallel",
            "from torch.utils.data.distributed import DistributedSampler",
            "",
            f"dist.init_process_group({backend_expr(s)})  # distributed.backend: {s.distributed['backend']}",
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
    lines += [*backend_lines(s), ""]
    if ddp:
        sampler_args = ", ".join(f"{k}={val!r}" for k, val in apply.sampler_kwargs(0).items())
        lines.append(f"sampler = DistributedSampler(dataset, {sampler_args})  # each process reads its own shard")
    if code.get("data_batch_size") is not None:
        lines += _own_data_lines(code["data_batch_size"])
    lines += [
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *loader_lines(s, "    ", sampler=ddp),
        *([f"    collate_fn={collate},  # data.collate: {code['collate']}"] if collate else []),
        ")",
        "",
        "model = model.to(device)  # your nn.Module",
    ]
    if form == "lightning":
        lines += _training_step_lines()
    lines.append(model_format_line(s))
    lines.append("model.train()")
    if ddp:
        lines += [
            "model = DistributedDataParallel(",
            "    model,",
            '    device_ids=[device.index] if device.type == "cuda" else None,',
            *ddp_kwarg_lines(s, "    "),
            ")",
        ]
    lines += optimizer_built
    if v["compile"] != "off":
        lines.append(compile_call(s))
    else:
        lines.append(f"# {knob(s, 'compile')} -> not compiled")
    if not ddp:
        lines.append(ddp_unused(s))
    if fp16:
        lines.append(f"scaler = torch.amp.GradScaler(device.type)  # {knob(s, 'amp')} needs loss scaling")
    lines += [f"grad_accum = {accum}  # {knob(s, 'grad_accum')}", ""]
    if form != "pair":
        lines += _to_device_lines(s)
    if form == "model":
        lines += _model_loss_lines()
    if ddp:
        lines.append("# at the start of every epoch: sampler.set_epoch(epoch), so each epoch shuffles anew, as measured")
    if form == "pair":
        lines.append("for step, (x, y) in enumerate(loader):")
        if apply.pins_memory(v, device_type(s)):
            lines += [
                "    x = x.to(device, non_blocking=True)  # from pinned memory",
                "    y = y.to(device, non_blocking=True)",
            ]
        else:
            lines += ["    x = x.to(device)", "    y = y.to(device)"]
        if v["channels_last"]:
            lines.append("    x = x.contiguous(memory_format=torch.channels_last)  # 4-D inputs only")
        compute, why = "loss = loss_fn(model(x), y)", "your loss"
    else:
        lines += ["for step, batch in enumerate(loader):", "    batch = to_device(batch)  # the whole batch, as measured"]
        if form == "model":
            compute = ["loss = model_loss(model, batch)"]
            why = "loss: model (the model computes its own loss from the whole batch)"
        elif form == "lightning":
            compute = ["output = model(batch, step)", 'loss = output["loss"] if isinstance(output, Mapping) else output']
            why = "the LightningModule's training_step(batch, batch_idx), as measured"
        else:
            compute, why = [f"loss = {step_call}(model, batch)"], f"step: {code['step']} (your forward and loss)"
    if isinstance(compute, str):
        compute = [compute]
    body = []
    if v["amp"] != "off":
        body.append(f"    with torch.autocast(device.type, dtype={_amp_dtype(s)}):  # {knob(s, 'amp')}")
        body.append(f"        {compute[0]}  # {why}")
        body += [f"        {line}" for line in compute[1:]]
    else:
        body.append(f"    {compute[0]}  # {why}; {knob(s, 'amp')} (full precision)")
        body += [f"    {line}" for line in compute[1:]]
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
            f"        if ((step + 1) // grad_accum) % {every} == 0:  # {knob(s, 'sync_every')} optimizer steps",
            "            print(f\"step {(step + 1) // grad_accum}: loss {loss.item():.4f}\")  # .item() waits for the device",
        ]
    else:
        lines.append(f"    # {knob(s, 'sync_every')} -> the loss was never read during training (no loss.item())")
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
