"""The second batch pass and the time budget, through the search with the fake runner's planted truth."""

from __future__ import annotations

import itertools

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore
from trainopt.contract.spec import spec_from_dict
from trainopt.outputs.report.html import render_html
from trainopt.outputs.report.rows import speedup_rows
from trainopt.outputs.summary import search_summary
from trainopt.search.search import Search

QUIET = dict(process_sd=0.02, arm_sd=0.02, session_sd=0.02)


def _spec(tmp_path, **overrides):
    base = dict(search={"batch_size": {"max": 1024}, "amp": ["off", "bf16"]}, measure={"pairs": 4, "max_pairs": 8})
    base.update(overrides)
    return spec_from_dict(tiny_spec_dict(**base), "t.yaml", tmp_path)


def test_a_kept_change_that_halves_memory_per_sample_earns_a_larger_batch_in_a_second_pass(tmp_path):
    # Memory fits batch x factor <= 300; bf16 halves the factor, so up to 600 fit after it.
    runner = FakeRunner({("batch_size", 264): 1.4, ("batch_size", 512): 1.82, ("amp", "bf16"): 1.3}, fits_up_to=300,
                        memory={("amp", "bf16"): 0.5}, **QUIET)
    doc = Search(_spec(tmp_path), tmp_path, runner, MemoryStore()).run()
    info = doc["batch_size"]
    assert doc["search_order"] == ["batch_size", "amp"]
    assert (info["max_fitting"], info["safe_max"]) == (296, 264)
    second = info["second_pass"]
    assert second["freed_by"]["knob"] == "amp" and second["freed_by"]["ratio"] == 0.5
    assert second["start"] == 264 and second["probed_from"] == 304 and second["max_fitting"] == 584 and second["safe_max"] == 520
    assert all(p["pass"] == 2 for p in second["probes"]) and all(p["pass"] == 1 for p in info["probes"])
    # Every second-pass probe holds the change that freed the memory.
    sizes = [r.settings["batch_size"] for r in runner.requests if r.mode == "probe" and r.settings["amp"] == "bf16"]
    # First one probe at the first pass's edge, which fits now; then the probes from there.
    edge = info["edge_probe"]
    assert edge["size"] == min(p["size"] for p in info["probes"] if not p["fits"]) and edge["fits"]
    assert sizes == [edge["size"]] + [p["size"] for p in second["probes"]]
    passes = [(d["to"], d["kept"], d["extra"].get("batch_pass")) for d in doc["decisions"] if d["knob"] == "batch_size"]
    assert (264, True, None) in passes and (512, True, 2) in passes
    assert doc["best"]["settings"]["batch_size"] == 512 and doc["best"]["settings"]["amp"] == "bf16"
    assert second["adopted"] == 512
    # The learning-rate hint speaks of the whole change from the spec's batch size.
    assert "16 -> 512" in info["lr_hint"]
    # One more family of confirmations in the error budget: two knobs and the second pass.
    assert doc["error_rates"]["knobs"] == 3
    stages = {r["stage"] for r in speedup_rows(doc) if r["knob"] == "batch_size"}
    assert stages == {"batch", "batch (second pass)"}
    html = render_html(doc, {}, tmp_path)
    assert 'id="batch-second-pass"' in html and f"batch size {edge['size']} ran out of memory in the first pass" in html


def test_no_second_pass_without_a_memory_edge_or_without_freed_memory(tmp_path):
    # Everything fits up to the maximum: the first pass never met a memory edge.
    runner = FakeRunner({("amp", "bf16"): 1.3}, memory={("amp", "bf16"): 0.5}, **QUIET)
    doc = Search(_spec(tmp_path / "a"), tmp_path / "a", runner, MemoryStore()).run()
    assert "second_pass" not in doc["batch_size"]
    # A memory edge, but the kept change takes as much memory as before.
    runner = FakeRunner({("amp", "bf16"): 1.3}, fits_up_to=300, **QUIET)
    doc = Search(_spec(tmp_path / "b"), tmp_path / "b", runner, MemoryStore()).run()
    assert [d["kept"] for d in doc["decisions"] if d["knob"] == "amp"] == [True]
    assert "second_pass" not in doc["batch_size"]
    # Measured, not assumed: one probe at the edge, which still runs out of memory.
    assert doc["batch_size"]["edge_probe"]["fits"] is False and doc["batch_size"]["edge_probe"]["status"] == "oom"
    assert all(d["extra"].get("batch_pass") is None for d in doc["decisions"])


