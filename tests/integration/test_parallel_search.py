"""The same real search through the CLI with one slot and with two (one core each).

Both runs measure the planted input-bound workload (slow storage that two loader workers
hide); with two slots the verdicts must not change, no trial may run twice, every
session's processes must stay on its slot's core (as the trial itself saw it), and the
final check's sessions must run with nothing beside them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.test_search_cli import INPUT_BOUND, search_cmd, spec_file

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{1: (out, results, stderr), 2: ...}``: the same spec searched with --parallel 1 and 2."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    tmp = tmp_path_factory.mktemp("parallel")
    spec = spec_file(tmp, **INPUT_BOUND)
    got = {}
    for n in (1, 2):
        out = tmp / f"out{n}"
        proc = subprocess.run(search_cmd(spec, out, "--quiet", "--parallel", str(n)), capture_output=True, text=True,
                              env=_env(), timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[n] = (out, json.loads((out / "results.json").read_text()), proc.stderr)
    return got


def _arm_file(out: Path, row: dict) -> dict:
    """What the orchestrator wrote for one arm (the trial's own ``env`` plus its placement)."""
    return json.loads((out / "trials" / (Path(row["log"]).stem + ".result.json")).read_text())


def _verdicts(doc: dict) -> tuple:
    return ([(d["knob"], d["verdict"], d["kept"]) for d in doc["decisions"]],
            doc["final"]["verdict"], doc["best"]["settings"])


def test_two_slots_reach_the_same_verdicts(runs):
    one, two = runs[1][1], runs[2][1]
    assert one["complete"] and two["complete"]
    assert _verdicts(two) == _verdicts(one)
    (workers,) = [d for d in two["decisions"] if d["knob"] == "num_workers"]
    assert workers["verdict"] == "improved" and two["best"]["settings"]["num_workers"] == 2
    assert two["final"]["verdict"] == "improved"
    assert "share its memory bandwidth" in runs[2][2]


@pytest.mark.parametrize("n", [1, 2])
def test_no_trial_runs_twice(runs, n):
    out, doc, _ = runs[n]
    keys = [t["key"] for t in doc["trials"]]
    assert len(keys) == len(set(keys)), "a trial key appears twice in results.json"
    assert doc["counts"]["trials_reused"] == 0
    with sqlite3.connect(out / "trials.db") as con:
        stored = [k for (k,) in con.execute(
            "select value_json from trial_user_attributes where key = 'key'").fetchall()]
        states = {s for (s,) in con.execute("select distinct state from trials")}
    assert sorted(json.loads(k) for k in stored) == sorted(keys), "the store and results.json disagree"
    assert "RUNNING" not in states
    # Every arm's result file was written once per trial number: no number was handed out twice.
    logs = [t["log"] for t in doc["trials"] if t["log"]]
    assert len(logs) == len(set(logs))


def test_every_session_stays_on_its_slots_core(runs):
    out, doc, _ = runs[2]
    cores = sorted(os.sched_getaffinity(0))[:2]
    sessions = [t for t in doc["trials"] if t["session"]]
    assert sessions
    workers_seen = 0
    for row in sessions:
        env = _arm_file(out, row)["env"]
        core = cores[row["slot"]]
        assert row["node"] and row["device"] == f"cpu:{core}" == env["device"]
        # Seen from inside the trial: its own process and every loader worker it started.
        assert env["cpu_set"] == [core], row["key"]
        assert all(cpus == [core] for cpus in env["loader_cpu_sets"]), (row["key"], env["loader_cpu_sets"])
        assert len(env["loader_cpu_sets"]) <= row["settings"]["num_workers"]
        assert env["torch_threads"] == 1
        workers_seen += len(env["loader_cpu_sets"])
    # Read just after warm-up: loader workers are alive then unless an epoch ended that moment.
    assert workers_seen > 0, "no trial saw its loader workers"
    assert {row["slot"] for row in sessions} == {0, 1}, "one slot did all the work"
    # Trials outside every session (the baseline) run alone, unpinned, and say so.
    for row in doc["trials"]:
        if not row["session"] and row["status"] == "ok":
            assert row["slot"] is None and row["node"] and row["device"].startswith("cpu:"), row


def _spans(out: Path, doc: dict) -> dict[str, tuple[str, int, float, float]]:
    """Session id -> (role, slot, start, end), as the executor recorded them."""
    spans = {}
    for row in doc["trials"]:
        if row["session"]:
            env = _arm_file(out, row)["env"]
            start, end = env["session_span"]
            spans[row["session"]["id"]] = (row["role"], row["slot"], start, end)
    return spans


def test_sessions_overlap_except_the_final_checks(runs):
    out, doc, _ = runs[2]
    spans = _spans(out, doc)
    # Held-out sessions run alone like the final check's (they are the final check when no
    # later change is kept).
    final = {k: v for k, v in spans.items() if v[0] in ("final", "holdout")}
    others = {k: v for k, v in spans.items() if v[0] not in ("final", "holdout")}
    assert len(final) >= 2 and others

    def overlap(a, b):
        return min(a[3], b[3]) - max(a[2], b[2]) > 0

    # The confirmation's pairs up to its next look ran side by side on the two slots.
    assert any(overlap(a, b) for a in others.values() for b in others.values() if a is not b)
    # exclusive=True: nothing ran beside any session of the final check or those held-out pairs.
    for k, f in final.items():
        beside = [j for j, s in spans.items() if j != k and overlap(f, s)]
        assert not beside, (k, beside)
