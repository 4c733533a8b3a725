"""A real ``trainopt search --ray`` through the CLI: on a local instance, and on a simulated
two-node cluster that loses a node while a session runs on it."""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT
from tests.integration.test_search_cli import (
    INPUT_BOUND,
    finished_trials,
    search_cmd,
    spec_file,
)

ray = pytest.importorskip("ray")
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.integration


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _arm_file(out: Path, row: dict) -> dict:
    return json.loads((out / "trials" / (Path(row["log"]).stem + ".result.json")).read_text())


def _check_complete_search(out: Path) -> dict:
    """The planted win found, no trial key twice, every session with all of its arms."""
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"]
    (workers,) = [d for d in doc["decisions"] if d["knob"] == "num_workers"]
    assert workers["verdict"] == "improved" and doc["best"]["settings"]["num_workers"] == 2
    keys = [t["key"] for t in doc["trials"]]
    assert len(keys) == len(set(keys)), "a trial was duplicated"
    arms = collections.defaultdict(list)
    for row in doc["trials"]:
        if row["session"]:
            arms[row["session"]["id"]].append(row["session"]["arm"])
            assert row["status"] == "ok", row["error"]
            assert row["slot"] is not None and row["node"] and row["device"].startswith("cpu:")
    assert arms, "no session ran on the cluster"
    for sid, got in arms.items():
        info = next(t["session"] for t in doc["trials"] if t["session"] and t["session"]["id"] == sid)
        assert sorted(got) == list(range(info["arms"])), f"session {sid} lost or repeated an arm: {got}"
    return doc


def test_search_on_a_local_ray_instance(tmp_path):
    spec = spec_file(tmp_path, **INPUT_BOUND)
    out = tmp_path / "out"
    proc = subprocess.run(search_cmd(spec, out, "--quiet", "--ray", "--cpus-per-slot", "1"), capture_output=True,
                          text=True, env=_env(), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Ray slot(s) on 1 node(s)" in proc.stderr
    doc = _check_complete_search(out)
    assert doc["final"]["verdict"] == "improved"
    cores = sorted(os.sched_getaffinity(0))
    for row in doc["trials"]:
        if row["session"]:
            # Each slot pins its sessions to its own core, seen from inside the trial.
            env = _arm_file(out, row)["env"]
            assert env["cpu_set"] == [int(row["device"].split(":")[1])] and env["cpu_set"][0] in cores


@pytest.fixture(scope="module")
def two_nodes():
    """A simulated cluster on this machine: a head and one worker node, one core each."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        worker = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        yield cluster, worker
    finally:
        cluster.shutdown()
        # A removed node's worker processes end only when they notice their raylet is gone,
        # and the launcher (and its arms) of a session there end with them: give Ray's own
        # teardown time before the module's leftover check looks.
        from tests.integration.conftest import leftover_processes

        deadline = time.monotonic() + 45.0
        while leftover_processes() and time.monotonic() < deadline:
            time.sleep(0.5)


def _arms_live_on(node) -> bool:
    """Whether a session's arms are running on ``node``: a launcher there with forked arms."""
    raylet = node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    try:
        procs = psutil.Process(raylet).children(recursive=True)
    except psutil.Error:
        return False
    launchers = 0
    for p in procs:
        try:
            launchers += "trainopt.trial.forkserver" in " ".join(p.cmdline())
        except psutil.Error:
            continue
    # The launcher itself plus at least one arm forked from it (arms keep its command line).
    return launchers >= 2


def test_search_survives_losing_a_node_mid_session(tmp_path, two_nodes):
    cluster, worker = two_nodes
    spec = spec_file(tmp_path, **INPUT_BOUND)
    out = tmp_path / "out"
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen(search_cmd(spec, out, "--quiet", "--ray", cluster.address, "--cpus-per-slot", "1"),
                                env=_env(), stdout=subprocess.DEVNULL, stderr=err)
        try:
            # Remove the worker node once some trials are stored and a session's arms run on it.
            deadline = time.monotonic() + 600
            while not (finished_trials(out) >= 1 and _arms_live_on(worker)):
                assert proc.poll() is None, err_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no session ever ran on the worker node"
                time.sleep(0.1)
            time.sleep(1.0)  # into the session's measurement
            assert proc.poll() is None
            cluster.remove_node(worker)
            removed_at = finished_trials(out)
            rc = proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    stderr = err_path.read_text()
    assert rc == 0, stderr[-3000:]
    assert "2 Ray slot(s)" in stderr  # both simulated nodes share this host name
    lost = re.findall(r"Ray slot (\d+) on \S+ \(node \w+\) was lost mid-session; session (\S+) runs again", stderr)
    assert lost, stderr[-3000:]
    lost_slots = {int(k) for k, _ in lost}
    assert len(lost_slots) == 1
    doc = _check_complete_search(out)
    assert len(doc["trials"]) > removed_at, "nothing ran after the node was removed"
    rows = {t["key"]: t for t in doc["trials"]}
    for _, key in lost:
        # The lost session's first arm (named in the message) is in the results once, measured
        # again on the remaining node, and says it was re-run.
        row = rows[key]
        env = _arm_file(out, row)["env"]
        assert row["slot"] not in lost_slots and env["ray_node_id"] != worker.node_id
        assert env["session_reruns"] >= 1
        siblings = [t for t in doc["trials"] if t["session"] and t["session"]["id"] == row["session"]["id"]]
        assert {t["slot"] for t in siblings} == {row["slot"]}
