"""Sessions on Ray: a local instance, and a simulated two-node cluster that loses a node."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from tests.integration.test_slot_sessions import _job
from trainopt.contract.protocol import TrialResult

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from trainopt.execute.ray_executor import RayExecutor  # noqa: E402

pytestmark = pytest.mark.integration

ARMS = [{"batch_size": 16}, {"batch_size": 32}]


def _check(jobs, results):
    assert len(results) == len(jobs)
    for job, result in zip(jobs, results):
        assert result.mode == "interleaved", result.note
        for request, log_path, arm in zip(job.requests, job.log_paths, result.arms):
            assert arm.status == "ok", arm.error
            assert arm.settings["batch_size"] == request.settings["batch_size"]
            assert arm.env["node"] and arm.env["ray_node_id"] and arm.env["device"].startswith("cpu")
            # Written here by the orchestrator, from what the node sent back.
            on_disk = TrialResult.from_dict(json.loads(Path(request.result_path).read_text()))
            assert on_disk.samples_per_s == arm.samples_per_s and on_disk.env["slot"] == arm.env["slot"]
            assert arm.log_path == str(log_path) and Path(log_path).exists()


def test_a_local_ray_instance_runs_sessions_on_its_slots(tmp_path):
    jobs = [_job(tmp_path, f"s{k}", ARMS, k) for k in range(2)]
    with RayExecutor(None, cpus_per_slot=1, device="cpu") as ex:
        assert ex.slots == len(os.sched_getaffinity(0))
        results = ex.run_many(jobs)
    _check(jobs, results)
    # Pinned on the node: each arm reports the one core of its slot from inside.
    for result in results:
        for arm in result.arms:
            assert arm.env["device"] == f"cpu:{arm.env['cpu_set'][0]}" and len(arm.env["cpu_set"]) == 1
    assert not ray.is_initialized()


def test_sessions_lost_with_a_node_are_run_again_on_the_others(tmp_path):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    worker = cluster.add_node(num_cpus=1)
    try:
        ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}})
        cluster.wait_for_nodes()
        # Told apart by their first arm's batch size.
        jobs = [_job(tmp_path, f"s{k}", [{"batch_size": 16 + k}, {"batch_size": 32}], k) for k in range(3)]
        ex = RayExecutor(cluster.address, cpus_per_slot=1, device="cpu")
        assert ex.slots == 2
        doomed = next(k for k, s in ex.plan.items() if s.node_id == worker.node_id)
        removed = threading.Event()

        def remove_when_busy():
            # Remove the worker node while a session runs on it (its arms are live by then).
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if doomed in ex.in_flight.values():
                    time.sleep(2.0)
                    cluster.remove_node(worker)
                    removed.set()
                    return
                time.sleep(0.05)

        killer = threading.Thread(target=remove_when_busy)
        killer.start()
        try:
            results = ex.run_many(jobs)
        finally:
            killer.join()
            ex.close()
        assert removed.is_set()
        assert ex.lost_slots == [doomed] and ex.reruns >= 1
        _check(jobs, results)
        # Every job has exactly one result, its own; the lost session was measured again elsewhere.
        assert [r.arms[0].settings["batch_size"] for r in results] == [16, 17, 18]
        assert sum(r.arms[0].env["slot"] != doomed for r in results) >= 2
        rerun = [r for r in results if r.arms[0].env.get("session_reruns")]
        assert len(rerun) == ex.reruns and all(a.env["slot"] != doomed for r in rerun for a in r.arms)
    finally:
        ray.shutdown()
        cluster.shutdown()


class _BusyProbe:
    """A machine check that says busy and records the processes it is told are the search's own."""

    busy_now = True

    def __init__(self):
        self.own: list[int] = []

    def add_own(self, pids):
        self.own += list(pids)


def test_ray_slots_read_the_launcher_s_machine_check(tmp_path):
    import psutil

    job = _job(tmp_path, "busy", [{"batch_size": 64}, {"batch_size": 1}], 3)
    probe = _BusyProbe()
    with RayExecutor(None, cpus_per_slot=1, device="cpu", max_slots=1) as ex:
        ex.attach_machine(probe)
        # The slot's actor runs on this machine: its process tree is the search's own.
        assert probe.own == [d["pid"] for d in ex.described.values()]
        assert all(psutil.pid_exists(pid) for pid in probe.own)
        [result] = ex.run_many([job])
    fast, slow = result.arms
    assert slow.samples_per_s < 0.5 * fast.samples_per_s
    # The session carried "busy" to the slot: the slow arm was measured to the end.
    assert len(slow.windows) == len(fast.windows) > 1
    assert "the early cut did not act on a slow arm: the machine was busy" in result.note
