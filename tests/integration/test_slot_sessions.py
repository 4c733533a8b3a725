"""Two real interleaved sessions at once, each on its own core of this machine."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_spec_dict
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.spec import apply_overrides, spec_from_dict
from trainopt.execute.executors import SessionJob, SlotExecutor
from trainopt.execute.runner import SubprocessRunner
from trainopt.execute.session_runners import SequentialSessionRunner

pytestmark = pytest.mark.integration


def _job(tmp_path: Path, name: str, settings: list[dict], seed: int) -> SessionJob:
    spec = tiny_spec_dict(measure={"window_seconds": 0.1, "windows": 3})
    spec_obj = spec_from_dict(spec, source_dir=tmp_path)
    resolved = spec_obj.resolved()
    reqs, logs = [], []
    for i, overrides in enumerate(settings):
        reqs.append(TrialRequest(spec=resolved, source_dir=str(tmp_path), settings=apply_overrides(spec_obj, overrides),
                                 mode="measure", result_path=str(tmp_path / f"{name}-arm{i}.result.json"),
                                 trial_id=f"{name}-arm{i}"))
        logs.append(tmp_path / "logs" / f"{name}-arm{i}.log")
    return SessionJob(reqs, logs, timeout_s=120, seed=seed)


def test_two_sessions_run_at_once_each_confined_to_its_core(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    cores = cores[:2]
    # Loader workers (persistent, so they are alive when the arm reports) must inherit the slot.
    # threads stays unset (null): the slot's OMP_NUM_THREADS must be what bounds PyTorch's pool.
    arms = [{"batch_size": 16, "threads": None, "num_workers": 1, "persistent_workers": True},
            {"batch_size": 32, "threads": None, "num_workers": 1, "persistent_workers": True}]
    jobs = [_job(tmp_path, "a", arms, 1), _job(tmp_path, "b", arms, 2)]
    with SlotExecutor(2, cpus=cores, gpus=[], device="cpu") as ex:
        t0 = time.perf_counter()
        results = ex.run_many(jobs)
        together_s = time.perf_counter() - t0
    for job, result in zip(jobs, results):
        assert result.mode == "interleaved", result.note
        slot = result.arms[0].env["slot"]
        for request, arm in zip(job.requests, result.arms):
            assert arm.status == "ok", arm.error
            assert arm.settings["batch_size"] == request.settings["batch_size"] and arm.settings["threads"] is None
            env = arm.env
            assert env["slot"] == slot and env["device"] == f"cpu:{cores[slot]}" and env["node"]
            # Measured inside the trial: the arm, its pool and its loader worker stay on the slot's core.
            assert env["cpu_set"] == [cores[slot]]
            assert env["loader_cpu_sets"] == [[cores[slot]]]
            assert env["torch_threads"] == 1
            on_disk = TrialResult.from_dict(json.loads(Path(request.result_path).read_text()))
            assert on_disk.env["slot"] == slot and on_disk.samples_per_s == arm.samples_per_s
    assert {r.arms[0].env["slot"] for r in results} == {0, 1}
    # The two sessions overlapped: run one after the other, they would take at least the sum
    # of their own wall times.
    alone_s = sum(r.wall_s for r in results)
    assert together_s < 0.85 * alone_s, (together_s, [r.wall_s for r in results])


def test_one_at_a_time_trials_are_pinned_too_and_threads_beyond_the_slot_are_refused(tmp_path):
    """The sequential fallback's fresh trial processes inherit the slot like live arms do."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    cores = cores[:2]
    arms = [{"batch_size": 16, "threads": None}, {"batch_size": 16, "threads": 2}]
    jobs = [_job(tmp_path, "a", arms, 1), _job(tmp_path, "b", arms, 2)]

    def fallback(slot):
        return SequentialSessionRunner(SubprocessRunner(extra_env=slot.env()))

    with SlotExecutor(2, cpus=cores, gpus=[], device="cpu", runner_factory=fallback) as ex:
        results = ex.run_many(jobs)
    assert {r.arms[0].env["slot"] for r in results} == {0, 1}
    for result in results:
        assert result.mode == "sequential"
        fits, too_many = result.arms
        slot = fits.env["slot"]
        assert fits.status == "ok", fits.error
        assert fits.env["cpu_set"] == [cores[slot]] and fits.env["torch_threads"] == 1
        assert too_many.status == "not_applicable"
        assert "threads 2 is more than the 1 core(s) of this slot" in too_many.error
        assert too_many.env["slot"] == slot and too_many.env["device"] == f"cpu:{cores[slot]}"


class _Busy:
    """The machine check's verdict as a session runner reads it: busy."""

    busy_now = True


def test_while_the_machine_is_busy_no_slot_cuts_a_slow_arm(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores")
    # Batch 1 pays the per-step overhead for every sample: far below batch 64, so the early
    # cut would retire it after one window on a quiet machine.
    arms = [{"batch_size": 64}, {"batch_size": 1}]
    jobs = [_job(tmp_path, "a", arms, 1), _job(tmp_path, "b", arms, 2)]
    with SlotExecutor(2, cpus=cores[:2], gpus=[], device="cpu") as ex:
        ex.attach_machine(_Busy())
        results = ex.run_many(jobs)
    assert sorted(r.arms[0].env["slot"] for r in results) == [0, 1]
    for result in results:
        assert result.mode == "interleaved", result.note
        fast, slow = result.arms
        assert slow.samples_per_s < 0.5 * fast.samples_per_s
        assert len(slow.windows) == len(fast.windows) > 1
        assert "the early cut did not act on a slow arm: the machine was busy" in result.note
