"""Live interleaved sessions with real arm processes forked from the fork server."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import FIXTURES, ROOT, tiny_spec_dict
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.spec import apply_overrides, spec_from_dict
from trainopt.decide.session_plan import HOPELESS, start_order
from trainopt.execute.session_runners import InterleavedSessionRunner

pytestmark = pytest.mark.integration


def _requests(tmp_path: Path, settings: list[dict], spec: dict | None = None) -> tuple[list[TrialRequest], list[Path]]:
    spec_obj = spec_from_dict(spec or tiny_spec_dict(), source_dir=tmp_path)
    resolved = spec_obj.resolved()
    reqs, logs = [], []
    for i, overrides in enumerate(settings):
        reqs.append(TrialRequest(spec=resolved, source_dir=str(tmp_path), settings=apply_overrides(spec_obj, overrides),
                                 mode="measure", result_path=str(tmp_path / f"arm{i}.result.json"), trial_id=f"arm{i}"))
        logs.append(tmp_path / "logs" / f"arm{i}.log")
    return reqs, logs


def _alive(pids) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            pass
    return alive


def _tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def test_two_arms_alternate_windows_and_report_their_own_results(tmp_path):
    reqs, logs = _requests(tmp_path, [{"batch_size": 16}, {"batch_size": 32}])
    seen: list[list[int]] = []
    with InterleavedSessionRunner(on_window=lambda i, trees: seen.extend(trees)) as runner:
        # Seed 5 starts the second arm first: each result must still be its own request's.
        result = runner.run_session(reqs, logs, timeout_s=60, seed=5)
        assert all(s < 1.0 for s in runner.startup_s), runner.startup_s
    assert result.mode == "interleaved", result.note
    assert result.rounds == 4 and len(result.order) == 4
    assert all(sorted(o) == [0, 1] for o in result.order)
    assert result.start_order == start_order(2, 5) == [1, 0]
    for i, arm in enumerate(result.arms):
        assert arm.status == "ok", arm.error
        assert arm.settings["batch_size"] == (16, 32)[i]
        assert len(arm.windows) == 4 and arm.samples_per_s > 0 and arm.window_steps >= 1
        assert arm.env["torch_threads"] == 1 and arm.env["device_type"] == "cpu"
        assert arm.peak_memory_bytes > 50 * 2**20 and arm.warmup_s > 0 and 0 <= arm.data_wait_fraction < 1
        assert arm.last_loss is not None and arm.first_loss is not None
        # The same result is on disk where a one-shot trial would have written it.
        on_disk = TrialResult.from_dict(json.loads(Path(reqs[i].result_path).read_text()))
        assert on_disk.samples_per_s == arm.samples_per_s
        assert logs[i].exists()
    assert result.ratio(1, 0) == result.arms[1].samples_per_s / result.arms[0].samples_per_s
    # Every arm process and loader worker is gone after the session.
    time.sleep(0.2)
    assert _alive({pid for tree in seen for pid in tree}) == []


def test_a_paused_arm_and_its_loader_workers_accrue_no_cpu_time(tmp_path):
    spec = tiny_spec_dict(measure={"window_seconds": 0.3, "windows": 4})
    # Persistent loader workers keep prefetching whenever they are not stopped.
    workers = {"num_workers": 1, "persistent_workers": True, "batch_size": 16}
    reqs, logs = _requests(tmp_path, [workers, workers, workers], spec)
    snapshots: list[tuple[int, list[list[int]], list[float], list[str]]] = []

    def observe(index, trees):
        states = []
        for tree in trees:
            for pid in tree:
                try:
                    states.append(psutil.Process(pid).status())
                except psutil.Error:
                    pass
        snapshots.append((index, trees, [_tree_cpu(t) for t in trees], states))

    with InterleavedSessionRunner(on_window=observe) as runner:
        result = runner.run_session(reqs, logs, timeout_s=60, seed=1)
    assert [a.status for a in result.arms] == ["ok"] * 3, [a.error for a in result.arms]
    assert len(snapshots) == 12
    # Each arm has its loader worker: the trees hold two processes each.
    assert all(len(tree) == 2 for tree in snapshots[0][1])
    for (ran, _, before, states), (_, _, after, _) in zip(snapshots, snapshots[1:]):
        # Between two windows only the arm that ran used CPU; the paused ones not a tick.
        assert after[ran] > before[ran]
        for other in range(3):
            if other != ran:
                assert after[other] == before[other], (ran, other, before, after)
        # While the observer looks, every arm and worker is stopped.
        assert set(states) == {psutil.STATUS_STOPPED}


def test_each_failing_arm_is_classified_alone_and_the_others_finish(tmp_path):
    trigger = tmp_path / "fail-now"
    faults = ["segfault", "nan", "hang", "oom", None]

    def spec_with(fault):
        return {"name": f"{FIXTURES / 'session_faults.py'}:model", "args": {"fault": fault, "trigger": str(trigger)}}

    spec = tiny_spec_dict(data={"name": "synthetic-tabular", "args": {"size": 512, "features": 16, "num_classes": 4}},
                          measure={"windows": 4, "window_seconds": 0.1})
    requests, logs = [], []
    for i, fault in enumerate(faults):
        spec["model"] = spec_with(fault)
        reqs, lg = _requests(tmp_path, [{}], spec)
        requests.append(dataclasses.replace(reqs[0], result_path=str(tmp_path / f"f{i}.json")))
        logs.append(tmp_path / "logs" / f"f{i}.log")
    seen: list[int] = []
    trees: set[int] = set()

    def observe(index, arm_trees):
        seen.append(index)
        trees.update(pid for t in arm_trees for pid in t)
        if len(seen) == len(faults) + 1:  # one full round done: from now on the faulty arms fail
            trigger.touch()

    start = time.monotonic()
    with InterleavedSessionRunner(on_window=observe) as runner:
        result = runner.run_session(requests, logs, timeout_s=12, seed=2)
    assert time.monotonic() - start < 60
    statuses = {fault: arm.status for fault, arm in zip(faults, result.arms)}
    assert statuses == {"segfault": "crashed", "nan": "nonfinite", "hang": "timeout", "oom": "oom", None: "ok"}, \
        [a.error for a in result.arms]
    assert "SIGSEGV" in result.arms[0].error
    healthy = result.arms[-1]
    assert len(healthy.windows) == 4 and healthy.samples_per_s > 0
    # The failed arms measured their first round before failing; no throughput is claimed.
    for arm in result.arms[:-1]:
        assert len(arm.windows) >= 1 and arm.samples_per_s is None
    assert result.mode == "interleaved" and result.rounds == 4
    time.sleep(0.2)
    assert _alive(trees) == []


SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {root!r})
    from pathlib import Path
    from tests.conftest import tiny_spec_dict
    from trainopt.contract.protocol import TrialRequest
    from trainopt.execute.session_runners import InterleavedSessionRunner
    from trainopt.contract.spec import apply_overrides, spec_from_dict
    out = Path({out!r})
    spec = spec_from_dict(tiny_spec_dict(measure={{"windows": 1000, "window_seconds": 0.2}}), source_dir=out)
    reqs = [TrialRequest(spec=spec.resolved(), source_dir=str(out),
                         settings=apply_overrides(spec, {{"num_workers": 1, "persistent_workers": True}}),
                         mode="measure", result_path=str(out / f"a{{i}}.json")) for i in range(2)]
    def observe(index, trees):
        (out / "trees.json").write_text(json.dumps(trees))
    InterleavedSessionRunner(on_window=observe).run_session(reqs, [out / "a0.log", out / "a1.log"], 60, 0)
""")


