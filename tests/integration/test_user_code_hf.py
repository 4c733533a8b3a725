"""A Hugging Face model as it is, in real trial processes and a real search through the CLI.

A tiny BERT built from a config (nothing downloaded), a ``datasets.Dataset`` in torch
format or a plain torch data set of unpadded sentences, ``DataCollatorWithPadding`` as
``data.collate`` and ``loss: model``: no wrapper.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, tiny_spec_dict
from tests.integration.test_user_code import _search, measure

pytest.importorskip("transformers")
pytest.importorskip("datasets")
pytestmark = pytest.mark.integration

CODE = f"{ROOT / 'examples' / 'your_code_hf.py'}"


def hf_spec(data: str = "reviews", **overrides) -> dict:
    spec = tiny_spec_dict(**overrides)
    spec["model"] = {"name": f"{CODE}:tiny_bert", "args": {"hidden": 16, "layers": 1, "heads": 2}}
    spec["data"] = {"name": f"{CODE}:{data}", "args": {"size": 128}, "collate": f"{CODE}:collate"}
    spec["loss"] = "model"
    spec["optimizer"] = {"name": "adamw", "args": {"lr": 0.001}}
    spec["baseline"] = {"batch_size": 8, "threads": 1}
    return spec


@pytest.mark.parametrize("data, sets", [("reviews", ["num_workers=1"]), ("torch_reviews", [])],
                         ids=["datasets.Dataset, workers", "torch data set"])
def test_a_hugging_face_model_measures_ok(write_spec, cli_env, data, sets):
    r = measure(write_spec, cli_env, hf_spec(data), *sets)
    assert r["status"] == "ok", r["error"]
    assert r["samples_per_s"] > 0 and r["last_loss"] is not None


def test_a_search_over_batch_size_and_workers_finishes(tmp_path, cli_env):
    spec = hf_spec(search={"batch_size": {"max": 16, "max_candidates": 1}, "num_workers": [0, 1]})
    proc, out = _search(tmp_path, cli_env, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and doc["baseline"]["status"] == "ok"
    assert {d["knob"] for d in doc["decisions"]} >= {"num_workers"}
    assert doc["batch_size"]["probe_items"]["sampled"] == 128
