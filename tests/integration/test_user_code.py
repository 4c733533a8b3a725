"""The user's training code as it is, in real trial processes and a real search through the CLI.

Dict batches with a padding collate and a model computing its own loss (``loss: model``),
a ``step:`` over nested batches with an image inside, namedtuple, dataclass and
detection-style batches; every clear error as an ``error`` result with one line; a small
search over batch size and loader workers that finishes and leaves a best.yaml production
code can load.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import FIXTURES, tiny_spec_dict

pytestmark = pytest.mark.integration

CODE = f"{FIXTURES / 'user_code.py'}"


def user_spec(model: str, data: str, model_args=None, collate=None, **overrides) -> dict:
    spec = tiny_spec_dict(**overrides)
    spec["model"] = {"name": f"{CODE}:{model}", "args": model_args or {}}
    spec["data"] = {"name": f"{CODE}:{data}", "args": {}}
    if collate:
        spec["data"]["collate"] = f"{CODE}:{collate}"
    spec["optimizer"] = {"name": "adam", "args": {"lr": 0.01}}
    spec["baseline"] = {"batch_size": 8, "threads": 1}
    return spec


TEXT = dict(model="encoder", data="tokens", collate="pad_collate", loss="model")


def measure(write_spec, cli_env, spec, *sets, timeout=180):
    path = write_spec(spec)
    out = path.parent / "out"
    cmd = [sys.executable, "-m", "trainopt", "measure", str(path), "--json", "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=cli_env, timeout=timeout, cwd=path.parent)
    assert proc.stdout.strip().startswith("{"), proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "spec, sets",
    [
        (user_spec(**TEXT), ["num_workers=1"]),
        (user_spec("scene_net", "scenes", {"expect_channels_last": True}, step=f"{CODE}:scene_step"),
         ["channels_last=true", "grad_accum=2"]),
        (user_spec("regressor", "samples", loss="model"), []),
        (user_spec("batch_regressor", "samples", collate="to_batch", loss="model"), []),
        (user_spec("detector", "boxes", collate="detection_collate", loss="model"), ["channels_last=true"]),
    ],
    ids=["dict batches, loss: model", "step, nested, channels_last", "namedtuple", "dataclass", "detection losses"],
)
def test_every_form_measures_ok(write_spec, cli_env, spec, sets):
    r = measure(write_spec, cli_env, spec, *sets)
    assert r["status"] == "ok", r["error"]
    assert r["samples_per_s"] > 0 and r["first_loss"] is not None and r["last_loss"] is not None


def test_channels_last_is_not_applicable_to_batches_without_images(write_spec, cli_env):
    r = measure(write_spec, cli_env, user_spec(**TEXT), "channels_last=true")
    assert r["status"] == "not_applicable"
    assert r["error"].startswith("channels_last needs a 4-D floating tensor")


@pytest.mark.parametrize(
    "spec, sets, start",
    [
        (user_spec("scene_net", "scenes", step=f"{CODE}:logits_step"), [],
         f"WorkloadError: step '{CODE}:logits_step': what it returned (a dict with keys logits) carries no loss"),
        (user_spec("encoder", "tokens", collate="pad_collate_unlabelled", loss="model"), [],
         "WorkloadError: loss 'model': the model's output (a ClassifierOutput dataclass) carries no loss"),
        (user_spec("encoder", "tokens", {"output": "logits"}, collate="pad_collate", loss="model"), [],
         "WorkloadError: loss 'model': the model's output is a tensor of shape [8, 3], not a scalar loss"),
        (user_spec("encoder", "tokens", collate="pad_collate_mask", loss="model"), [],
         "WorkloadError: loss 'model': the model cannot be called as model(**batch) with a dict with keys input_ids, mask"),
        (user_spec("locked_regressor", "locked", collate="keep_lock", loss="model"), ["num_workers=2"],
         f"WorkloadError: data.collate '{CODE}:keep_lock': a batch cannot be pickled"),
    ],
    ids=["step without a loss", "model output without a loss", "logits under loss: model", "keys forward does not take",
         "unpicklable with workers"],
)
def test_what_does_not_fit_is_one_error_line_naming_the_field(write_spec, cli_env, spec, sets, start):
    r = measure(write_spec, cli_env, spec, *sets, timeout=120)
    assert r["status"] == "error"
    assert r["error"].startswith(start) and "\n" not in r["error"]


def _search(tmp_path: Path, cli_env, spec: dict) -> tuple[subprocess.CompletedProcess, Path]:
    spec["measure"].update(pairs=3, max_pairs=4, confidence=0.75, windows=3, window_seconds=0.1, warmup_seconds=0.1)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "trainopt", "search", str(path), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, env=cli_env, timeout=900, cwd=tmp_path)
    return proc, out


def test_a_search_with_loss_model_finishes_and_production_loads_it(tmp_path, cli_env, monkeypatch):
    spec = user_spec(**TEXT, search={"batch_size": {"max": 16, "max_candidates": 1}, "num_workers": [0, 1]})
    proc, out = _search(tmp_path, cli_env, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and doc["baseline"]["status"] == "ok"
    assert {d["knob"] for d in doc["decisions"]} >= {"num_workers"}
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["code"] == {"collate": f"{CODE}:pad_collate", "loss": "model", "step": None, "form": "model",
                            "optimizer": {"source": "spec", "name": "adam", "class": "torch.optim.Adam", "args": {"lr": 0.01}}}

    from trainopt import load_settings

    monkeypatch.setattr(sys, "path", list(sys.path))
    s = load_settings(out / "best.yaml", warn=False)
    kwargs = s.dataloader_kwargs()
    assert kwargs["collate_fn"].__name__ == "pad_collate" and kwargs["batch_size"] == doc["best"]["settings"]["batch_size"]
    batch = kwargs["collate_fn"]([{"input_ids": torch.tensor([3, 4, 5]), "labels": 1}, {"input_ids": torch.tensor([6]), "labels": 0}])
    moved = s.to_device(batch)
    assert moved["input_ids"].shape == (2, 3) and moved["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    export = subprocess.run([sys.executable, "-m", "trainopt", "export", str(out), "--format", "torch"],
                            capture_output=True, text=True, env=cli_env, timeout=120)
    assert export.returncode == 0, export.stderr
    assert "loss = model_loss(model, batch)" in export.stdout and "collate_fn=pad_collate" in export.stdout
    assert "optimizer = torch.optim.Adam(model.parameters(), lr=0.01)  # optimizer: adam, as measured" in export.stdout


def test_a_candidate_that_cannot_run_is_reported_and_the_search_goes_on(tmp_path, cli_env):
    spec = user_spec("locked_regressor", "locked", collate="keep_lock", loss="model", search={"num_workers": [0, 2]})
    proc, out = _search(tmp_path, cli_env, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and doc["best"]["settings"]["num_workers"] == 0
    failed = [t for t in doc["trials"] if t["settings"]["num_workers"] == 2]
    assert failed and all(t["status"] == "error" for t in failed)
    assert "a batch cannot be pickled" in failed[0]["error"]
