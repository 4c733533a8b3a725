"""docs/your-code.md's specs are valid, their references resolve, and each trains.

Every ``yaml`` block of the page is a complete spec: it must pass ``spec_from_dict``, name
code that exists in ``examples/`` (the page's specs are the files there), and train for a few real
steps, so the page cannot drift from what trainopt accepts.
"""

from __future__ import annotations

import re
import sys

import pytest
import torch
import yaml

from tests.conftest import ROOT
from trainopt.contract.reference import resolve_reference
from trainopt.contract.spec import load_spec, spec_from_dict
from trainopt.execute.refcheck import spec_references

PAGE = ROOT / "docs" / "your-code.md"
EXAMPLES = ROOT / "examples"
BLOCK = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)


def yaml_blocks() -> list[str]:
    return BLOCK.findall(PAGE.read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


FILES = ("your_code_pairs.yaml", "your_code_text.yaml", "your_code_hf.yaml", "your_code_gpt.yaml",
         "your_code_scenes.yaml", "your_code_lightning.yaml")


def test_the_page_shows_each_form_as_the_example_files_hold_it():
    specs = [yaml.safe_load(block) for block in yaml_blocks()]
    assert len(specs) == len(FILES)
    for spec, name in zip(specs, FILES):
        assert spec == yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8")), name
        load_spec(EXAMPLES / name)
    assert [s.get("loss", "cross_entropy") for s in specs] == ["cross_entropy", "model", "model", "model",
                                                               "cross_entropy", "cross_entropy"]
    assert specs[1]["data"]["collate"] and specs[2]["data"]["collate"] and specs[4]["step"]
    # The config-object model is built by a factory from flat arguments.
    assert specs[3]["model"]["name"] == "your_code_gpt.py:gpt"
    # The LightningModule's spec leaves the optimizer and the data to the module.
    assert "optimizer" not in specs[5] and "data" not in specs[5]


@pytest.mark.parametrize("index", range(len(FILES)))
def test_every_spec_on_the_page_is_valid_resolves_and_trains(index):
    from trainopt.knobs.catalog import default_settings
    from trainopt.trial.measure import Trainer
    from trainopt.trial.workloads import build_workload

    block = yaml_blocks()[index]
    spec = spec_from_dict(yaml.safe_load(block), "your-code.md", EXAMPLES)
    refs = spec_references(spec)
    assert refs
    for field, ref in refs:
        resolve_reference(ref, EXAMPLES, field=field)
    workload = build_workload(spec.resolved(), EXAMPLES)
    # The spec's baseline holds every knob; one thread keeps the test light.
    settings = {**spec.baseline, "threads": 1}
    assert settings.keys() == default_settings().keys()
    trainer = Trainer(workload, settings, torch.device("cpu"))
    losses = [float(trainer.step()) for _ in range(3)]
    assert all(torch.isfinite(torch.tensor(losses)))
