"""The ``torch`` export: a plain PyTorch training loop that applies every knob as the trial did.

With a ``distributed`` block it is the data-parallel loop the trials ran under torchrun:
DistributedSampler, DistributedDataParallel with the ``ddp_*`` knobs' arguments,
``no_sync()`` on accumulation steps, and a teardown that frees DDP before the process group.
With best.yaml's ``code:`` section it is the loop of the spec's own training code: the
DataLoader gets the ``collate_fn`` (``data.collate``), and the loop moves whole batches and
computes the loss as ``loss = model(**batch).loss`` (``loss: model``) or
``loss = step(model, batch)`` (``step``).
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
    loader_lines,
    model_format_line,
    optimizer_args,
)
from trainopt.settings.production import TrainSettings

__all__ = ["render"]

# Names the loop itself uses: a user function named like one of them is imported under another.
_LOOP_NAMES = {"step", "batch", "loss", "model", "loader", "optimizer", "device", "scaler", "grad_accum", "to_device"}


def _import_of(ref: str, field: str, alias: str) -> tuple[str, str]:
    """(the expression that names the callable, the line that imports it) for a reference."""
    target, _, attr = ref.rpartition(":")
    head, _, rest = attr.partition(".")
    name = alias if head in _LOOP_NAMES else head
    call = f"{name}.{rest}" if rest else name
    if target.endswith(".py") or "/" in target or "\\" in target:
        return call, f"# {name} = {attr} from {target}  ({field}: {ref}; import it as your script does)"
    imported = f"{head} as {name}" if name != head else head
    return call, f"from {target} import {imported}  # {field}: {ref}"


def _form(s: TrainSettings) -> str:
    """``pair``, ``model`` or ``step``: how the measured loop turned a batch into the loss."""
    code = s.code or {}
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
        collate, line = _import_of(code["collate"], "data.collate", "collate_fn")
        lines.append(line)
    if form == "step":
        step_call, line = _import_of(code["step"], "step", "train_step")
        lines.append(line)
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
    lines += [
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *loader_lines(s, "    ", sampler=ddp),
        *([f"    collate_fn={collate},  # data.collate: {code['collate']}"] if collate else []),
        ")",
        "",
        "model = model.to(device)  # your nn.Module",
    ]
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
    lines.append(
        f"optimizer = torch.optim.SGD(model.parameters(), lr=0.1{optimizer_args(s)})  "
        f"# your optimizer; {knob(s, 'optimizer_impl')}"
    )
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
            compute = "loss = model(**batch).loss"
            why = "loss: model (a tuple batch: model(*batch); a dict output: its [\"loss\"] or the sum of its losses)"
        else:
            compute, why = f"loss = {step_call}(model, batch)", f"step: {code['step']} (your forward and loss)"
    body = []
    if v["amp"] != "off":
        body.append(f"    with torch.autocast(device.type, dtype={_amp_dtype(s)}):  # {knob(s, 'amp')}")
        body.append(f"        {compute}  # {why}")
    else:
        body.append(f"    {compute}  # {why}; {knob(s, 'amp')} (full precision)")
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
