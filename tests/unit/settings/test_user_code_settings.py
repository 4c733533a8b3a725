"""Production with the user's own training code: best.yaml's ``code:``, the loader's collate_fn, whole batches, the export."""

from __future__ import annotations

import sys
from collections import namedtuple

import pytest
import torch
import yaml

from tests.conftest import FIXTURES, ROOT
from tests.fixtures import user_code
from trainopt import load_settings
from trainopt.outputs.results import best_document
from trainopt.settings.export import render_settings
from trainopt.settings.production import TrainSettings, settings_from_dict
from trainopt.settings.record import SettingsError

MODULE = "tests.fixtures.user_code"


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))


def _doc() -> dict:
    """A results document with just what best_document reads."""
    return {
        "name": "text", "updated_at": "2025-01-01T00:00:00", "trainopt_version": "0", "complete": True,
        "decisions": [], "best": {"settings": {"batch_size": 16, "num_workers": 1}, "source": "baseline"},
        "baseline": {"settings": {"batch_size": 16}, "samples_per_s": 100.0}, "env": {},
    }


def _resolved(**extra) -> dict:
    return {"device": "cpu", "data": {"name": "d", "args": {}}, "loss": "cross_entropy", **extra}


# ---- best.yaml learns the code ----------------------------------------------------------------------


def test_best_yaml_names_the_code_only_when_the_spec_uses_its_own():
    assert "code" not in best_document(_doc(), _resolved())
    assert "code" not in best_document(_doc(), _resolved(loss="my.losses:focal"))
    text = best_document(_doc(), _resolved(data={"name": "d", "args": {}, "collate": "m:pad"}, loss="model"))
    assert text["code"] == {"collate": "m:pad", "loss": "model", "step": None}
    stepped = best_document(_doc(), _resolved(step="m:train_step"))
    # A step computes the loss: no loss beside it.
    assert stepped["code"] == {"collate": None, "step": "m:train_step"}
    # The document reads back into settings that carry it.
    assert dict(settings_from_dict(text).code) == text["code"]
    assert dict(settings_from_dict(stepped).code) == stepped["code"]


def test_best_yaml_records_the_optimizer_the_baseline_trial_built_else_the_specs():
    spec_only = best_document(_doc(), _resolved(optimizer={"name": "adamw", "args": {"lr": 3e-4, "fused": True}}))
    assert spec_only["code"]["optimizer"] == {"source": "spec", "name": "adamw", "class": "torch.optim.AdamW",
                                              "args": {"lr": 3e-4}}
    doc = _doc()
    built = {"source": "configure_optimizers", "name": None, "class": "torch.optim.SGD", "args": {"lr": 0.1}}
    doc["baseline"]["workload"] = {"form": "lightning", "optimizer": built, "data_batch_size": 4}
    lit = best_document(doc, {"device": "cpu", "loss": "cross_entropy", "model": {"name": "m:Module", "args": {}}})
    assert lit["code"] == {"collate": None, "step": None, "form": "lightning", "optimizer": built, "data_batch_size": 4}
    assert dict(settings_from_dict(lit).code) == lit["code"]


@pytest.mark.parametrize(
    "code, expected",
    [
        ({"collate": "pad"}, "code.collate: got 'pad'; use a 'module:callable'"),
        ({"step": 3}, "code.step: got 3"),
        ({"loss": "hinge"}, "code.loss: got 'hinge'; use one of cross_entropy, mse, model"),
        ({"step": "m:s", "loss": "model"}, "code.loss: got 'model', but code.step computes the loss itself"),
        ({"colate": "m:pad"}, "code.colate: unknown key (did you mean 'collate'?)"),
        ({"form": "trainer"}, "code.form: got 'trainer'; use one of pair, model, step, lightning"),
        ({"optimizer": {"args": {"lr": 1}}}, "code.optimizer: needs name or class"),
        ({"optimizer": {"class": "torch.optim.SGD", "lr": 1}}, "code.optimizer.lr: unknown key"),
        ({"optimizer": {"class": "torch optim"}}, "code.optimizer.class: got 'torch optim'"),
        ({"data_batch_size": 0}, "code.data_batch_size: got 0"),
        (["m:pad"], "code: expected a mapping"),
    ],
)
def test_a_bad_code_section_names_the_field(code, expected):
    with pytest.raises(SettingsError) as info:
        settings_from_dict({"settings": {}, "code": code}, source="best.yaml")
    assert expected in str(info.value)


def test_settings_without_code_have_none_and_no_collate():
    s = TrainSettings(device="cpu")
    assert s.code is None and s.collate_fn is None and "collate_fn" not in s.dataloader_kwargs()


# ---- the loader and whole batches --------------------------------------------------------------------


def _best_yaml(tmp_path, code: dict, **settings) -> str:
    path = tmp_path / "best.yaml"
    path.write_text(yaml.safe_dump({"device": "cpu", "settings": {"batch_size": 4, **settings}, "code": code}))
    return str(path)


