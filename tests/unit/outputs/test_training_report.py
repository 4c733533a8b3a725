"""The training check where users read it: the CLI summary, the report's panel and curves, best.yaml."""

from __future__ import annotations

import yaml

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore
from trainopt.contract.spec import spec_from_dict
from trainopt.outputs import summary
from trainopt.outputs.report import write_report
from trainopt.outputs.results import write_outputs
from trainopt.search.search import Search


def planted_doc(tmp_path, trains, name="tiny"):
    spec = spec_from_dict(tiny_spec_dict(name=name, search={"amp": ["off", "bf16"], "num_workers": [0, 2]},
                                         measure={"pairs": 6, "max_pairs": 8, "confidence": 0.75}), "t.yaml", tmp_path)
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 2): 1.3}, arm_sd=0.01, session_sd=0.01, trains=trains)
    return Search(spec, tmp_path, runner, MemoryStore()).run(), spec


def test_the_summary_names_what_was_left_out_and_why(tmp_path):
    doc, _ = planted_doc(tmp_path, {("amp", "bf16"): "worse"})
    text = summary.search_summary(doc)
    assert "training check: same:" in text
    assert "left out of best.yaml (faster, but trains differently): amp=bf16 is left out" in text
    assert "amp off -> bf16 (" in text and "left out: trains differently" in text


def test_the_report_draws_the_curves_and_escapes_the_users_name(tmp_path):
    doc, spec = planted_doc(tmp_path, {("amp", "bf16"): "worse"}, name="<b>mine</b>")
    write_outputs(tmp_path, doc, spec.resolved())
    page = write_report(tmp_path, doc).read_text()
    assert 'id="training"' in page and 'id="training-dropped"' in page and "amp=bf16 is left out" in page
    assert (tmp_path / "plots" / "training.png").stat().st_size > 1000
    assert "data:image/png;base64," in page[page.index('id="training"'):]
    assert "<b>mine</b>" not in page and "&lt;b&gt;mine&lt;/b&gt;" in page
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["settings"]["amp"] == "off" and best["provenance"]["training_check"]["left_out"][0]["knob"] == "amp"


def test_a_report_without_a_training_check_has_no_panel(tmp_path):
    doc, spec = planted_doc(tmp_path, None)
    doc = {**doc, "training_check": None}
    page = write_report(tmp_path, doc).read_text()
    assert 'id="training"' not in page and not (tmp_path / "plots" / "training.png").exists()
