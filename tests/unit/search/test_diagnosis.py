"""Measure first: the baseline's bottleneck sets the knob order, the recommended settings get a
diagnosed trial of their own, and the run costs are priced at the baseline's step time.

Driven through ``Search`` itself with the fake runner, whose diagnosed trials report the
breakdown chosen here (as the trial's profiled window would); without one they report none,
as results written before the profiled window do.
"""

from __future__ import annotations

import pytest

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore, breakdown_of
from trainopt.contract.protocol import TrialResult
from trainopt.contract.spec import spec_from_dict
from trainopt.decide import bottleneck, plan
from trainopt.decide.run_costs import advise
from trainopt.search.progress import NullProgress
from trainopt.search.search import Search
from trainopt.search.store import TrialStore

INPUT_BOUND = breakdown_of({"data_wait": 0.45, "forward": 0.2, "backward": 0.25, "optimizer": 0.05})
COMPUTE_BOUND = breakdown_of({"data_wait": 0.02, "forward": 0.4, "backward": 0.45, "optimizer": 0.08})
HOST_BOUND = breakdown_of({"data_wait": 0.02, "forward": 0.3, "backward": 0.3, "optimizer": 0.1},
                          device_type="cuda", device_busy=0.3)


def by_amp(settings):
    """Input-bound with the baseline's precision, compute-bound with bf16."""
    return COMPUTE_BOUND if settings.get("amp") == "bf16" else INPUT_BOUND


def make(tmp_path, runner, search, store=None, **spec):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tiny_spec_dict(search=search, measure={"pairs": 4, "max_pairs": 8}, **spec)
    s = spec_from_dict(data, "t.yaml", tmp_path)
    store = store or TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", s.name, s.fingerprint())
    return Search(s, tmp_path, runner, store), s


def diagnosed(runner):
    return [r for r in runner.requests if r.diagnose]


