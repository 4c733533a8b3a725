"""A LightningModule as it is, in real trial processes and a real search through the CLI.

Its training_step (with ``self.log`` and a dict return), AdamW and a per-step scheduler from
configure_optimizers, and its train_dataloader (or a LightningDataModule's) stand in for the
spec's step, optimizer and data; what trainopt cannot measure is one error line.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, tiny_spec_dict
from tests.integration.test_user_code import _search, measure

pytest.importorskip("lightning.pytorch")
pytestmark = pytest.mark.integration

CODE = f"{ROOT / 'examples' / 'your_code_lightning.py'}"


def lightning_spec(model: str = "classifier", args=None, **overrides) -> dict:
    spec = tiny_spec_dict(**overrides)
    spec["model"] = {"name": f"{CODE}:{model}", "args": args or {"size": 128}}
    for key in ("data", "optimizer", "loss"):
        spec.pop(key)  # the module supplies them
    spec["baseline"] = {"batch_size": 8, "threads": 1}
    return spec


@pytest.mark.parametrize(
    "spec, sets",
    [
        (lightning_spec(), ["num_workers=1", "grad_accum=2"]),
        (lightning_spec(data={"datamodule": f"{CODE}:token_data", "args": {"size": 64}}), []),
    ],
    ids=["train_dataloader, workers, accumulation", "datamodule"],
)
def test_a_lightning_module_measures_ok(write_spec, cli_env, spec, sets):
    r = measure(write_spec, cli_env, spec, *sets)
    assert r["status"] == "ok", r["error"]
    assert r["samples_per_s"] > 0 and r["last_loss"] is not None


def test_manual_optimization_is_an_error_trial_naming_the_alternative(write_spec, cli_env):
    r = measure(write_spec, cli_env, lightning_spec("manual"))
    assert r["status"] == "error" and "\n" not in r["error"]
    assert r["error"].startswith(f"WorkloadError: model.name '{CODE}:manual': automatic_optimization is False")
    assert "set step: 'module:callable'" in r["error"]


def test_a_search_over_batch_size_and_workers_finishes_and_probes_the_longest_item(tmp_path, cli_env):
    spec = lightning_spec(args={"size": 128, "long_item": 2000},
                          search={"batch_size": {"max": 32, "max_candidates": 1}, "num_workers": [0, 1]})
    proc, out = _search(tmp_path, cli_env, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and doc["baseline"]["status"] == "ok"
    assert {d["knob"] for d in doc["decisions"]} >= {"num_workers"}
    items = doc["batch_size"]["probe_items"]
    # 128 items, all sampled: the one of 2000 token ids (and its label) is the largest.
    assert items["sampled"] == 128 and items["largest"] == 2001 and items["median"] < 40
    assert "batch-size probes: each probe batch held the largest items in the whole data set: 2001 " in proc.stdout
