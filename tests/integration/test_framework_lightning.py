"""Settings in PyTorch Lightning for real: ``L.Trainer(**s.trainer_kwargs("lightning"))`` trains 3 steps on a CPU.

Each case is a best.yaml measured on a CPU; the Trainer is built from exactly the kwargs
the settings give, the LightningModule follows what ``s.unexpressed("lightning")`` asks
(compile the inner module, the optimizer's kernels, the DataLoader from
``s.dataloader_kwargs()``), and the test checks that what ran is what was measured. The
data-parallel case runs as 2 processes with gloo under torchrun.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainopt.knobs.catalog import KNOBS
from trainopt.knobs.kwargs import compile_mode
from trainopt.settings.production import load_settings

pytestmark = pytest.mark.integration

L = pytest.importorskip("lightning", reason="the lightning extra is not installed")
torch = pytest.importorskip("torch")

ENV_CPU = {"device_type": "cpu", "device_name": "test CPU", "torch": str(torch.__version__)}


def write_best(path: Path, settings: dict, device: str = "cpu", distributed: dict | None = None,
               code: dict | None = None) -> Path:
    """A best.yaml as a search writes it: the changed knobs listed as kept, the CPU fingerprint recorded."""
    doc = {"schema_version": 1, "kind": "trainopt-settings", "device": device, "settings": settings,
           "provenance": {"kept": [{"knob": k, "from": KNOBS[k].default, "to": v} for k, v in settings.items()
                                   if v != KNOBS[k].default],
                          "env": dict(ENV_CPU)}}
    if distributed:
        doc["distributed"] = distributed
    if code:
        doc["code"] = code
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class TinyModule(L.LightningModule):
    """A conv net on 8x8 images that logs its loss, as a user's module would."""

    def __init__(self, s):
        super().__init__()
        self.s = s
        self.net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                       torch.nn.Linear(4 * 6 * 6, 2))
        compiled, mode = compile_mode(s.settings)
        if compiled:
            self.net = torch.compile(self.net, mode=mode)  # the inner module, as unexpressed() says
        self.output_dtypes: list = []
        self.steps_run = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self.net(x)
        self.output_dtypes.append(out.dtype)
        self.steps_run += 1
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, **self.s.optimizer_kwargs())


def tiny_dataset(n: int = 64):
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 2, (n,), generator=g))


def fit(s, steps: int = 3, **extra):
    """Build the Trainer from the settings' kwargs and train ``steps`` optimizer steps."""
    module = TinyModule(s)
    loader = torch.utils.data.DataLoader(tiny_dataset(), shuffle=True, **s.dataloader_kwargs())
    trainer = L.Trainer(**s.trainer_kwargs("lightning"), max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **extra)
    trainer.fit(module, train_dataloaders=loader)
    return trainer, module


CASES = {
    "full-precision": {},
    "bf16-accum-sparse-logging": {"amp": "bf16", "grad_accum": 2, "sync_every": 2, "batch_size": 8},
    "fp16-no-loss-reads": {"amp": "fp16", "sync_every": 0},
    "workers-foreach": {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "optimizer_impl": "foreach"},
    "fused-compiled": {"optimizer_impl": "fused", "compile": "default"},
}
DTYPES = {"off": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@pytest.mark.parametrize("case", sorted(CASES))
def test_trainer_from_settings_trains_as_measured(tmp_path, case):
    settings = CASES[case]
    s = load_settings(write_best(tmp_path / "best.yaml", settings), warn=False)
    trainer, module = fit(s)
    v = s.settings
    assert trainer.global_step == 3
    assert module.steps_run == 3 * v["grad_accum"]
    assert trainer.accumulate_grad_batches == v["grad_accum"]
    # What autocast really ran: fp16 stays fp16 on a CPU (Lightning would substitute bf16 for "16-mixed").
    assert set(module.output_dtypes) == {DTYPES[v["amp"]]}
    if v["amp"] == "fp16":
        assert isinstance(trainer.precision_plugin.scaler, torch.amp.GradScaler)
    # sync_every: 1 is no decision, so Lightning's own cadence stays.
    assert trainer.log_every_n_steps == (v["sync_every"] if "sync_every" in settings and v["sync_every"] else 50)
    defaults = trainer.optimizers[0].defaults
    assert bool(defaults.get("foreach")) == (v["optimizer_impl"] == "foreach")
    assert bool(defaults.get("fused")) == (v["optimizer_impl"] == "fused")
    assert hasattr(module.net, "_orig_mod") == (v["compile"] != "off")
    assert trainer.strategy.root_device.type == "cpu"
    named = {u.setting for u in s.unexpressed("lightning")}
    assert ("compile" in named) == (v["compile"] != "off")
    assert ("sync_every" in named) == (v["sync_every"] == 0)


def test_compiling_the_lightning_module_itself_fails_at_self_log(tmp_path):
    """Why the compile recipe compiles the inner module: the whole LightningModule fails at self.log()."""
    s = load_settings(write_best(tmp_path / "best.yaml", {}), warn=False)
    module = torch.compile(TinyModule(s))
    trainer = L.Trainer(**s.trainer_kwargs("lightning"), max_steps=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(Exception, match="'method' object has no attribute '__dict__'"):
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(tiny_dataset(), batch_size=8))


class MeasuredOptimizer(TinyModule):
    """A module whose configure_optimizers() returns what the export says: the measured optimizer."""

    def configure_optimizers(self):
        return self.s.build_optimizer(self.parameters())


OPTIMIZERS = {
    "spec AdamW": {"source": "spec", "name": "adamw", "class": "torch.optim.AdamW",
                   "args": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1}},
    "configure_optimizers SGD": {"source": "configure_optimizers", "name": None, "class": "torch.optim.SGD",
                                 "args": {"lr": 0.02, "momentum": 0.9, "nesterov": True}},
}


