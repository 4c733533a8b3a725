"""Code nobody here wrote, taken as it is through the real CLI (``python -m trainopt``).

Lightning's own demo modules (``BoringModel``, a plain subclass of it, ``LightningTransformer``
fed by a data module of synthetic tokens), a Hugging Face model built from a config with a
``datasets.Dataset``, a GPT-shaped model returning ``(logits, loss)`` built through a config
factory, and a stock module referenced by ``module:callable`` with arguments: each measures;
the demo transformer is searched, and its best.yaml and exports carry what was measured;
``validate`` rejects a factory argument without running a trial.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT, tiny_spec_dict
from tests.integration.test_user_code import _search, measure

pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.integration

DEMOS = "lightning.pytorch.demos"
FIXTURE = "tests.fixtures.third_party"
GPT = f"{ROOT / 'examples' / 'your_code_gpt.py'}"


def spec_for(model: str, model_args=None, data=None, **overrides) -> dict:
    spec = tiny_spec_dict()
    spec["model"] = {"name": model, "args": model_args or {}}
    for key in ("data", "optimizer", "loss"):
        spec.pop(key)
    spec.update(overrides)  # what the module does not supply itself
    if data is not None:
        spec["data"] = data
    spec["baseline"] = {"batch_size": 8, "threads": 1}
    return spec


TRANSFORMER = spec_for(f"{DEMOS}.transformer:LightningTransformer", {"vocab_size": 64},
                       {"datamodule": f"{FIXTURE}:demo_tokens", "args": {"size": 64}})


@pytest.mark.parametrize(
    "spec",
    [
        spec_for(f"{DEMOS}.boring_classes:BoringModel"),
        spec_for(f"{FIXTURE}:boring_subclass"),
        TRANSFORMER,
    ],
    ids=["BoringModel", "a subclass of BoringModel", "LightningTransformer with a data module"],
)
def test_lightnings_own_modules_measure_unchanged(write_spec, cli_env, spec):
    r = measure(write_spec, cli_env, spec)
    assert r["status"] == "ok", r["error"]
    assert r["samples_per_s"] > 0 and r["last_loss"] is not None
    assert r["workload"]["form"] == "lightning"
    # Their own configure_optimizers(): SGD at lr 0.1, recorded as built.
    assert r["workload"]["optimizer"] == {"source": "configure_optimizers", "name": None, "class": "torch.optim.SGD",
                                          "args": {"lr": 0.1}}


def test_the_demo_transformer_searches_and_its_settings_carry_what_was_measured(tmp_path, cli_env):
    spec = json.loads(json.dumps(TRANSFORMER))
    spec["search"] = {"num_workers": [0, 1]}
    proc, out = _search(tmp_path, cli_env, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and doc["baseline"]["status"] == "ok"
    assert {d["knob"] for d in doc["decisions"]} == {"num_workers"}
    best = yaml.safe_load((out / "best.yaml").read_text())
    # training_step computes the loss: no loss beside it; the data module's loader asked for 4.
    assert best["code"] == {"collate": None, "step": None, "form": "lightning", "data_batch_size": 4,
                            "optimizer": {"source": "configure_optimizers", "name": None, "class": "torch.optim.SGD",
                                          "args": {"lr": 0.1}}}
    exports = {}
    for fmt in ("torch", "lightning"):
        done = subprocess.run([sys.executable, "-m", "trainopt", "export", str(out), "--format", fmt],
                              capture_output=True, text=True, env=cli_env, timeout=120)
        assert done.returncode == 0, done.stderr
        exports[fmt] = done.stdout
    assert "return self.module.training_step(batch, batch_idx)" in exports["torch"]
    assert "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # what configure_optimizers() built" in exports["torch"]
    assert "loss_fn" not in exports["torch"]
    assert "keep configure_optimizers() returning torch.optim.SGD(self.parameters(), lr=0.1)" in exports["lightning"]
    assert "asked for batch_size=4" in exports["lightning"] and "prepare_data()" in exports["lightning"]


@pytest.mark.parametrize(
    "spec, note",
    [
        (spec_for(f"{GPT}:gpt", {"n_layer": 1, "n_embd": 16}, {"name": f"{GPT}:next_tokens", "args": {"size": 64}},
                  loss="model", optimizer={"name": "adamw", "args": {"lr": 3e-4}}),
         "loss 'model': the model's output is a tuple (a tensor of shape [8, 16, 64], a scalar tensor); element 1, "
         "its one scalar tensor, is the loss"),
        (spec_for(f"{FIXTURE}:hf_gpt2", {"n_layer": 1}, {"name": f"{FIXTURE}:hf_tokens", "args": {"size": 64}},
                  loss="model", optimizer={"name": "adamw", "args": {"lr": 1e-3}}), None),
        (spec_for("torch.nn:Linear", {"in_features": 16, "out_features": 2},
                  {"name": "synthetic-tabular", "args": {"size": 256, "features": 16, "num_classes": 2}},
                  loss="cross_entropy"), None),
    ],
    ids=["(logits, loss) through a config factory", "HF model from a config, datasets.Dataset", "torch.nn:Linear with args"],
)
def test_third_party_shaped_models_measure(write_spec, cli_env, spec, note):
    r = measure(write_spec, cli_env, spec)
    assert r["status"] == "ok", r["error"]
    assert r["samples_per_s"] > 0 and r["last_loss"] is not None
    assert r["loss_note"] == note
    expected = spec.get("optimizer") or {"name": "sgd", "args": {"lr": 0.1, "momentum": 0.9}}
    assert r["workload"]["optimizer"]["name"] == expected["name"] and r["workload"]["optimizer"]["args"] == expected["args"]


GPT_CLASS = """
import torch


class GPTConfig:
    def __init__(self, n_layer=1, n_embd=16):
        self.n_layer, self.n_embd = n_layer, n_embd


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        raise RuntimeError("never built by validate")


def gpt(n_layer=1, n_embd=16):
    return GPT(GPTConfig(n_layer, n_embd))
"""


@pytest.mark.parametrize(
    "model, code, message",
    [
        ({"name": "model.py:GPT", "args": {"n_layer": 2}}, 2,
         "trainopt: error: model.args: unknown key(s) 'n_layer' for 'model.py:GPT'; allowed: config (it takes a config object"),
        ({"name": "model.py:gpt", "args": {"n_layers": 2}}, 2,
         "trainopt: error: model.args: unknown key(s) 'n_layers' for 'model.py:gpt'; allowed: n_layer, n_embd (did you mean"),
        ({"name": "resnet18", "args": {"classes": 10}}, 2, "trainopt: error: model.args: unknown key(s) 'classes' for resnet18"),
        ({"name": "model.py:gpt", "args": {"n_layer": 2}}, 0, ""),
    ],
    ids=["class taking a config", "typo", "builtin", "the config factory is valid"],
)
def test_validate_checks_factory_arguments_in_a_child_without_running_a_trial(tmp_path, cli_env, model, code, message):
    (tmp_path / "model.py").write_text(GPT_CLASS)
    spec = tiny_spec_dict(model=model)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    proc = subprocess.run([sys.executable, "-m", "trainopt", "validate", "spec.yaml"], capture_output=True, text=True,
                          env=cli_env, timeout=120, cwd=tmp_path)
    assert proc.returncode == code, proc.stderr
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") <= 1
    assert not list(tmp_path.glob("trainopt-runs*"))  # no trial ran, no output folder
