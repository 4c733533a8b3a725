"""Diagnosed trials in real processes: the step-time breakdown and the run costs in the result.

Each trial is a real ``python -m trainopt.trial.worker`` (or a torchrun job of two gloo ranks)
started by ``SubprocessRunner`` with ``TrialRequest.diagnose`` set, as the orchestrator
starts its baseline and final trials.
"""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES, tiny_spec_dict
from trainopt.contract.protocol import TrialRequest
from trainopt.contract.spec import load_spec
from trainopt.execute.runner import SubprocessRunner
from trainopt.stats.phases import PHASES

pytestmark = pytest.mark.integration

PLANTED = str(FIXTURES / "planted_phases.py")
RUN_COSTS = {"checkpoint_every_steps": 200, "eval_every_steps": 100, "eval_batches": 4}


def run_trial(tmp_path, write_spec, spec: dict, diagnose: bool = True, name: str = "trial", timeout: float = 180):
    folder = tmp_path / name
    folder.mkdir()
    path = write_spec(spec, name=f"{name}.yaml")
    loaded = load_spec(path)
    request = TrialRequest(
        spec=loaded.resolved(),
        source_dir=str(loaded.source_dir()),
        settings=dict(loaded.baseline),
        mode="measure",
        result_path=str(folder / "result.json"),
        trial_id=name,
        diagnose=diagnose,
    )
    log = folder / "trial.log"
    result = SubprocessRunner().run(request, log, timeout)
    return result, folder, log


def check_breakdown(b: dict, steps: int) -> None:
    assert b["steps"] == steps and b["wall_s"] > 0
    assert set(b["shares"]) == set(PHASES) and set(b["seconds"]) == set(PHASES)
    assert sum(b["shares"].values()) == pytest.approx(1.0, abs=0.02)
    assert all(0.0 <= s <= 1.0 for s in b["shares"].values())
    assert b["device_type"] == "cpu" and b["device_busy"] is None
    assert b["gpu_utilization"] is None and b["gpu_memory_used_bytes"] is None


def test_a_diagnosed_trial_reports_where_its_steps_go(tmp_path, write_spec):
    result, folder, log = run_trial(tmp_path, write_spec, tiny_spec_dict())
    assert result.status == "ok", (result.error, log.read_text()[-2000:])
    assert result.samples_per_s > 0 and len(result.windows) == 4
    # measure.breakdown_steps is null: the profiled window is one timed window long.
    check_breakdown(result.breakdown, result.window_steps)
    assert result.breakdown["seconds"]["forward"] > 0 and result.breakdown["seconds"]["data_wait"] > 0
    assert result.run_costs is None  # the spec has no run_costs section


def test_run_costs_are_timed_and_leave_no_checkpoint_behind(tmp_path, write_spec):
    spec = tiny_spec_dict(run_costs=RUN_COSTS, measure={"breakdown_steps": 7})
    result, folder, log = run_trial(tmp_path, write_spec, spec)
    assert result.status == "ok", (result.error, log.read_text()[-2000:])
    check_breakdown(result.breakdown, 7)
    costs = result.run_costs
    assert set(costs) == {"checkpoint_s", "eval_s", "eval_batches"}
    assert costs["checkpoint_s"] > 0 and costs["eval_s"] > 0 and costs["eval_batches"] == 4
    # Only the trial's own files: request, result (the log lives beside them here).
    assert sorted(p.name for p in folder.iterdir()) == ["result.json", "result.request.json", "trial.log"]


def test_without_diagnose_or_with_zero_steps_there_is_no_breakdown(tmp_path, write_spec):
    plain, _, log = run_trial(tmp_path, write_spec, tiny_spec_dict(run_costs=RUN_COSTS), diagnose=False, name="plain")
    assert plain.status == "ok", (plain.error, log.read_text()[-2000:])
    assert plain.breakdown is None and plain.run_costs is None
    none, _, log = run_trial(tmp_path, write_spec, tiny_spec_dict(measure={"breakdown_steps": 0},
                                                                   run_costs={"checkpoint_every_steps": 50}), name="zero")
    assert none.status == "ok", (none.error, log.read_text()[-2000:])
    assert none.breakdown is None
    assert set(none.run_costs) == {"checkpoint_s"}


def test_a_failure_inside_the_profiled_window_keeps_the_measurement(tmp_path, write_spec):
    spec = tiny_spec_dict(model={"name": f"{PLANTED}:fails_when_profiled", "args": {}},
                          data={"name": f"{PLANTED}:fast_data", "args": {}})
    result, _, log = run_trial(tmp_path, write_spec, spec)
    assert result.status == "ok", (result.error, log.read_text()[-2000:])
    assert result.samples_per_s > 0 and result.windows
    assert result.breakdown is None
    text = log.read_text()
    assert "planted failure inside the profiled window" in text and "no breakdown" in text


def test_a_planted_input_bottleneck_shows_in_a_real_trial(tmp_path, write_spec):
    spec = tiny_spec_dict(data={"name": f"{PLANTED}:slow_data", "args": {"delay_s": 0.002}},
                          model={"name": f"{PLANTED}:small_model", "args": {}},
                          baseline={"batch_size": 16, "threads": 1, "num_workers": 0},
                          measure={"breakdown_steps": 6})
    result, _, log = run_trial(tmp_path, write_spec, spec)
    assert result.status == "ok", (result.error, log.read_text()[-2000:])
    check_breakdown(result.breakdown, 6)
    assert result.breakdown["shares"]["data_wait"] >= 0.5


def test_a_data_parallel_trial_reports_each_ranks_breakdown_and_the_slowest(tmp_path, write_spec):
    spec = tiny_spec_dict(distributed={"nproc_per_node": 2, "backend": "gloo"},
                          baseline={"batch_size": 16, "threads": 1, "grad_accum": 2},
                          run_costs=RUN_COSTS)
    result, folder, log = run_trial(tmp_path, write_spec, spec, timeout=300)
    assert result.status == "ok", (result.error, log.read_text()[-3000:])
    assert result.world_size == 2 and [p["rank"] for p in result.per_rank] == [0, 1]
    for entry in result.per_rank:
        check_breakdown(entry["breakdown"], result.window_steps)
        # The all-reduce of the gradients runs in backward: it is timed, on every rank.
        assert entry["breakdown"]["seconds"]["backward"] > 0
    top = result.breakdown
    assert top["rank"] in (0, 1)
    slowest = max(result.per_rank, key=lambda p: p["breakdown"]["wall_s"])
    assert top["rank"] == slowest["rank"]
    assert top["wall_s"] == slowest["breakdown"]["wall_s"] and top["shares"] == slowest["breakdown"]["shares"]
    # Rank 0 timed the run costs; no checkpoint file is left.
    assert result.run_costs["checkpoint_s"] > 0 and result.run_costs["eval_s"] > 0
    assert not [p.name for p in folder.iterdir() if p.suffix == ".pt"]