def _session_in_flight(tmp_path: Path) -> tuple[subprocess.Popen, set[int]]:
    """An orchestrator process mid-session (windows running, the other arm paused) and the
    pids of its arms and their loader workers."""
    script = tmp_path / "orchestrator.py"
    script.write_text(SCRIPT.format(root=str(ROOT), out=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "trees.json").exists():
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, {pid for tree in json.loads((tmp_path / "trees.json").read_text()) for pid in tree}


def _assert_all_end(pids: set[int]) -> None:
    deadline = time.monotonic() + 15
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(pids) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_no_arm_or_loader_worker_outlives_an_interrupted_orchestrator(tmp_path, sig):
    proc, pids = _session_in_flight(tmp_path)
    try:
        pids |= {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}  # the fork server too
        assert len(pids) >= 5
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _assert_all_end(pids)


def test_no_loader_worker_outlives_a_fork_server_killed_with_its_orchestrator(tmp_path):
    # As when a machine's process manager kills a whole process group (a Ray node going
    # away): the fork server gets no chance to end its arms, a paused arm's loader workers are
    # stopped, and nothing would ever resume them.
    proc, pids = _session_in_flight(tmp_path)
    try:
        fork_servers = [p.pid for p in psutil.Process(proc.pid).children()]
        assert len(fork_servers) == 1 and len(pids) >= 4
        for pid in fork_servers + [proc.pid]:
            os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _assert_all_end(pids | set(fork_servers))


def test_threads_and_fork_server_environment_apply_to_each_forked_arm(tmp_path):
    # The fork server imported torch before any arm chose its thread count: each arm's
    # setting must still take effect after the fork, and the fork server's environment
    # (read by the OpenMP runtime when torch is loaded) must reach every arm.
    spec = tiny_spec_dict(model={"name": "mlp", "args": {"hidden": 256, "layers": 2}})
    reqs, logs = _requests(tmp_path, [{"threads": 1}, {"threads": 2}], spec)
    threads: dict[int, int] = {}
    environ: dict[int, str] = {}

    def observe(index, trees):
        for i, tree in enumerate(trees):
            if tree:
                threads[i] = max(threads.get(i, 0), psutil.Process(tree[0]).num_threads())
                environ[i] = Path(f"/proc/{tree[0]}/environ").read_bytes().decode(errors="replace")

    with InterleavedSessionRunner(env={"OMP_WAIT_POLICY": "PASSIVE"}, on_window=observe) as runner:
        result = runner.run_session(reqs, logs, timeout_s=60, seed=0)
    assert [a.status for a in result.arms] == ["ok", "ok"], [a.error for a in result.arms]
    assert [a.env["torch_threads"] for a in result.arms] == [1, 2]
    # Two intra-op threads means one more OpenMP worker thread in that arm's process.
    assert threads[1] > threads[0], threads
    assert all("OMP_WAIT_POLICY=PASSIVE" in environ[i] for i in (0, 1))


def test_arms_that_do_not_fit_the_host_fall_back_to_sequential_and_say_so(tmp_path):
    reqs, logs = _requests(tmp_path, [{}, {"batch_size": 32}])
    with InterleavedSessionRunner(host_ram_bytes=256 * 2**20) as runner:
        result = runner.run_session(reqs, logs, timeout_s=60, seed=4)
    assert result.mode == "sequential" and result.rounds == 0
    assert "host RAM" in result.note and "one at a time" in result.note
    assert [a.status for a in result.arms] == ["ok", "ok"] and result.arms[1].settings["batch_size"] == 32
    assert result.ratio(0, 1) is not None


def test_without_a_fork_server_the_session_is_measured_sequentially(tmp_path):
    reqs, logs = _requests(tmp_path, [{}, {}])
    with InterleavedSessionRunner(python="/bin/false") as runner:
        result = runner.run_session(reqs, logs, timeout_s=60, seed=0)
    assert result.mode == "sequential" and "not available" in result.note
    assert [a.status for a in result.arms] == ["ok", "ok"]


def test_an_arm_far_slower_than_the_incumbent_stops_after_one_window(tmp_path):
    # Batch 1 pays the per-step overhead for every sample: far below batch 64 in samples/s.
    reqs, logs = _requests(tmp_path, [{"batch_size": 64}, {"batch_size": 1}, {"batch_size": 48}])
    with InterleavedSessionRunner() as runner:
        result = runner.run_session(reqs, logs, timeout_s=60, seed=5)
    assert result.mode == "interleaved"
    fast, slow, near = result.arms
    assert all(a.status == "ok" for a in result.arms), [a.error for a in result.arms]
    assert slow.samples_per_s < 0.5 * fast.samples_per_s
    assert len(slow.windows) == 1 and len(fast.windows) == 4 and len(near.windows) == 4
    assert all(1 not in order for order in result.order[1:])
    assert f"arm 1 ran below {HOPELESS:.2f}x the incumbent" in result.note


def test_the_fork_server_imports_what_an_arm_asks_for_once_before_forking_it(tmp_path):
    # A compiled arm's spawn request names the compiler's modules: they must be imported
    # in the fork server (once, by the first such request) so later arms are forked with them.
    import socket

    from trainopt.contract.boundary import FORKSERVER_PARENT_VAR
    from trainopt.execute.arm_handles import ForkServerHandle

    probe = tmp_path / "imports.txt"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{FIXTURES}", TRAINOPT_IMPORT_PROBE=str(probe))
    env[FORKSERVER_PARENT_VAR] = str(os.getpid())
    fork_server = ForkServerHandle(env, [sys.executable])
    try:
        pids = []
        for preload in ((), ("import_probe",), ("import_probe",)):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            log_fd = os.open(tmp_path / f"arm{len(pids)}.log", os.O_WRONLY | os.O_CREAT, 0o644)
            pids.append(fork_server.spawn(theirs.fileno(), log_fd, preload))
            os.close(log_fd)
            theirs.close()
            if len(pids) == 1:
                assert not probe.exists()
            ours.close()  # the arm sees its control socket close and ends
            fork_server.wait(pids[-1])
        assert probe.read_text().split() == [str(fork_server.proc.pid)]
    finally:
        fork_server.close()


def test_an_arm_starved_by_busy_loops_is_named_in_the_session_note(tmp_path):
    # As many busy loops as cores, at normal priority: a one-thread arm gets about half a core
    # at best, far below the 80 % of a core that a quiet machine gives it.
    import signal
    import subprocess
    import sys

    reqs, logs = _requests(tmp_path, [{"batch_size": 16}, {"batch_size": 32}])
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
             for _ in range(os.cpu_count() or 1)]
    try:
        time.sleep(0.5)
        with InterleavedSessionRunner() as runner:
            result = runner.run_session(reqs, logs, timeout_s=120, seed=5)
    finally:
        for p in loops:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert result.mode == "interleaved", result.note
    assert "of a core (1 thread)" in result.note and "other processes held the cores" in result.note, result.note
