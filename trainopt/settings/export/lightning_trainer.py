"""The ``lightning`` export: the settings as PyTorch Lightning ``Trainer`` arguments and setup lines."""

from __future__ import annotations

from typing import Callable

from trainopt.settings.export.lines import (
    backend_expr,
    backend_lines,
    compile_call,
    ddp_kwarg_lines,
    ddp_unused,
    knob,
    loader_lines,
    model_format_line,
    optimizer_args,
)
from trainopt.settings.production import TrainSettings

__all__ = ["render"]

_PRECISION = {"off": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def _device(s: TrainSettings) -> list[str]:
    note = f"# device: {s.device}"
    if s.device == "auto":
        return [f'    accelerator="auto",  {note}', "    devices=1,"]
    if s.device == "cpu":
        return [f'    accelerator="cpu",  {note}', "    devices=1,"]
    index = s.device.partition(":")[2]
    return [f'    accelerator="gpu",  {note}', f"    devices=[{index}]," if index else "    devices=1,"]


def _sync(s: TrainSettings) -> list[str]:
    if s.settings["sync_every"]:
        return [f"log_every_n_steps={s.settings['sync_every']},  # {knob(s, 'sync_every')}"]
    return [f"# {knob(s, 'sync_every')} -> the loss was never read during training; log rarely and keep prog_bar=False in self.log"]


def _optimizer(s: TrainSettings) -> list[str]:
    extra = optimizer_args(s).lstrip(", ")
    what = f"pass {extra} to your optimizer in configure_optimizers()" if extra else "default optimizer arguments"
    return [f"# {knob(s, 'optimizer_impl')} -> {what}"]


# How each knob that Lightning's Trainer takes as an argument is written for it, once per
# knob, in the order the arguments are written. The backend flags and the loader are written
# above the Trainer, and compile in the LightningModule, so the trainer needs no line for tf32
# or compile.
_TRAINER_ARGS: dict[str, Callable[[TrainSettings], list[str]]] = {
    "amp": lambda s: [f'precision="{_PRECISION[s.settings["amp"]]}",  # {knob(s, "amp")}'],
    "grad_accum": lambda s: [f"accumulate_grad_batches={s.settings['grad_accum']},  # {knob(s, 'grad_accum')}"],
    # Lightning sets cudnn.benchmark from its argument, so it repeats the flag set above.
    "cudnn_benchmark": lambda s: [f"benchmark={s.settings['cudnn_benchmark']},  # {knob(s, 'cudnn_benchmark')}"],
    "sync_every": _sync,
    "optimizer_impl": _optimizer,
}


def render(s: TrainSettings, header: list[str]) -> str:
    """A PyTorch Lightning setup: the backend flags, the DataLoader and the ``Trainer`` arguments.

    Args:
        s: The settings.
        header: The comment lines to start with.
    """
    v = s.settings
    lines = header + [
        "import lightning as L",
        *(["from lightning.pytorch.strategies import DDPStrategy"] if s.distributed else []),
        "import torch",
        "from torch.utils.data import DataLoader",
        "",
        *backend_lines(s),
        "",
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *loader_lines(s, "    "),
        ")",
        "",
        model_format_line(s),
        "# In your LightningModule:",
    ]
    if v["channels_last"]:
        lines.append("#   in training_step: x = x.contiguous(memory_format=torch.channels_last) for 4-D inputs")
    if v["compile"] != "off":
        lines.append(compile_call(s))
    else:
        lines.append(f"# {knob(s, 'compile')} -> not compiled")
    if not s.distributed:
        lines.append(ddp_unused(s))
    lines += ["", "trainer = L.Trainer("]
    if s.distributed:
        n = s.distributed["nproc_per_node"]
        accel = {"cpu": '"cpu"', "auto": '"auto"'}.get(s.device, '"gpu"')
        lines += [
            f"    accelerator={accel},  # device: {s.device}",
            f"    devices={n},  # distributed.nproc_per_node: {n} (Lightning starts the processes, or run under torchrun)",
            "    num_nodes=1,",
            "    strategy=DDPStrategy(",
            f"        process_group_backend={backend_expr(s)},  # distributed.backend: {s.distributed['backend']}",
            *ddp_kwarg_lines(s, "        "),
            "    ),  # Lightning runs accumulation steps under no_sync() by itself",
        ]
    else:
        lines += _device(s)
    for write in _TRAINER_ARGS.values():
        lines += ["    " + line for line in write(s)]
    lines += [")", "trainer.fit(model, train_dataloaders=loader)"]
    return "\n".join(lines) + "\n"
