"""Settings in Hugging Face's Trainer for real: ``TrainingArguments(**s.trainer_kwargs("hf"))`` trains 3 steps on a CPU.

A tiny GPT-2 built from a config (no download) trains with arguments built from exactly
the kwargs the settings give, plus what ``s.unexpressed("hf")`` asks for; the test checks
the optimizer kernels, precision, accumulation, loss logging and loader the Trainer ran
with against the settings. The data-parallel case runs as 2 processes with gloo under torchrun.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainopt.settings.production import load_settings
from tests.integration.test_framework_lightning import write_best

pytestmark = pytest.mark.integration

transformers = pytest.importorskip("transformers", reason="the transformers extra is not installed")
torch = pytest.importorskip("torch")

MIXED = {"off": "no", "bf16": "bf16", "fp16": "fp16"}


class TokenData(torch.utils.data.Dataset):
    """Fixed random token sequences, language-model style (labels are the inputs)."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def tiny_model():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16)
    return transformers.GPT2LMHeadModel(config)


class BagOfTokens(torch.nn.Module):
    """A language model small enough that compiling it on a CPU takes seconds, not a minute (GPT-2's does)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 8)
        self.head = torch.nn.Linear(8, 64)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return {"loss": loss, "logits": logits}


def build_trainer(s, out_dir, steps: int = 3, callbacks=None):
    """TrainingArguments from the settings' kwargs, and what unexpressed() asks the Trainer for."""
    args = transformers.TrainingArguments(output_dir=str(out_dir), max_steps=steps, report_to="none", save_strategy="no",
                                          disable_tqdm=True, **s.trainer_kwargs("hf"))
    extra = {}
    if any(u.setting == "optimizer_impl" for u in s.unexpressed("hf")):
        extra["optimizer_cls_and_kwargs"] = (torch.optim.AdamW, {"lr": args.learning_rate, **s.optimizer_kwargs()})
    model = BagOfTokens() if args.torch_compile else tiny_model()
    return transformers.Trainer(model=model, args=args, train_dataset=TokenData(), callbacks=callbacks, **extra)


