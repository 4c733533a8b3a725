"""The training check inside a search: runs keyed and reused, a kept change that trains differently left out of the
recommendation (its speed verdict standing), the remaining settings checked again, never a failed check recommended."""

from __future__ import annotations

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore
from trainopt.contract.spec import spec_from_dict
from trainopt.outputs.results import best_document
from trainopt.search.search import Search

FAST = {"pairs": 6, "max_pairs": 8, "confidence": 0.75}


def run_search(tmp_path, search, effects, trains=None, store=None, check=None, seed=0):
    spec = spec_from_dict(tiny_spec_dict(search=search, measure=FAST, **({"check": check} if check else {})), "t.yaml", tmp_path)
    runner = FakeRunner(effects, arm_sd=0.01, session_sd=0.01, process_sd=0.01, trains=trains, seed=seed)
    doc = Search(spec, tmp_path, runner, store or MemoryStore()).run()
    return doc, runner, spec


def training_requests(runner):
    return [r for r in runner.requests if r.mode == "train"]


def test_harmless_kept_changes_train_the_same_and_stay_recommended(tmp_path):
    doc, runner, spec = run_search(tmp_path, {"amp": ["off", "bf16"], "num_workers": [0, 2]},
                                   {("amp", "bf16"): 1.5, ("num_workers", 2): 1.3})
    check = doc["training_check"]
    assert check["verdict"] == "same" and check["dropped"] == [] and check["steps"] == 40
    assert doc["best"]["settings"]["amp"] == "bf16" and doc["best"]["settings"]["num_workers"] == 2
    reqs = training_requests(runner)
    assert [r.training["order_seed"] for r in reqs] == [0, 1, 0] and all(r.training["steps"] == 40 for r in reqs)
    ref, twin, rec = reqs
    assert ref.settings == twin.settings and ref.settings["amp"] == "off" and rec.settings == doc["best"]["settings"]
    first = check["rounds"][0]
    assert len(first["reference"]["losses"]) == 40 and first["verdict"] == "same"


def test_a_faster_change_that_trains_worse_keeps_its_verdict_but_is_left_out(tmp_path):
    doc, runner, spec = run_search(tmp_path, {"amp": ["off", "bf16"], "num_workers": [0, 2]},
                                   {("amp", "bf16"): 1.5, ("num_workers", 2): 1.3}, trains={("amp", "bf16"): "worse"})
    amp = next(d for d in doc["decisions"] if d["knob"] == "amp" and d["kept"])
    assert amp["verdict"] == "improved"
    check = doc["training_check"]
    assert [d["knob"] for d in check["dropped"]] == ["amp"]
    assert "amp=bf16 is left out" in check["dropped"][0]["reason"] and "higher" in check["dropped"][0]["reason"]
    best = doc["best"]["settings"]
    assert best["amp"] == "off" and best["num_workers"] == 2
    # The remaining settings were measured against the baseline on their own, and checked again.
    assert doc["final"]["verdict"] in ("improved", "inconclusive") and check["final_checks"][0]["speedup"] > 1.6
    assert [r["verdict"] for r in check["rounds"]] == ["worse", "same"] and check["verdict"] == "same"
    yaml_doc = best_document(doc, spec.resolved())
    assert yaml_doc["settings"]["amp"] == "off"
    assert [k["knob"] for k in yaml_doc["provenance"]["kept"]] == ["num_workers"]
    assert yaml_doc["provenance"]["training_check"]["left_out"][0]["knob"] == "amp"


def test_with_two_suspects_each_is_trained_alone_and_only_the_culprit_goes(tmp_path):
    doc, runner, _ = run_search(tmp_path, {"amp": ["off", "bf16"], "channels_last": [False, True]},
                                {("amp", "bf16"): 1.5, ("channels_last", True): 1.3}, trains={("channels_last", True): "nan"})
    check = doc["training_check"]
    first = check["rounds"][0]
    assert first["verdict"] == "diverged"
    assert {a["knob"]: a["verdict"] for a in first["alone"]} == {"amp": "same", "channels_last": "diverged"}
    assert [d["knob"] for d in check["dropped"]] == ["channels_last"]
    assert doc["best"]["settings"]["amp"] == "bf16" and doc["best"]["settings"]["channels_last"] is False
    assert check["verdict"] == "same"


def test_when_every_kept_change_goes_the_baseline_stays_and_says_why(tmp_path):
    doc, _, _ = run_search(tmp_path, {"amp": ["off", "bf16"]}, {("amp", "bf16"): 1.5}, trains={("amp", "bf16"): "worse"})
    assert doc["best"]["source"] == "baseline" and doc["best"]["settings"]["amp"] == "off"
    assert doc["training_check"]["verdict"] == "not_needed"
    assert "amp=bf16 left out" in doc["training_check"]["reason"]
    assert "training check left out every kept change" in doc["final"]["reason"]


def test_a_batch_change_alone_is_reported_not_judged(tmp_path):
    doc, runner, _ = run_search(tmp_path, {"batch_size": {"max": 64, "max_candidates": 1}},
                                {("batch_size", 64): 2.0})
    check = doc["training_check"]
    assert doc["best"]["settings"]["batch_size"] == 64
    assert check["verdict"] == "not_needed" and not training_requests(runner)
    assert check["batch_change"]["changed"] == {"batch_size": [16, 64]} and check["batch_change"]["lr_hint"]


def test_the_check_can_be_turned_off_and_says_so(tmp_path):
    doc, runner, _ = run_search(tmp_path, {"amp": ["off", "bf16"]}, {("amp", "bf16"): 1.5}, check={"training": False})
    assert doc["training_check"]["verdict"] == "not_checked" and not training_requests(runner)
    assert doc["best"]["settings"]["amp"] == "bf16"


def test_a_resumed_search_reuses_the_training_runs(tmp_path):
    store = MemoryStore()
    run_search(tmp_path, {"amp": ["off", "bf16"]}, {("amp", "bf16"): 1.5}, trains={("amp", "bf16"): "worse"}, store=store)
    doc, runner, _ = run_search(tmp_path, {"amp": ["off", "bf16"]}, {("amp", "bf16"): 1.5},
                                trains={("amp", "bf16"): "worse"}, store=store)
    assert not training_requests(runner) and not runner.requests
    assert [d["knob"] for d in doc["training_check"]["dropped"]] == ["amp"]


def test_the_step_count_is_part_of_a_runs_key(tmp_path):
    store = MemoryStore()
    run_search(tmp_path, {"amp": ["off", "bf16"]}, {("amp", "bf16"): 1.5}, store=store)
    doc, runner, _ = run_search(tmp_path, {"amp": ["off", "bf16"]}, {("amp", "bf16"): 1.5}, store=store,
                                check={"training_steps": 16})
    assert [r.training["steps"] for r in training_requests(runner)] == [16, 16, 16]
    assert doc["training_check"]["steps"] == 16 and doc["training_check"]["tail_steps"] == 5
