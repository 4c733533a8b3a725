"""Scale-out flags, Ray slot planning (pure) and the missing-Ray message."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from trainopt.contract.protocol import TrialResult
from trainopt.contract.session import SessionResult
from trainopt.errors import UserError
from trainopt.execute import scaling
from trainopt.execute.executors import SerialExecutor, SlotExecutor
from trainopt.execute.ray_executor import cluster_slots, import_ray, session_from_dict


def _node(node_id: str, cpus: float, gpus: float = 0, alive: bool = True, host: str | None = None) -> dict:
    res = {"CPU": cpus, "memory": 1e9}
    if gpus:
        res["GPU"] = gpus
    return {"NodeID": node_id, "Alive": alive, "NodeManagerHostname": host or f"host-{node_id}", "Resources": res}


def test_cpu_nodes_get_slots_of_k_cores_and_dead_nodes_none():
    plan = cluster_slots([_node("b", 8), _node("a", 4), _node("c", 16, alive=False)], cpus_per_slot=3)
    assert [(s.node_id, s.index_on_node, s.count_on_node, s.num_cpus, s.num_gpus) for s in plan] == [
        ("a", 0, 1, 3, 0), ("b", 0, 2, 3, 0), ("b", 1, 2, 3, 0)]
    assert [s.index for s in plan] == [0, 1, 2] and plan[0].host == "host-a"


def test_without_k_each_cpu_node_is_one_slot():
    plan = cluster_slots([_node("a", 4), _node("b", 8)], cpus_per_slot=None)
    assert [(s.node_id, s.num_cpus) for s in plan] == [("a", 4), ("b", 8)]


def test_gpu_nodes_get_one_slot_per_gpu_with_a_core_share_and_cpu_nodes_none():
    plan = cluster_slots([_node("g", 16, gpus=4), _node("c", 64)], cpus_per_slot=None)
    assert [(s.node_id, s.index_on_node, s.num_cpus, s.num_gpus) for s in plan] == [
        ("g", 0, 4, 1), ("g", 1, 4, 1), ("g", 2, 4, 1), ("g", 3, 4, 1)]
    # Too few cores for K per GPU: fewer slots rather than slots Ray could never place.
    assert len(cluster_slots([_node("g", 6, gpus=4)], cpus_per_slot=2)) == 3
    # device: cpu ignores the GPUs.
    assert [s.num_gpus for s in cluster_slots([_node("g", 16, gpus=4)], 8, device="cpu")] == [0, 0]


def test_a_cluster_without_room_for_a_slot_is_refused():
    with pytest.raises(UserError, match="no node of the Ray cluster has 8 free CPU"):
        cluster_slots([_node("a", 4)], cpus_per_slot=8)


def test_session_results_survive_the_trip_from_a_node():
    arm = TrialResult(status="ok", settings={"batch_size": 16}, samples_per_s=12.5, windows=[12.0, 13.0],
                      env={"torch": "x"})
    result = SessionResult(arms=[arm, TrialResult(status="oom", error="out")], mode="interleaved", rounds=2,
                           order=[[0, 1], [1, 0]], note="n", wall_s=3.0)
    back = session_from_dict(result.to_dict())
    assert back.to_dict() == result.to_dict() and back.ratio(0, 1) is None


def test_without_ray_the_flag_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(UserError) as err:
        import_ray()
    assert 'pip install "trainopt[ray]"' in str(err.value) and "--ray" in str(err.value)
    args = _parse(["--ray", "auto"])
    with pytest.raises(UserError, match=r'pip install "trainopt\[ray\]"'):
        scaling.make_executor(args, "cpu")


def _parse(argv):
    parser = argparse.ArgumentParser()
    scaling.add_options(parser)
    return parser.parse_args(argv)


def test_flags_parse_and_choose_the_executor(tmp_path):
    args = _parse([])
    assert (args.parallel, args.ray, args.cpus_per_slot) == (1, None, None)
    assert _parse(["--ray"]).ray == scaling.LOCAL_RAY and _parse(["--ray", "auto"]).ray == "auto"
    serial = scaling.make_executor(args, "cpu", serial_runner=object())
    assert isinstance(serial, SerialExecutor) and serial.slots == 1 and scaling.executor_notes(serial) == []
    with pytest.raises(SystemExit):
        _parse(["--parallel", "0"])
    with pytest.raises(scaling.ScalingError, match="drop --parallel"):
        scaling.check_options(_parse(["--parallel", "2", "--ray"]))
    with pytest.raises(scaling.ScalingError, match="needs --ray"):
        scaling.check_options(_parse(["--cpus-per-slot", "2"]))


def test_parallel_builds_slots_and_explains_shared_bandwidth():
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    ex = scaling.make_executor(_parse(["--parallel", "2"]), "cpu")
    try:
        assert isinstance(ex, SlotExecutor) and ex.slots == 2
        assert "share its memory bandwidth" in scaling.executor_notes(ex)[0]
    finally:
        ex.close()
    with pytest.raises(UserError, match="--parallel 64"):
        scaling.make_executor(_parse(["--parallel", "64"]), "cpu")


def test_the_scale_out_modules_import_neither_torch_nor_ray():
    code = ("import sys\nimport trainopt.execute.executors, trainopt.contract.slots, trainopt.execute.ray_executor, trainopt.execute.scaling\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'ray')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]
