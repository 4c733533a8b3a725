"""The ``torch`` export: a plain PyTorch training loop that applies every knob as the trial did.

With a ``distributed`` block it is the data-parallel loop the trials ran under torchrun:
DistributedSampler, DistributedDataParallel with the ``ddp_*`` knobs' arguments,
``no_sync()`` on accumulation steps, and a teardown that frees DDP before the process group.
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
    if ddp:
        lines.append("# at the start of every epoch: sampler.set_epoch(epoch), so each epoch shuffles anew, as measured")
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
    body = []
    if v["amp"] != "off":
        body.append(f"    with torch.autocast(device.type, dtype={_amp_dtype(s)}):  # {knob(s, 'amp')}")
        body.append("        loss = loss_fn(model(x), y)  # your loss")
    else:
        body.append(f"    loss = loss_fn(model(x), y)  # your loss; {knob(s, 'amp')} (full precision)")
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