def test_only_the_baseline_and_the_recommended_settings_are_diagnosed(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5}, process_sd=0.01, arm_sd=0.01, session_sd=0.01, breakdown=by_amp)
    search, spec = make(tmp_path, runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    assert doc["best"]["settings"]["amp"] == "bf16"
    first, final = diagnosed(runner)
    assert first.trial_id.startswith("baseline/") and first.settings == dict(spec.baseline)
    assert final.trial_id.startswith("diagnosis/final/") and final.settings == doc["best"]["settings"]
    # Sessions, screens and confirmations are never diagnosed: the profiled window costs time.
    assert len(diagnosed(runner)) == 2
    # The verdicts are bottleneck.diagnose of what each diagnosed trial reported.
    assert doc["diagnosis"] == bottleneck.diagnose(INPUT_BOUND, runner.wait)
    assert doc["final_diagnosis"] == bottleneck.diagnose(COMPUTE_BOUND, runner.wait)
    assert (doc["diagnosis"]["bottleneck"], doc["final_diagnosis"]["bottleneck"]) == ("input", "compute")
    assert set(doc["diagnosis"]) == {"bottleneck", "reason", "text", "data_wait_fraction", "breakdown"}
    assert doc["final_diagnosis_error"] is None
    # It decides nothing: one trial, after the final check, recorded with its role.
    ids = [r.trial_id for r in runner.requests]
    assert ids[-1] == final.trial_id and sum(i.startswith("diagnosis/") for i in ids) == 1
    assert [t["role"] for t in doc["trials"]].count("diagnosis") == 1


def test_the_baseline_s_bottleneck_orders_the_knobs(tmp_path):
    search = {"amp": ["off", "bf16"], "num_workers": [0, 1], "sync_every": [1, 0]}
    orders = {}
    for name, breakdown in (("input", INPUT_BOUND), ("host", HOST_BOUND), ("compute", COMPUTE_BOUND)):
        runner = FakeRunner(breakdown=breakdown, process_sd=0.01, arm_sd=0.01, session_sd=0.01)
        s, spec = make(tmp_path / name, runner, search)
        doc = s.run()
        assert doc["diagnosis"]["bottleneck"] == name
        assert doc["search_order"] == plan.knob_order(spec.search, "guide", name)
        orders[name] = doc["search_order"]
    assert orders["input"][0] == "num_workers"
    assert orders["host"][0] == "sync_every"
    assert orders["compute"] == ["amp", "num_workers", "sync_every"]


def test_without_a_breakdown_the_loader_wait_decides_and_nothing_breaks(tmp_path):
    # A runner whose trials report no breakdown: results of a trial without the profiled window.
    runner = FakeRunner({("amp", "bf16"): 1.5}, process_sd=0.01, arm_sd=0.01, session_sd=0.01, wait=0.4)
    search, _ = make(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    doc = search.run()
    assert doc["diagnosis"]["breakdown"] is None and doc["diagnosis"]["bottleneck"] == "input"
    assert doc["diagnosis"] == bottleneck.diagnose(None, 0.4)
    assert doc["search_order"][0] == "num_workers"
    assert doc["final_diagnosis"] == bottleneck.diagnose(None, 0.4)
    assert doc["run_costs"] is None


def test_no_diagnosis_trial_when_the_baseline_stays(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 0.5}, breakdown=by_amp)
    search, _ = make(tmp_path, runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    assert doc["best"]["source"] == "baseline"
    assert [r.trial_id for r in diagnosed(runner)] == [runner.requests[0].trial_id]
    assert doc["final_diagnosis"] is None and doc["final_diagnosis_error"] is None
    assert doc["complete"] and doc["missing"] == []


class FailingDiagnosis(FakeRunner):
    """The recommended settings' diagnosis trial fails; every other trial runs as usual."""

    def run(self, request, log_path, timeout_s):
        if request.trial_id.startswith("diagnosis/"):
            self.requests.append(request)
            return TrialResult(status="crashed", settings=request.settings, error="killed by signal 9")
        return super().run(request, log_path, timeout_s)


def test_a_failed_diagnosis_trial_changes_nothing_but_the_final_diagnosis(tmp_path):
    effects = {("amp", "bf16"): 1.5}
    ok = make(tmp_path / "ok", FakeRunner(effects, seed=4, breakdown=by_amp), {"amp": ["off", "bf16"]})[0].run()
    failing = FailingDiagnosis(effects, seed=4, breakdown=by_amp)
    doc = make(tmp_path / "failing", failing, {"amp": ["off", "bf16"]})[0].run()
    assert ok["final_diagnosis"] is not None
    assert doc["final_diagnosis"] is None
    assert doc["final_diagnosis_error"] == "the diagnosis trial of the recommended settings failed (crashed: killed by signal 9)"
    assert doc["complete"] and doc["missing"] == []
    for key in ("best", "speedup", "speedup_ci", "final", "decisions", "diagnosis"):
        assert doc[key] == ok[key], key


def test_a_resumed_search_reuses_the_diagnosis_trial(tmp_path):
    effects = {("amp", "bf16"): 1.5}
    first = FakeRunner(effects, breakdown=by_amp)
    search, spec = make(tmp_path, first, {"amp": ["off", "bf16"]})
    doc1 = search.run()
    again = FakeRunner(effects, breakdown=by_amp)
    doc2 = Search(spec, tmp_path, again, TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())).run()
    assert again.requests == []
    assert doc2["final_diagnosis"] == doc1["final_diagnosis"] and doc2["diagnosis"] == doc1["diagnosis"]
    assert doc2["counts"]["trials_reused"] == len(doc1["trials"])


def test_the_results_say_the_diagnosis_is_owed_until_it_ran(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5}, breakdown=by_amp)
    search, _ = make(tmp_path, runner, {"amp": ["off", "bf16"]})
    checkpoints = []
    search.on_checkpoint = checkpoints.append
    doc = search.run()
    # Saved after the final check, before the trial that decides nothing.
    before = checkpoints[-2]
    assert before["complete"] is False and before["final"] and before["missing"] == ["final diagnosis"]
    assert before["final_diagnosis"] is None
    assert doc["missing"] == [] and doc["final_diagnosis"] is not None


class Recorder(NullProgress):
    def __init__(self):
        self.events = []

    def set_remaining(self, trials):
        self.events.append(("remaining", trials))

    def trial_started(self, **info):
        self.events.append(("started", info.get("role")))

    def trial_finished(self, result, wall_s=None, cost=1.0):
        self.events.append(("finished", cost))