@pytest.mark.parametrize("case", sorted(OPTIMIZERS))
def test_configure_optimizers_returns_the_measured_optimizer_the_export_names(tmp_path, case):
    measured = OPTIMIZERS[case]
    code = {"collate": None, "step": None, "form": "lightning", "optimizer": measured, "data_batch_size": 4}
    s = load_settings(write_best(tmp_path / "best.yaml", {"optimizer_impl": "foreach", "batch_size": 8}, code=code),
                      warn=False)
    told = {u.setting: u for u in s.unexpressed("lightning")}
    built = f"{measured['class']}(self.parameters(), "
    assert told["code.optimizer"].value.startswith(built) and "foreach=True" in told["code.optimizer"].value
    assert "code.data_batch_size" in told and "prepare_data()" in told["code.data_batch_size"].instead
    assert "batch_size=8" in told["code.data_batch_size"].instead
    module = MeasuredOptimizer(s)
    loader = torch.utils.data.DataLoader(tiny_dataset(), shuffle=True, **s.dataloader_kwargs())
    trainer = L.Trainer(**s.trainer_kwargs("lightning"), max_steps=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, train_dataloaders=loader)
    optimizer = trainer.optimizers[0]
    assert trainer.global_step == 3 and f"torch.optim.{type(optimizer).__name__}" == measured["class"]
    group = optimizer.param_groups[0]
    assert {k: list(group[k]) if isinstance(group[k], tuple) else group[k] for k in measured["args"]} == measured["args"]
    assert optimizer.defaults["foreach"] is True
    # Lightning clips no gradients unless told: as measured.
    assert trainer.gradient_clip_val is None


DDP_SCRIPT = """
import json, sys, warnings
import lightning as L
import torch
from trainopt.settings.production import load_settings
from tests.integration.test_framework_lightning import fit


class Wrapped(L.Callback):
    # Lightning unwraps the model when fit ends: read DDP's arguments while it trains.
    def on_train_start(self, trainer, pl_module):
        ddp = trainer.strategy.model
        self.info = {"ddp": type(ddp).__name__, "bucket_bytes": ddp.bucket_bytes_cap,
                     "as_view": ddp.gradient_as_bucket_view, "forward_sync_buffers": ddp.forward_sync_buffers,
                     "find_unused": ddp.find_unused_parameters, "backend": torch.distributed.get_backend()}


s = load_settings(sys.argv[1], warn=False)
s.apply_backend_flags()
grab = Wrapped()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trainer, module = fit(s, callbacks=[grab])
if trainer.global_rank == 0:
    json.dump({"steps": trainer.global_step, "world": trainer.world_size, **grab.info,
               "warnings": [str(w.message) for w in caught]}, open(sys.argv[2], "w"))
"""

# Every DDP knob off its default that can go with accumulation (static_graph cannot).
DDP_SETTINGS = {"batch_size": 8, "threads": 1, "grad_accum": 2, "ddp_bucket_cap_mb": 1, "ddp_gradient_as_bucket_view": True,
                "ddp_broadcast_buffers": False}


def test_ddp_trainer_from_settings_under_torchrun(tmp_path, cli_env):
    best = write_best(tmp_path / "best.yaml", DDP_SETTINGS, distributed={"nproc_per_node": 2, "backend": "gloo"})
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
         "--max-restarts=0", str(script), str(best), str(out)],
        capture_output=True, text=True, env=dict(cli_env, OMP_NUM_THREADS="1"), timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["steps"] == 3 and doc["world"] == 2 and doc["ddp"] == "DistributedDataParallel"
    assert doc["backend"] == "gloo" and doc["find_unused"] is False
    assert doc["bucket_bytes"] == 1024 * 1024 and doc["as_view"] is True and doc["forward_sync_buffers"] is False
    # The buffer knob goes by the name this torch takes: no deprecation warning.
    assert not [w for w in doc["warnings"] if "broadcast_buffers" in w]