def test_load_settings_gives_the_loader_its_collate_fn_and_moves_dict_batches(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    s = load_settings(_best_yaml(tmp_path, {"collate": f"{MODULE}:pad_collate", "loss": "model"}, channels_last=True),
                      warn=False)
    kwargs = s.dataloader_kwargs()
    assert kwargs["collate_fn"] is user_code.pad_collate and kwargs["batch_size"] == 4
    loader = s.dataloader(user_code.tokens(size=12), generator=torch.Generator().manual_seed(0))
    assert loader.collate_fn is user_code.pad_collate and loader.drop_last
    model = s.prepare_model(user_code.encoder())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **s.optimizer_kwargs())
    for step, batch in enumerate(loader):
        batch = s.to_device(batch)
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        with s.autocast():
            loss = model(**batch).loss
        s.backward_and_step(loss, optimizer, step)
    assert step == 2 and torch.isfinite(loss)


def test_a_file_collate_resolves_from_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    s = load_settings(_best_yaml(tmp_path, {"collate": "user_code.py:pad_collate"}), warn=False)
    assert s.collate_fn.__name__ == "pad_collate"
    monkeypatch.chdir(tmp_path)
    missing = load_settings(_best_yaml(tmp_path, {"collate": "user_code.py:pad_collate"}), warn=False)
    with pytest.raises(SettingsError) as info:
        missing.dataloader_kwargs()
    assert "code.collate 'user_code.py:pad_collate': file" in str(info.value)
    assert "(the current working directory)" in str(info.value)


def test_to_device_takes_any_structure_and_still_the_pair():
    s = TrainSettings(device="cpu", settings={"channels_last": True})
    Pair = namedtuple("Pair", ["pixels", "label"])
    batch = {"scene": Pair(torch.randn(2, 3, 4, 4), torch.tensor([1, 0])), "ids": torch.ones(2, 5, dtype=torch.long)}
    moved = s.to_device(batch)
    assert type(moved["scene"]) is Pair
    assert moved["scene"].pixels.is_contiguous(memory_format=torch.channels_last)
    assert moved["ids"].is_contiguous()
    x, y = s.to_device(torch.randn(2, 3, 4, 4), torch.tensor([0, 1]))
    assert x.is_contiguous(memory_format=torch.channels_last) and y.tolist() == [0, 1]


# ---- the export --------------------------------------------------------------------------------------


def test_the_torch_export_writes_the_collate_and_the_model_loss_loop():
    s = TrainSettings(device="cpu", settings={"channels_last": True, "amp": "bf16"},
                      code={"collate": f"{MODULE}:pad_collate", "loss": "model"})
    text = render_settings(s, "torch")
    assert f"from {MODULE} import pad_collate  # data.collate: {MODULE}:pad_collate" in text
    assert "    collate_fn=pad_collate,  # data.collate" in text
    assert "for step, batch in enumerate(loader):" in text and "    batch = to_device(batch)" in text
    assert "        loss = model_loss(model, batch)  # loss: model" in text
    assert "        output = model(**batch)" in text
    assert "batch.contiguous(memory_format=torch.channels_last)" in text


def test_the_torch_export_writes_the_step_call_under_a_name_the_loop_does_not_use():
    s = TrainSettings(device="cpu", code={"step": f"{MODULE}:scene_step"})
    text = render_settings(s, "torch")
    assert f"from {MODULE} import scene_step  # step: {MODULE}:scene_step" in text
    assert f"    loss = scene_step(model, batch)  # step: {MODULE}:scene_step (your forward and loss)" in text
    named_step = render_settings(TrainSettings(device="cpu", code={"step": "train:step"}), "torch")
    assert "from train import step as train_step" in named_step and "loss = train_step(model, batch)" in named_step
    assert "for step, (x, y) in enumerate(loader):" in render_settings(TrainSettings(device="cpu"), "torch")


def test_the_pasted_model_loss_export_trains(monkeypatch):
    monkeypatch.chdir(ROOT)
    s = TrainSettings(device="cpu", settings={"batch_size": 4, "grad_accum": 2, "sync_every": 1},
                      code={"collate": f"{MODULE}:pad_collate", "loss": "model"})
    torch.manual_seed(0)
    model = user_code.encoder()
    before = model.head.weight.detach().clone()
    printed = []
    scope = {"model": model, "dataset": user_code.tokens(size=16), "print": lambda *a: printed.append(a)}
    exec(compile(render_settings(s, "torch"), "<export>", "exec"), scope)
    assert len(printed) == 2  # 4 micro-batches, 2 optimizer steps, the loss read after each
    assert not torch.equal(before, model.head.weight)


def test_the_yaml_export_keeps_the_code_section():
    s = TrainSettings(device="cpu", code={"collate": "m:pad", "loss": "model"})
    again = settings_from_dict(yaml.safe_load(render_settings(s, "yaml")))
    assert again.code == s.code
