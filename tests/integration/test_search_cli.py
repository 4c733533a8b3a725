"""A real search end to end through the CLI: files, resume after kill -9 and Ctrl-C, the lock."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_spec_dict

pytestmark = pytest.mark.integration

SEARCH = {"batch_size": {"max": 32}, "amp": ["off", "bf16"], "pin_memory": [False, True]}
FAST = {"pairs": 3, "max_pairs": 4, "confidence": 0.75}
# Slow storage (real sleeps per sample) that two loader workers hide: an unambiguous win,
# so an interrupted and resumed search must reach the same verdicts as an uninterrupted one.
INPUT_BOUND = {
    "data": {"name": "synthetic-tabular", "args": {"size": 512, "features": 16, "latency_ms": 1.0}},
    "search": {"num_workers": [0, 2]},
}


def spec_file(tmp_path: Path, **overrides) -> Path:
    data = tiny_spec_dict(**{"search": SEARCH, **overrides})
    data["measure"].update(FAST)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def search_cmd(spec: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainopt", "search", str(spec), "--out", str(out), *extra]


def finished_trials(out: Path) -> int:
    db = out / "trials.db"
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as con:
            # Trials a killed search left running are failed as stale on resume; they finished nothing.
            return con.execute(
                "select count(*) from trials t where state in ('COMPLETE', 'FAIL') and not exists "
                "(select 1 from trial_user_attributes a where a.trial_id = t.trial_id and a.key = 'stale')"
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


def wait_for_trials(out: Path, n: int, proc: subprocess.Popen, limit: float = 240) -> None:
    end = time.monotonic() + limit
    while finished_trials(out) < n:
        assert proc.poll() is None, "the search ended before it could be interrupted"
        assert time.monotonic() < end, "no progress"
        time.sleep(0.2)


def test_search_writes_every_output_and_a_loadable_best_yaml(tmp_path, cli_env):
    spec = spec_file(tmp_path)
    out = tmp_path / "out"
    proc = subprocess.run(search_cmd(spec, out), capture_output=True, text=True, env=cli_env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "speedup" in proc.stdout and "results:" in proc.stdout
    for name in ("results.json", "trials.csv", "best.yaml", "spec.resolved.yaml", "trials.db"):
        assert (out / name).exists(), name
    doc = json.loads((out / "results.json").read_text())
    assert doc["schema_version"] == 1 and doc["complete"]
    resolved = yaml.safe_load((out / "spec.resolved.yaml").read_text())
    assert doc["baseline"]["status"] == "ok" and doc["baseline"]["settings"] == resolved["baseline"]
    assert doc["baseline"]["samples_per_s"] > 0
    assert doc["env"]["device_type"] == "cpu"
    # A knob that cannot apply is recorded as a trial without running one.
    ran = [t for t in doc["trials"] if t["status"] != "not_applicable"]
    assert doc["counts"] == {"trials_run": len(ran), "trials_reused": 0}
    from trainopt.decide.plan import knob_order

    assert doc["search_order"] == knob_order(SEARCH, "guide", doc["diagnosis"]["bottleneck"])
    # Every kept change is recommended unless the final check contradicts them; otherwise an
    # earlier confirmed one or the baseline.
    source = doc["best"]["source"]
    if doc["final"].get("contradicted") is False:
        assert source == "final-check" and doc["speedup"] == doc["final"]["speedup"]
        assert doc["speedup_ci"] == doc["final"]["ci"]
    else:
        assert source in ("first-kept-change", "baseline")
    if source == "baseline":
        assert doc["best"]["settings"] == resolved["baseline"] and doc["speedup"] == 1.0
    assert f"recommended (best.yaml): {source}:" in proc.stdout
    assert doc["batch_size"]["probes"] and doc["batch_size"]["max_fitting"] == 32
    pin = [d for d in doc["decisions"] if d["knob"] == "pin_memory"]
    assert pin and pin[0]["verdict"] == "not_applicable"
    for t in doc["trials"]:
        assert t["status"] in ("ok", "not_applicable")
        if t["log"]:
            assert (out / t["log"]).exists()
    import trainopt

    s = trainopt.load_settings(out / "best.yaml", warn=False)
    assert s.settings == doc["best"]["settings"]
    # The study that CLI search leaves is one Optuna reads: the varied knobs as params, the recommendation marked.
    import optuna

    study = optuna.load_study(study_name=doc["name"], storage=f"sqlite:///{out / 'trials.db'}")
    assert {"params_batch_size", "params_amp", "params_pin_memory"} <= set(study.trials_dataframe().columns)
    measured = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE]
    assert measured and all(set(t.params) == {"batch_size", "amp", "pin_memory"} for t in measured)
    assert study.user_attrs["recommended_settings"] == doc["best"]["settings"]
    assert study.user_attrs["recommended_trials"]
    assert all(json.loads(study.trials[n].user_attrs["result"])["settings"] == doc["best"]["settings"]
               for n in study.user_attrs["recommended_trials"])


def test_kill_9_mid_search_then_resume_loses_and_duplicates_nothing(tmp_path, cli_env):
    spec = spec_file(tmp_path, **INPUT_BOUND)
    out = tmp_path / "out"
    # Random moments: after a random number of finished trials plus a random delay, so a
    # kill lands mid-trial, between trials or while results are being written.
    rng = random.Random(int(os.environ.get("TRAINOPT_KILL_SEED", "20261202")))
    done = 0
    for _ in range(3):
        proc = subprocess.Popen(search_cmd(spec, out, "--quiet"), env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        done += rng.randint(1, 3)
        wait_for_trials(out, done, proc)
        time.sleep(rng.uniform(0.0, 3.0))
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        done = finished_trials(out)
    before = finished_trials(out)
    proc = subprocess.run(search_cmd(spec, out), capture_output=True, text=True, env=cli_env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    # At most a session whose arms were being stored at the kill is measured again (its
    # arms ran side by side, so a half-stored session is not reused).
    assert doc["counts"]["trials_reused"] >= before - 2
    keys = [t["key"] for t in doc["trials"]]
    assert len(keys) == len(set(keys)), "a trial was duplicated"
    assert doc["complete"]
    (workers,) = [d for d in doc["decisions"] if d["knob"] == "num_workers"]
    assert workers["verdict"] == "improved" and doc["best"]["settings"]["num_workers"] == 2
    with sqlite3.connect(out / "trials.db") as con:
        stale = con.execute("select count(*) from trial_user_attributes where key = 'stale'").fetchone()[0]
    assert stale >= 1, "the trial in flight at kill -9 was not recognised as stale"


def test_kill_9_during_a_one_shot_trial_leaves_no_trial_process(tmp_path, cli_env):
    import psutil

    def trial_processes(out: Path) -> list[int]:
        found = []
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if "trainopt.trial.worker" in cmd and str(out) in cmd:
                found.append(p.info["pid"])
        return found

    # The baseline trial is a one-shot process of its own (not a forked session arm); a
    # long warm-up keeps it running well past the kill.
    spec = spec_file(tmp_path)
    doc = yaml.safe_load(spec.read_text())
    doc["measure"].update(warmup_seconds=60, trial_timeout_s=300)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.Popen(search_cmd(spec, out, "--quiet"), env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.monotonic() + 120
        while not trial_processes(out):
            assert proc.poll() is None and time.monotonic() < end, "the baseline trial never started"
            time.sleep(0.2)
        time.sleep(1.0)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        end = time.monotonic() + 10
        while trial_processes(out) and time.monotonic() < end:
            time.sleep(0.2)
        assert trial_processes(out) == [], "a trial process outlived its killed orchestrator"
    finally:
        for pid in trial_processes(out):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_ctrl_c_stops_cleanly_with_130_and_resumes(tmp_path, cli_env):
    spec = spec_file(tmp_path, **INPUT_BOUND)
    out = tmp_path / "out"
    proc = subprocess.Popen(search_cmd(spec, out), env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_trials(out, 3, proc)
    time.sleep(1.0)  # let the next trial start
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert "resume" in err
    partial = json.loads((out / "results.json").read_text())
    assert partial["complete"] is False and partial["missing"]
    proc = subprocess.run(search_cmd(spec, out), capture_output=True, text=True, env=cli_env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["counts"]["trials_reused"] >= 3


def test_second_search_on_the_same_folder_is_refused(tmp_path, cli_env):
    spec = spec_file(tmp_path)
    out = tmp_path / "out"
    first = subprocess.Popen(search_cmd(spec, out, "--quiet"), env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_trials(out, 1, first)
        second = subprocess.run(search_cmd(spec, out), capture_output=True, text=True, env=cli_env, timeout=60)
        assert second.returncode == 2
        assert "another trainopt search" in second.stderr and "Traceback" not in second.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=60)
    assert first.returncode == 143


def test_changed_spec_needs_fresh(tmp_path, cli_env):
    spec = spec_file(tmp_path, search={"amp": ["off"]})
    out = tmp_path / "out"
    assert subprocess.run(search_cmd(spec, out), capture_output=True, env=cli_env, timeout=300).returncode == 0
    spec.write_text(yaml.safe_dump(tiny_spec_dict(search={"amp": ["off"]}, seed=5), sort_keys=False))
    proc = subprocess.run(search_cmd(spec, out), capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 2 and "--fresh" in proc.stderr
    proc = subprocess.run(search_cmd(spec, out, "--fresh"), capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_baseline_and_the_recommended_settings_say_where_a_step_s_time_goes(tmp_path, cli_env):
    from trainopt.decide import bottleneck
    from trainopt.decide.run_costs import advise

    costs = {"checkpoint_every_steps": 1000, "eval_every_steps": 200, "eval_batches": 2}
    spec = spec_file(tmp_path, **INPUT_BOUND, run_costs=costs)
    out = tmp_path / "out"
    proc = subprocess.run(search_cmd(spec, out), capture_output=True, text=True, env=cli_env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    # Slow storage and no workers: the baseline waits for data, and the workers win.
    diagnosis = doc["diagnosis"]
    assert diagnosis["bottleneck"] == "input" and doc["search_order"][0] == "num_workers"
    assert diagnosis == bottleneck.diagnose(diagnosis["breakdown"], doc["baseline"]["data_wait_fraction"])
    if diagnosis["breakdown"] is not None:
        assert sum(diagnosis["breakdown"]["shares"].values()) == pytest.approx(1.0)
    assert f"bottleneck of the baseline: input-bound ({diagnosis['reason']})" in proc.stdout
    # The recommended settings differ, so one diagnosed trial of them ran after the final check.
    assert doc["best"]["settings"]["num_workers"] == 2
    (diag,) = [t for t in doc["trials"] if t["role"] == "diagnosis"]
    assert diag["settings"] == doc["best"]["settings"] and diag["status"] == "ok"
    assert doc["final_diagnosis"] is not None and doc["final_diagnosis_error"] is None
    assert doc["final_diagnosis"]["data_wait_fraction"] == diag["data_wait_fraction"]
    assert "bottleneck of the recommended settings: " in proc.stdout
    # The run costs, priced from what the baseline trial measured, when it measured them.
    (base_file,) = (out / "trials").glob("*-baseline-baseline.result.json")
    base = json.loads(base_file.read_text())
    assert doc["run_costs"] == advise(base.get("run_costs"), costs, base["step_time_s"])
    html = (out / "report.html").read_text(encoding="utf-8")
    assert '<section id="breakdown">\n<h2>Where a step\'s time goes</h2>' in html


def test_measure_json_says_where_a_step_s_time_goes(tmp_path, cli_env):
    from trainopt.decide import bottleneck

    spec = spec_file(tmp_path)
    out = tmp_path / "measure"
    proc = subprocess.run([sys.executable, "-m", "trainopt", "measure", str(spec), "--json", "--out", str(out)],
                          capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert {"breakdown", "bottleneck", "bottleneck_reason", "run_costs_advice"} <= set(data)
    d = bottleneck.diagnose(data["breakdown"], data["data_wait_fraction"])
    assert (data["bottleneck"], data["bottleneck_reason"]) == (d["bottleneck"], d["reason"])
    assert data["run_costs_advice"] is None  # the spec has no run_costs section
    saved = json.loads((out / "result.json").read_text())
    assert "bottleneck" not in saved and saved["breakdown"] == data["breakdown"]
    human = subprocess.run([sys.executable, "-m", "trainopt", "measure", str(spec), "--out", str(tmp_path / "human")],
                           capture_output=True, text=True, env=cli_env, timeout=300)
    assert human.returncode == 0, human.stderr[-3000:]
    assert "where a step's time goes: " in human.stdout and " → " in human.stdout


def test_search_json_prints_one_object_and_nothing_else_on_stdout(tmp_path, cli_env):
    spec = spec_file(tmp_path, search={"amp": ["off", "bf16"]})
    out = tmp_path / "out"
    proc = subprocess.run(search_cmd(spec, out, "--json"), capture_output=True, text=True, env=cli_env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    head = json.loads(proc.stdout)  # the whole of stdout is one JSON object
    assert proc.stdout.strip().count("\n") == 0
    doc = json.loads((out / "results.json").read_text())
    assert head["name"] == doc["name"] and head["complete"] is True and head["out"] == str(out)
    assert head["speedup"] == doc["speedup"] and head["speedup_ci"] == doc["speedup_ci"]
    assert head["baseline_samples_per_s"] > 0 and head["best_samples_per_s"] > 0
    assert head["kept"] == [{"knob": d["knob"], "from": d["from"], "to": d["to"], "speedup": d["speedup"], "ci": d["ci"]}
                            for d in doc["decisions"] if d["kept"]]
    assert head["bottleneck"]["baseline"]["verdict"] == doc["diagnosis"]["bottleneck"]
    assert "baseline" in proc.stderr  # progress still goes to stderr
