"""Every form of the torch export builds the optimizer the trials built and trains with it.

Each case is a best.yaml ``code:`` section as a search writes it (the spec's optimizer, or
what a LightningModule's ``configure_optimizers()`` built); the rendered script runs for a
few steps in this process over a real model and data set, and the optimizer it built is
compared, class and arguments, with the spec's. ``s.build_optimizer`` builds the same one.
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.conftest import ROOT
from tests.fixtures import user_code
from trainopt.contract.reference import resolve_reference
from trainopt.settings.export import render_settings
from trainopt.settings.production import TrainSettings

pytest.importorskip("lightning.pytorch")


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.chdir(ROOT)


ADAMW = {"source": "spec", "name": "adamw", "class": "torch.optim.AdamW",
         "args": {"lr": 3e-4, "betas": [0.9, 0.95], "weight_decay": 0.1, "eps": 1e-6}}
SGD = {"source": "spec", "name": "sgd", "class": "torch.optim.SGD", "args": {"lr": 0.05, "momentum": 0.9}}
FACTORY = {"source": "spec", "name": "tests.fixtures.user_code:make_sgd", "class": "torch.optim.SGD",
           "args": {"lr": 0.02}}
LIGHTNING = {"source": "configure_optimizers", "name": None, "class": "torch.optim.SGD", "args": {"lr": 0.1}}


def _gpt(name: str):
    return resolve_reference(f"examples/your_code_gpt.py:{name}", ROOT)


def pairs():
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(32, 32, generator=g), torch.randint(0, 2, (32,), generator=g))


def case(name):
    """(code section, model, data set, extra names the pasted script expects)."""
    if name == "pair":
        return ({"collate": None, "loss": "cross_entropy", "step": None, "form": "pair", "optimizer": SGD},
                torch.nn.Linear(32, 2), pairs(), {"loss_fn": torch.nn.functional.cross_entropy})
    if name == "model (logits, loss)":
        return ({"collate": None, "loss": "model", "step": None, "form": "model", "optimizer": ADAMW},
                _gpt("gpt")(), _gpt("next_tokens")(size=32), {})
    if name == "model (dict batches)":
        return ({"collate": "tests.fixtures.user_code:pad_collate", "loss": "model", "step": None, "form": "model",
                 "optimizer": FACTORY}, user_code.encoder(), user_code.tokens(size=32), {})
    if name == "step":
        return ({"collate": None, "step": "tests/fixtures/user_code.py:pair_step", "form": "step", "optimizer": ADAMW},
                torch.nn.Linear(32, 2), pairs(), {})
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

    return ({"collate": None, "step": None, "form": "lightning", "optimizer": LIGHTNING, "data_batch_size": 1},
            BoringModel(), RandomDataset(32, 64), {})


def hyper(optimizer: torch.optim.Optimizer, keys) -> dict:
    group = optimizer.param_groups[0]
    return {k: list(group[k]) if isinstance(group[k], tuple) else group[k] for k in keys}


@pytest.mark.parametrize("name", ["pair", "model (logits, loss)", "model (dict batches)", "step", "lightning"])
@pytest.mark.parametrize("impl", ["default", "foreach"])
def test_the_pasted_torch_export_trains_with_the_measured_optimizer(name, impl):
    code, model, dataset, extra = case(name)
    s = TrainSettings(device="cpu", settings={"batch_size": 8, "optimizer_impl": impl, "sync_every": 0}, code=code)
    text = render_settings(s, "torch")
    before = [p.detach().clone() for p in model.parameters()]
    scope = {"model": model, "dataset": dataset, **extra}
    exec(compile(text, "<export>", "exec"), scope)
    optimizer = scope["optimizer"]
    spec = code["optimizer"]
    assert f"{type(optimizer).__module__.split('.')[0]}.optim.{type(optimizer).__name__}" == spec["class"]
    assert hyper(optimizer, spec["args"]) == spec["args"]
    assert bool(optimizer.defaults.get("foreach")) == (impl == "foreach")
    # It trained: the optimizer steps moved the weights.
    assert any(not torch.equal(a, b) for a, b in zip(before, scope["model"].parameters()))
    built = s.build_optimizer(torch.nn.Linear(2, 2).parameters())
    assert type(built) is type(optimizer) and hyper(built, spec["args"]) == spec["args"]


def test_a_lightning_module_is_trained_by_its_training_step_in_the_export():
    code, model, dataset, _ = case("lightning")
    text = render_settings(TrainSettings(device="cpu", settings={"batch_size": 8}, code=code), "torch")
    assert "return self.module.training_step(batch, batch_idx)" in text and "loss_fn" not in text
    assert "its own DataLoader asked for batch_size=1" in text and "datamodule.prepare_data()" in text
    assert "torch.optim.SGD(model.parameters(), lr=0.1)  # what configure_optimizers() built" in text


def test_a_step_in_a_file_is_imported_and_called():
    code, *_ = case("step")
    text = render_settings(TrainSettings(device="cpu", code=code), "torch")
    assert "sys.path.insert(0, 'tests/fixtures')\nfrom user_code import pair_step" in text
    assert "    loss = pair_step(model, batch)  # step:" in text
    assert "# loss" not in text and "loss_fn" not in text