def test_the_second_pass_keeps_the_effective_batch(tmp_path):
    spec = _spec(tmp_path, baseline={"batch_size": 16, "grad_accum": 64, "threads": 1}, limits={"effective_batch": 1024})
    runner = FakeRunner({("batch_size", 256): 1.4, ("batch_size", 512): 1.82, ("amp", "bf16"): 1.3}, fits_up_to=300,
                        memory={("amp", "bf16"): 0.5}, **QUIET)
    doc = Search(spec, tmp_path, runner, MemoryStore()).run()
    assert doc["batch_size"]["second_pass"]["adopted"] == 512
    best = doc["best"]["settings"]
    assert best["batch_size"] * best["grad_accum"] == 1024
    assert all(r.settings["batch_size"] * r.settings["grad_accum"] == 1024 for r in runner.requests if r.mode != "probe")


class Clock:
    """A clock that advances ``step`` seconds each time it is read."""

    def __init__(self, step: float):
        self.ticks = itertools.count()
        self.step = step

    def __call__(self) -> float:
        return next(self.ticks) * self.step


def _budgeted(tmp_path, budget_s, prices, reserve, knobs):
    spec = _spec(tmp_path, search=knobs, measure={"pairs": 4, "max_pairs": 8, "time_budget": budget_s})
    runner = FakeRunner({("amp", "bf16"): 1.3, ("sync_every", 0): 1.2}, **QUIET)
    search = Search(spec, tmp_path, runner, MemoryStore())
    # Priced as the search's ETA would; the logic under test is what the budget does with it.
    search.budget.price = prices.get
    search.budget.reserve = lambda: reserve
    search.budget.clock = Clock(1.0)
    search.budget.start = 0.0
    return search, runner


def test_a_stage_that_does_not_fit_the_budget_is_not_started_and_a_later_one_that_fits_still_runs(tmp_path):
    knobs = {"amp": ["off", "bf16"], "sync_every": [1, 0]}
    search, runner = _budgeted(tmp_path, 600, {"amp": 900.0, "sync_every": 100.0}, 50.0, knobs)
    doc = search.run()
    assert doc["complete"] and doc["missing"] == []
    not_tried = doc["time_budget"]["not_tried"]
    assert [n["knob"] for n in not_tried] == ["amp"] and not_tried[0]["reason"] == "not tried (time budget)"
    assert not_tried[0]["eta_s"] == 900.0 and 0 < not_tried[0]["left_s"] <= 600
    assert not any(r.settings["amp"] == "bf16" for r in runner.requests)
    assert [d["knob"] for d in doc["decisions"]] == ["sync_every"] and doc["decisions"][0]["kept"]
    # The final check still ran: the recommendation is checked.
    assert doc["final"]["n_pairs"] >= 4 and doc["best"]["source"] == "final-check"
    text = search_summary(doc)
    assert "budget: amp: not tried (time budget)" in text
    assert "Not tried (time budget)" in render_html(doc, {}, tmp_path)


def test_the_final_checks_reserve_counts_and_no_budget_starts_everything(tmp_path):
    knobs = {"amp": ["off", "bf16"]}
    # 500 s for the stage fits 600 s alone, but not with the final check's 200 s.
    search, runner = _budgeted(tmp_path / "a", 600, {"amp": 500.0}, 200.0, knobs)
    doc = search.run()
    assert [n["knob"] for n in doc["time_budget"]["not_tried"]] == ["amp"]
    spec = _spec(tmp_path / "b", search=knobs)
    doc = Search(spec, tmp_path / "b", FakeRunner({("amp", "bf16"): 1.3}, **QUIET), MemoryStore()).run()
    assert doc["time_budget"] is None and [d["kept"] for d in doc["decisions"]] == [True]


def test_a_stage_that_runs_nothing_here_is_recorded_whatever_the_budget(tmp_path):
    # pin_memory does not apply on a CPU: its stage costs nothing and only records that.
    search, runner = _budgeted(tmp_path, 1, {"pin_memory": 0.0, "amp": 900.0}, 50.0,
                               {"pin_memory": [False, True], "amp": ["off", "bf16"]})
    doc = search.run()
    assert [n["knob"] for n in doc["time_budget"]["not_tried"]] == ["amp"]
    assert [d["verdict"] for d in doc["decisions"]] == ["not_applicable"]