def test_the_eta_counts_the_diagnosis_trial(tmp_path, monkeypatch):
    data = tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={"pairs": 4, "max_pairs": 8})
    spec = spec_from_dict(data, "t.yaml", tmp_path)

    def run():
        progress = Recorder()
        doc = Search(spec, tmp_path, FakeRunner({("amp", "bf16"): 1.5}, breakdown=by_amp), MemoryStore(), progress=progress).run()
        return doc, progress.events

    doc, events = run()
    cost = plan.arm_cost(doc["best"]["settings"], "diagnosis")
    started = events.index(("started", "diagnosis"))
    # Once the final check is done, the diagnosis trial is all that is left, and it counts that down.
    assert events[started - 1] == ("remaining", cost)
    assert events[started + 1] == ("finished", cost)
    assert events[-1] == ("finished", cost)
    # Before the only knob is screened, it is counted at the chance that a change is kept:
    # pricing it higher raises the first count by that share of the difference.
    first = next(v for e, v in events if e == "remaining")
    monkeypatch.setitem(plan.ROLE_COST, "diagnosis", 100.0)
    _, dearer = run()
    assert next(v for e, v in dearer if e == "remaining") - first == pytest.approx(plan.TYPICAL_KEPT_SHARE * (100.0 - cost))


def test_the_run_costs_are_priced_at_the_baseline_s_step_time(tmp_path):
    measured = {"checkpoint_s": 0.5, "eval_s": 3.0, "eval_batches": 10}
    runner = FakeRunner(breakdown=COMPUTE_BOUND, run_costs=measured)
    search, spec = make(tmp_path, runner, {"amp": ["off"]},
                        run_costs={"checkpoint_every_steps": 1000, "eval_every_steps": 100, "eval_batches": 10})
    doc = search.run()
    assert doc["run_costs"] == advise(measured, spec.run_costs.model_dump(), doc["baseline"]["step_time_s"])
    assert set(doc["run_costs"]) >= {"checkpoint", "evaluation", "budget"}
    # Without the spec's run_costs section there is nothing to price.
    runner = FakeRunner(breakdown=COMPUTE_BOUND, run_costs=measured)
    assert make(tmp_path / "plain", runner, {"amp": ["off"]})[0].run()["run_costs"] is None


def test_a_document_from_a_state_without_a_baseline_has_the_keys_and_no_figures(tmp_path):
    from trainopt.search.document import build_results
    from trainopt.search.state import SearchState

    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}), "t.yaml", tmp_path)
    doc = build_results(SearchState.for_spec(spec, tmp_path), complete=False)
    assert (doc["diagnosis"], doc["final_diagnosis"], doc["final_diagnosis_error"], doc["run_costs"]) == ({}, None, None, None)
    assert doc["missing"] == ["amp", "final check"]


# ---- what the command line says -------------------------------------------------------------


def _measured(breakdown, run_costs=None, wait=0.12):
    return TrialResult(status="ok", settings={"batch_size": 32, "amp": "off", "num_workers": 0, "compile": "off"},
                       samples_per_s=1000.0, windows=[1000.0] * 4, median=1000.0, iqr=1.0, step_time_s=0.032,
                       data_wait_fraction=wait, peak_memory_bytes=2**28, warmup_s=1.0, first_loss=2.0, last_loss=1.0,
                       breakdown=breakdown, run_costs=run_costs)


SPEC_COSTS = {"checkpoint_every_steps": 1000, "eval_every_steps": 50, "eval_batches": 20}
MEASURED_COSTS = {"checkpoint_s": 1.5, "eval_s": 12.0, "eval_batches": 20}


def test_the_measure_summary_says_where_a_step_s_time_goes_and_what_the_run_costs():
    from trainopt.outputs.summary import measure_summary as _measure_summary

    result = _measured(breakdown_of({"data_wait": 0.12, "forward": 0.4, "backward": 0.35, "optimizer": 0.05}), MEASURED_COSTS)
    lines = _measure_summary(result, "tiny", SPEC_COSTS).splitlines()
    (line,) = [x for x in lines if x.startswith("where a step's time goes: ")]
    d = bottleneck.diagnose(result.breakdown, result.data_wait_fraction)
    assert d["bottleneck"] == "compute"
    for part in ("data_wait 12 %", "forward 40 %", "backward 35 %", "optimizer 5 %"):
        assert part in line
    assert line.endswith(f" → compute-bound ({d['reason']})")
    advice = advise(MEASURED_COSTS, SPEC_COSTS, result.step_time_s)
    (ckpt,) = [x for x in lines if x.startswith("checkpoint: ")]
    (evaluation,) = [x for x in lines if x.startswith("evaluation (20 batches): ")]
    for text, c in ((ckpt, advice["checkpoint"]), (evaluation, advice["evaluation"])):
        assert f"every {c['every_steps']:,} steps takes {100 * c['share']:.1f} % of the run" in text
        assert f"every {c['every_steps_for_budget']:,} steps or more keeps it within 5 %" in text
    # On a GPU the device's busy share is there too; without a breakdown the loader wait decides.
    gpu = _measured(breakdown_of({"forward": 0.5}, device_type="cuda", device_busy=0.3), wait=0.0)
    assert "; device busy 30 % → host-bound (" in _measure_summary(gpu, "tiny")
    plain = _measure_summary(_measured(None, wait=0.4), "tiny")
    assert "where a step's time goes: not profiled (no breakdown in the result) → input-bound (data_wait 40 %" in plain
    assert "checkpoint:" not in plain