CASES = {
    # device: auto that ran on a CPU, with bf16: TrainingArguments raised without use_cpu.
    "auto-bf16-accum-no-loss-reads": ("auto", {"amp": "bf16", "grad_accum": 2, "sync_every": 0, "batch_size": 4}),
    "defaults": ("cpu", {}),
    "fp16-sparse-logging": ("cpu", {"amp": "fp16", "sync_every": 2, "batch_size": 4}),
    "workers-fused": ("cpu", {"num_workers": 2, "persistent_workers": True, "prefetch_factor": 4, "optimizer_impl": "fused"}),
    "foreach": ("cpu", {"optimizer_impl": "foreach"}),
    "compiled": ("cpu", {"compile": "default", "batch_size": 4}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_training_arguments_from_settings_train_as_measured(tmp_path, case):
    device, settings = CASES[case]
    s = load_settings(write_best(tmp_path / "best.yaml", settings, device=device), warn=False)
    trainer = build_trainer(s, tmp_path / "out")
    trainer.train()
    v, args = s.settings, trainer.args
    assert trainer.state.global_step == 3
    assert args.use_cpu and args.device.type == "cpu"
    assert args.per_device_train_batch_size == v["batch_size"]
    assert args.gradient_accumulation_steps == v["grad_accum"]
    assert trainer.accelerator.mixed_precision == MIXED[v["amp"]]
    # The optimizer's kernels are the measured ones, not the Trainer's default fused AdamW.
    defaults = trainer.optimizer.optimizer.defaults
    assert bool(defaults.get("fused")) == (v["optimizer_impl"] == "fused")
    assert bool(defaults.get("foreach")) == (v["optimizer_impl"] == "foreach")
    logged = [entry["step"] for entry in trainer.state.log_history if "loss" in entry]
    if "sync_every" in settings:
        assert logged == [n for n in (1, 2, 3) if v["sync_every"] and n % v["sync_every"] == 0]
        assert args.logging_nan_inf_filter is False  # sparse reads: no per-step NaN check on the host
    else:
        # sync_every: 1 was no decision: the Trainer's own cadence (every 500 steps) and filter stay.
        assert logged == [] and args.logging_steps == 500 and args.logging_nan_inf_filter is True
    assert args.dataloader_num_workers == v["num_workers"]
    assert args.dataloader_persistent_workers == v["persistent_workers"]
    assert args.torch_compile == (v["compile"] != "off")
    assert hasattr(trainer.model_wrapped, "_orig_mod") == (v["compile"] != "off")
    assert args.dataloader_drop_last == (v["compile"] != "off")


OPTIMIZERS = {
    "AdamW with its hyperparameters": {"source": "spec", "name": "adamw", "class": "torch.optim.AdamW",
                                       "args": {"lr": 1e-3, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.05}},
    "AdamW at torch's defaults": {"source": "spec", "name": "adamw", "class": "torch.optim.AdamW", "args": {"lr": 2e-3}},
    "SGD with momentum": {"source": "spec", "name": "sgd", "class": "torch.optim.SGD",
                          "args": {"lr": 0.05, "momentum": 0.9}},
}
ADAMW_DEFAULTS = {"betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 1e-2}


@pytest.mark.parametrize("case", sorted(OPTIMIZERS))
def test_the_trainer_trains_with_the_measured_optimizer_and_learning_rate(tmp_path, case):
    measured = OPTIMIZERS[case]
    code = {"collate": None, "loss": "model", "step": None, "form": "model", "optimizer": measured}
    s = load_settings(write_best(tmp_path / "best.yaml", {"batch_size": 4}, code=code), warn=False)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=3, report_to="none",
                                          save_strategy="no", disable_tqdm=True, **s.trainer_kwargs("hf"))
    model = tiny_model()
    told = {u.setting: u for u in s.unexpressed("hf")}
    extra = {}
    if "code.optimizer" in told:
        # What the unexpressed record says to do: the measured optimizer, built by the settings.
        assert "optimizer_cls_and_kwargs=(torch.optim.SGD, {'lr': 0.05, 'momentum': 0.9})" in told["code.optimizer"].instead
        extra["optimizer_cls_and_kwargs"] = (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, **s.optimizer_kwargs()})
    trainer = transformers.Trainer(model=model, args=args, train_dataset=TokenData(), **extra)
    trainer.train()
    optimizer = trainer.optimizer.optimizer
    assert trainer.state.global_step == 3
    assert f"torch.optim.{type(optimizer).__name__}" == measured["class"]
    expected = {**(ADAMW_DEFAULTS if measured["class"] == "torch.optim.AdamW" else {}), **measured["args"]}
    group = optimizer.param_groups[0]
    # The learning rate the optimizer was built with (the Trainer's schedule moves group["lr"] from it).
    assert group["initial_lr"] == expected["lr"]
    for key, value in expected.items():
        if key != "lr":
            assert (list(group[key]) if isinstance(group[key], tuple) else group[key]) == value, key
    # No clipping was measured; the Trainer's own default clips at 1.0.
    assert args.max_grad_norm == 0.0


DDP_SCRIPT = """
import json, sys, warnings
import transformers
import torch
from trainopt.settings.production import load_settings
from tests.integration.test_framework_hf import build_trainer


class Wrapped(transformers.TrainerCallback):
    # What unexpressed() says for ddp_broadcast_buffers on this torch, and a look at DDP's arguments.
    def __init__(self):
        self.trainer, self.info = None, None

    def on_step_begin(self, args, state, control, **kwargs):
        ddp = self.trainer.model_wrapped
        ddp.forward_sync_buffers = False
        if self.info is None:
            self.info = {"ddp": type(ddp).__name__, "bucket_bytes": ddp.bucket_bytes_cap, "static": ddp.static_graph,
                         "find_unused": ddp.find_unused_parameters, "backend": torch.distributed.get_backend()}


s = load_settings(sys.argv[1], warn=False)
s.apply_backend_flags()
grab = Wrapped()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    trainer = build_trainer(s, sys.argv[3], callbacks=[grab])
    grab.trainer = trainer
    trainer.train()
if trainer.is_world_process_zero():
    json.dump({"steps": trainer.state.global_step, "world": trainer.args.world_size, **grab.info,
               "unexpressed": [u.setting for u in s.unexpressed("hf")],
               "warnings": [str(w.message) for w in caught]}, open(sys.argv[2], "w"))
"""

DDP_SETTINGS = {"batch_size": 4, "threads": 1, "ddp_bucket_cap_mb": 1, "ddp_static_graph": True, "ddp_broadcast_buffers": False}


def test_ddp_training_arguments_from_settings_under_torchrun(tmp_path, cli_env):
    best = write_best(tmp_path / "best.yaml", DDP_SETTINGS, distributed={"nproc_per_node": 2, "backend": "gloo"})
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
         "--max-restarts=0", str(script), str(best), str(out), str(tmp_path / "trainer")],
        capture_output=True, text=True, env=dict(cli_env, OMP_NUM_THREADS="1"), timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["steps"] == 3 and doc["world"] == 2 and doc["ddp"] == "DistributedDataParallel"
    assert doc["backend"] == "gloo"
    # The Trainer's own default is find_unused_parameters=True; the settings say False, as measured.
    assert doc["find_unused"] is False
    assert doc["bucket_bytes"] == 1024 * 1024 and doc["static"] is True
    # This torch renamed the buffer argument, which the Trainer cannot pass: it is unexpressed, not a warning.
    assert doc["unexpressed"] == ["ddp_broadcast_buffers", "threads"]
    assert not [w for w in doc["warnings"] if "broadcast_buffers" in w]
