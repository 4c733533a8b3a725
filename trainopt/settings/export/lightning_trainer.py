"""The ``lightning`` export: PyTorch Lightning ``Trainer`` arguments from ``s.framework_args("lightning")``.

The ``Trainer(...)`` call is written from exactly the arguments ``s.trainer_kwargs("lightning")``
builds; the lines around it (backend flags, the DataLoader, the LightningModule's compile and
channels-last) are what its ``unexpressed`` records ask the script to do.
"""

from __future__ import annotations

from trainopt.knobs import kwargs as apply
from trainopt.settings.export.arguments import argument_lines, call_imports, unexpressed_lines
from trainopt.settings.export.lines import backend_lines, loader_lines, optimizer_args
from trainopt.settings.frameworks.common import optimizer_text
from trainopt.settings.production import TrainSettings

__all__ = ["render"]


def _module_lines(s: TrainSettings) -> list[str]:
    """What goes into the user's LightningModule, as comments (it is the user's class)."""
    v = s.settings
    lines = ["# In your LightningModule:"]
    compiled, mode = apply.compile_mode(v)
    if compiled:
        arg = f', mode="{mode}"' if mode else ""
        lines += [
            f"#   compile: {v['compile']} -> in __init__ (or configure_model): self.net = torch.compile(self.net{arg})",
            "#   (compile the inner nn.Module, as measured: torch.compile(lightning_module) fails at self.log())",
        ]
    else:
        lines.append("#   compile: off -> not compiled")
    if v["channels_last"]:
        lines += ["#   channels_last: true -> self.net.to(memory_format=torch.channels_last) in __init__, and",
                  "#   x = x.contiguous(memory_format=torch.channels_last) for 4-D inputs in training_step"]
    measured = (s.code or {}).get("optimizer")
    extra = optimizer_args(s).lstrip(", ")
    if measured:
        built = optimizer_text(dict(measured), s.settings, "self.parameters()")
        lines.append(f"#   configure_optimizers() must return the measured optimizer: {built}")
        lines.append("#   (s.build_optimizer(self.parameters()) builds it from best.yaml)")
    elif extra:
        lines.append(f"#   optimizer_impl: {v['optimizer_impl']} -> pass {extra} to your optimizer in configure_optimizers()")
    own = (s.code or {}).get("data_batch_size")
    if own is not None:
        lines += [f"# Your LightningDataModule (or LightningModule) built its DataLoader with batch_size={own}; trainopt measured",
                  f"# batch_size: {v['batch_size']} (the loader above); if you pass the data module to trainer.fit, build its",
                  "# train_dataloader() with s.dataloader_kwargs(); the Trainer calls prepare_data() and setup('fit') first"]
    return lines


def render(s: TrainSettings, header: list[str]) -> str:
    """A PyTorch Lightning setup: the backend flags, the DataLoader and the ``Trainer`` arguments.

    Args:
        s: The settings.
        header: The comment lines to start with.
    """
    fa = s.framework_args("lightning")
    collate = (s.code or {}).get("collate")
    lines = header + [
        "import lightning as L",
        *call_imports(fa),
        "import torch",
        "from torch.utils.data import DataLoader",
        "",
        *backend_lines(s),
        "",
        "loader = DataLoader(",
        "    dataset,  # your Dataset",
        *loader_lines(s, "    "),
        *([f"    collate_fn=collate_fn,  # code.collate: {collate}"] if collate else []),
        ")",
        "",
        *_module_lines(s),
        "",
        "trainer = L.Trainer(",
        *argument_lines(fa, "    "),
        ")",
        *unexpressed_lines(fa, "Trainer"),
        "trainer.fit(model, train_dataloaders=loader)",
    ]
    return "\n".join(lines) + "\n"