def test_measure_json_adds_the_bottleneck_and_the_run_costs_advice_to_the_result():
    import json

    from trainopt.outputs.summary import measure_json as _measure_json

    result = _measured(breakdown_of({"data_wait": 0.5, "forward": 0.3}), MEASURED_COSTS)
    data = json.loads(json.dumps(_measure_json(result, SPEC_COSTS)))
    d = bottleneck.diagnose(result.breakdown, result.data_wait_fraction)
    assert data["breakdown"] == json.loads(json.dumps(result.breakdown))
    assert (data["bottleneck"], data["bottleneck_reason"]) == ("input", d["reason"])
    assert data["run_costs_advice"] == json.loads(json.dumps(advise(MEASURED_COSTS, SPEC_COSTS, result.step_time_s)))
    assert {k: v for k, v in data.items() if k not in ("bottleneck", "bottleneck_reason", "run_costs_advice")} == \
        json.loads(json.dumps(result.to_dict()))
    failed = _measure_json(TrialResult(status="oom", error="out of memory"), None)
    assert (failed["bottleneck"], failed["breakdown"], failed["run_costs_advice"]) == ("unknown", None, None)


def test_the_measure_command_asks_for_the_breakdown(tmp_path, monkeypatch, capsys):
    import json

    import yaml

    from trainopt.cli import main
    from trainopt.execute import runner as runner_module

    asked = []

    class Runner:
        def run(self, request, log_path, timeout_s):
            asked.append(request)
            return _measured(breakdown_of({"data_wait": 0.1, "forward": 0.6}), wait=0.1)

    monkeypatch.setattr(runner_module, "SubprocessRunner", Runner)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict()))
    assert main(["measure", str(spec), "--json", "--out", str(tmp_path / "out")]) == 0
    (request,) = asked
    assert request.diagnose is True
    printed = json.loads(capsys.readouterr().out)
    assert printed["bottleneck"] == "compute" and printed["breakdown"]["shares"]["forward"] == pytest.approx(0.6)
    # result.json stays the trial's result as it came back.
    saved = json.loads((tmp_path / "out" / "result.json").read_text())
    assert "bottleneck" not in saved and saved["breakdown"] == printed["breakdown"]


def test_the_search_summary_names_the_baseline_s_and_the_recommended_settings_bottleneck(tmp_path):
    import json

    from tests.conftest import FIXTURES
    from trainopt.outputs.summary import search_summary as _summary

    doc = make(tmp_path / "ok", FakeRunner({("amp", "bf16"): 1.5}, breakdown=by_amp), {"amp": ["off", "bf16"]})[0].run()
    lines = _summary(doc).splitlines()
    assert f"bottleneck of the baseline: input-bound ({doc['diagnosis']['reason']})" in lines
    assert f"bottleneck of the recommended settings: compute-bound ({doc['final_diagnosis']['reason']})" in lines
    failed = make(tmp_path / "failed", FailingDiagnosis({("amp", "bf16"): 1.5}, breakdown=by_amp), {"amp": ["off", "bf16"]})[0].run()
    assert f"bottleneck of the recommended settings: unknown: {failed['final_diagnosis_error']}" in _summary(failed).splitlines()
    # Results written before the reason existed give their text; none for the recommended settings.
    old = json.loads((FIXTURES / "results-tiny" / "results.json").read_text())
    text = _summary(old)
    assert f"bottleneck of the baseline: {old['diagnosis']['text']}" in text.splitlines()
    assert "recommended settings:" not in text
