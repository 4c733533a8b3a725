"""Slot planning (pure) and the executors' scheduling, with fake session runners."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from tests.fakes import FakeRunner
from trainopt.contract import slots
from trainopt.contract.boundary import SLOT_CPUS_VAR
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult
from trainopt.contract.slots import Slot, SlotError
from trainopt.execute.executors import SerialExecutor, SessionJob, SlotExecutor

ENV = {"device_type": "cpu", "device_name": "Xeon", "cpu_model": "Xeon", "torch": "2.13.0", "cuda": None,
       "python": "3.11.7", "cpu_flags": ["avx2"], "device_memory_bytes": None}


# ---- planning ---------------------------------------------------------------------------


def test_cpu_list_text_uses_ranges():
    assert slots.cpu_list_text([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert slots.cpu_list_text([5]) == "5"


def test_split_cpus_gives_disjoint_equal_consecutive_sets_and_leaves_the_remainder_unused():
    assert slots.split_cpus([0, 1, 2, 3, 4, 5, 6], 3) == [(0, 1), (2, 3), (4, 5)]
    assert slots.split_cpus([4, 6, 5, 7], 2) == [(4, 5), (6, 7)]
    assert slots.split_cpus(range(8), 2, per_slot=3) == [(0, 1, 2), (3, 4, 5)]


@pytest.mark.parametrize("n, per_slot, text", [(3, None, "--parallel 3"), (2, 2, "--parallel 2"),
                                                (0, None, "at least 1"), (1, 0, "--cpus-per-slot 0")])
def test_split_cpus_refuses_more_slots_than_cores(n, per_slot, text):
    with pytest.raises(SlotError) as err:
        slots.split_cpus([0, 1], n, per_slot=per_slot)
    assert text in str(err.value)
    if n > 0 and per_slot != 0:
        assert "2 this process may use (0-1)" in str(err.value) and "or fewer" in str(err.value)


def test_visible_devices_and_nvidia_smi_parsing():
    assert slots.parse_visible_devices(None) is None
    assert slots.parse_visible_devices("") == []
    assert slots.parse_visible_devices("2, 3") == ["2", "3"]
    assert slots.parse_visible_devices("0,-1,2") == ["0"]
    text = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2)\n"
    assert slots.parse_nvidia_smi(text) == ["0", "1"]
    assert slots.detect_gpus({"CUDA_VISIBLE_DEVICES": "5,7"}) == ["5", "7"]
    assert slots.detect_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_plan_gives_one_gpu_and_a_core_share_per_gpu_slot():
    plan = slots.plan_slots(2, range(8), ["4", "6", "7"], "auto")
    assert plan == [Slot(0, (0, 1, 2, 3), "4"), Slot(1, (4, 5, 6, 7), "6")]
    assert plan[1].device == "cuda:6"
    assert plan[1].env() == {"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "4", SLOT_CPUS_VAR: "4",
                             "CUDA_VISIBLE_DEVICES": "6"}


def test_plan_on_cpu_splits_cores_and_one_slot_is_todays_unpinned_run():
    assert slots.plan_slots(2, [0, 1], ["0"], "cpu") == [Slot(0, (0,)), Slot(1, (1,))]
    assert slots.plan_slots(2, [0, 1], [], "auto")[1].device == "cpu:1"
    only = slots.plan_slots(1, [0, 1], [], "auto")
    assert only == [Slot(0)] and only[0].env() == {} and only[0].device == "cpu"


@pytest.mark.parametrize("n, gpus, device, text", [
    (3, ["0", "1"], "auto", "only 2 GPU(s) visible (0,1)"),
    (2, [], "cuda", "no GPU is visible"),
    (2, ["0", "1"], "cuda:1", "set device: cuda"),
])
def test_plan_refuses_what_cannot_be_split(n, gpus, device, text):
    with pytest.raises(SlotError) as err:
        slots.plan_slots(n, range(8), gpus, device)
    assert text in str(err.value)


def test_slots_that_differ_are_refused_naming_the_difference():
    slots.check_alike([ENV, dict(ENV, hostname="other", cpu_affinity=3)])  # irrelevant keys may differ
    other = dict(ENV, torch="2.12.0", device_name="Epyc")
    assert slots.slot_differences(ENV, other) == ["device_name: 'Xeon' on the first slot, 'Epyc' here",
                                                  "torch: '2.13.0' on the first slot, '2.12.0' here"]
    with pytest.raises(SlotError) as err:
        slots.check_alike([ENV, ENV, other], names=["node a", "node b", "node c"])
    text = str(err.value)
    assert "node c differs from node a" in text and "torch: '2.13.0'" in text and "node b" not in text


def test_threads_beyond_the_slot_are_not_measured():
    assert slots.threads_reason(None, 1) is None
    assert slots.threads_reason(4, None) is None
    assert slots.threads_reason(2, 2) is None
    assert "threads 4 is more than the 2 core(s)" in slots.threads_reason(4, 2)
    assert slots.slot_cpus_from_env({SLOT_CPUS_VAR: "3"}) == 3
    assert slots.slot_cpus_from_env({}) is None


def test_other_processes_on_a_slots_gpu_are_reported():
    ids = slots.parse_gpu_ids("0, GPU-aaa\n1, GPU-bbb\n2, GPU-ccc\n")
    assert ids == {"GPU-aaa": "0", "GPU-bbb": "1", "GPU-ccc": "2"}
    apps = slots.parse_compute_apps("GPU-bbb, 4242, /usr/bin/python3\nGPU-ccc, 77, trainer\nGPU-aaa, 10, mine\n"
                                    "No running processes found\n")
    assert apps == [("GPU-bbb", 4242, "/usr/bin/python3"), ("GPU-ccc", 77, "trainer"), ("GPU-aaa", 10, "mine")]
    plan = [Slot(0, (), "0"), Slot(1, (), "GPU-bbb"), Slot(2, (0,))]
    lines = slots.foreign_gpu_processes(plan, ids, apps, own_pids={10})
    assert len(lines) == 1
    assert lines[0].startswith("slot 1 (cuda:GPU-bbb): process 4242 (/usr/bin/python3) is using this GPU")
    assert slots.gpu_busy_warnings([Slot(0, (0,))]) == []  # no GPU slot: nothing to ask


# ---- executors, with fake sessions ---------------------------------------------------------


def _jobs(tmp_path: Path, n: int, arms: int = 2) -> list[SessionJob]:
    jobs = []
    for j in range(n):
        reqs = [TrialRequest(spec={}, source_dir=str(tmp_path), settings={"batch_size": 16 * (a + 1), "job": j},
                             mode="measure", result_path=str(tmp_path / f"j{j}a{a}.result.json")) for a in range(arms)]
        jobs.append(SessionJob(reqs, [tmp_path / f"j{j}a{a}.log" for a in range(arms)], 60.0, seed=j))
    return jobs


class _SlowRunner:
    """A session runner that notes when, where (thread affinity) and what it ran."""

    def __init__(self, log: list, env: dict, delay: float = 0.3):
        self.log, self.env, self.delay = log, env, delay

    def run_session(self, requests, log_paths, timeout_s, seed) -> SessionResult:
        t0 = time.monotonic()
        time.sleep(self.delay)
        affinity = sorted(os.sched_getaffinity(0))
        self.log.append((requests[0].settings["job"], t0, time.monotonic(), affinity, threading.get_ident()))
        arms = [TrialResult(status="ok", settings=r.settings, samples_per_s=100.0, env=dict(self.env)) for r in requests]
        return SessionResult(arms=arms, mode="interleaved")


def _two_cores():
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    return cores[:2]


def test_serial_executor_runs_in_order_and_records_placement(tmp_path):
    fake = FakeRunner()
    results = SerialExecutor(fake).run_many(_jobs(tmp_path, 3))
    assert [r.arms[0].settings["job"] for r in results] == [0, 1, 2]
    assert [s[0].settings["job"] for s in fake.sessions] == [0, 1, 2]
    env = results[0].arms[1].env
    assert env["slot"] == 0 and env["node"] and env["device"].startswith("cpu")
    assert env["device_name"] == "fake"  # the trial's own fingerprint is kept


def test_slot_executor_runs_jobs_at_once_on_pinned_slots_in_job_order(tmp_path):
    cores = _two_cores()
    log: list = []
    with SlotExecutor(2, cpus=cores, gpus=[], runner_factory=lambda slot: _SlowRunner(log, ENV)) as ex:
        assert ex.slots == 2
        results = ex.run_many(_jobs(tmp_path, 4))
        assert [r.arms[0].settings["job"] for r in results] == [0, 1, 2, 3]
        assert sorted(entry[0] for entry in log) == [0, 1, 2, 3]  # each job once
        # Every session ran on its slot's thread, confined to that slot's core.
        for r in results:
            slot = r.arms[0].env["slot"]
            assert r.arms[0].env["device"] == f"cpu:{cores[slot]}"
            ran = next(e for e in log if e[0] == r.arms[0].settings["job"])
            assert ran[3] == [cores[slot]]
        # Two sessions overlapped in time.
        spans = sorted((e[1], e[2]) for e in log)
        assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
        log.clear()
        ex.run_many(_jobs(tmp_path, 3), exclusive=True)
        spans = sorted((e[1], e[2]) for e in log)
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:])), "exclusive jobs overlapped"
        assert {e[3][0] for e in log} == {cores[0]}
        # The executor's own record of each session's span agrees: none overlapped.
        recorded = sorted(tuple(r.arms[0].env["session_span"]) for r in ex.run_many(_jobs(tmp_path, 2), exclusive=True))
        assert recorded[0][1] <= recorded[1][0]


def test_session_spans_are_recorded_on_every_arm_and_show_overlap(tmp_path):
    cores = _two_cores()
    log: list = []
    with SlotExecutor(2, cpus=cores, gpus=[], runner_factory=lambda slot: _SlowRunner(log, ENV)) as ex:
        results = ex.run_many(_jobs(tmp_path, 2))
    spans = [r.arms[0].env["session_span"] for r in results]
    for r, span in zip(results, spans):
        assert all(a.env["session_span"] == span for a in r.arms)
        assert span[1] - span[0] >= 0.29  # the runner's own delay
    assert min(spans[0][1], spans[1][1]) > max(spans[0][0], spans[1][0]), "two slots did not overlap"


def test_a_trial_outside_every_slot_records_this_machine_and_keeps_its_own_values():
    from trainopt.execute.executors import local_device, record_local

    r = record_local(TrialResult(status="ok", env={"device_type": "cpu"}))
    assert r.env["slot"] is None and r.env["node"] and r.env["device"] == local_device("cpu")
    kept = record_local(TrialResult(status="ok", env={"device": "cuda:3", "node": "n1"}))
    assert kept.env["device"] == "cuda:3" and kept.env["node"] == "n1"
    assert record_local(TrialResult(status="crashed", env=None)).env["node"]


def test_slot_executor_refuses_a_slot_whose_trials_ran_elsewhere(tmp_path):
    cores = _two_cores()
    log: list = []
    envs = {0: ENV, 1: dict(ENV, cpu_model="Epyc", device_name="Epyc")}
    with SlotExecutor(2, cpus=cores, gpus=[], runner_factory=lambda slot: _SlowRunner(log, envs[slot.index], 0.2)) as ex:
        with pytest.raises(SlotError) as err:
            ex.run_many(_jobs(tmp_path, 2))
    assert "cpu_model: 'Xeon' on the first slot, 'Epyc' here" in str(err.value) or "'Epyc' on the first slot" in str(err.value)


def test_a_failing_session_is_raised_in_the_caller(tmp_path):
    cores = _two_cores()

    class Broken:
        def run_session(self, *args):
            raise ValueError("boom")

    with SlotExecutor(2, cpus=cores, gpus=[], runner_factory=lambda slot: Broken()) as ex:
        with pytest.raises(ValueError, match="boom"):
            ex.run_many(_jobs(tmp_path, 3))


def test_a_slot_that_cannot_be_pinned_fails_its_sessions_instead_of_running_unpinned(tmp_path):
    cores = _two_cores()
    log: list = []
    # Core 100000 does not exist: the kernel refuses the affinity.
    with SlotExecutor(2, cpus=[cores[0], 100000], gpus=[], runner_factory=lambda slot: _SlowRunner(log, ENV, 0.0)) as ex:
        with pytest.raises(SlotError, match="slot 1: cannot pin to cores 100000"):
            ex.run_many(_jobs(tmp_path, 4))
