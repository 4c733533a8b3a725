"""Session decisions as pure functions: round order, fallback, per-arm classification, results."""

from __future__ import annotations

import math
import signal

import pytest

from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult
from trainopt.decide.session_plan import (
    arm_preload,
    arm_result,
    fallback_reason,
    round_orders,
    sequential_order,
    start_order,
    window_timeout,
)
from trainopt.execute.arm_handles import classify_reply
from trainopt.execute.session_runners import SequentialSessionRunner
from trainopt.stats.intervals import steady_state

GiB = 2**30


def _request(tag: str = "a") -> TrialRequest:
    return TrialRequest(spec={"measure": {"windows": 4}}, source_dir=".", settings={"tag": tag}, mode="measure",
                        result_path=f"/nonexistent/{tag}.json")


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_round_runs_every_arm_once_and_blocks_balance_positions(n):
    orders = round_orders(n, 4 * n + 1, seed=7)
    assert len(orders) == 4 * n + 1
    for order in orders:
        assert sorted(order) == list(range(n))
    for block in range(4):
        rows = orders[block * n:(block + 1) * n]
        for position in range(n):
            # Within a block each arm takes each position exactly once.
            assert sorted(row[position] for row in rows) == list(range(n))


def test_round_orders_are_seeded_and_vary_with_the_seed():
    assert round_orders(3, 9, seed=1) == round_orders(3, 9, seed=1)
    assert len({str(round_orders(3, 9, seed=s)) for s in range(10)}) > 1
    # Two arms: who goes first is not fixed within a block.
    firsts = [o[0] for o in round_orders(2, 40, seed=3)]
    assert firsts.count(0) == firsts.count(1) == 20


def test_start_order_is_a_seeded_permutation_that_gives_no_arm_a_fixed_place():
    assert sorted(start_order(3, 7)) == [0, 1, 2]
    assert start_order(3, 7) == start_order(3, 7)
    # Two arms: the incumbent (arm 0) starts first in about half of the sessions.
    first = [start_order(2, seed)[0] for seed in range(2000)]
    assert 900 < first.count(0) < 1100
    # Three arms: every arm takes every start position about equally often.
    counts = [[0] * 3 for _ in range(3)]
    for seed in range(3000):
        for position, arm in enumerate(start_order(3, seed)):
            counts[arm][position] += 1
    assert all(850 < c < 1150 for row in counts for c in row), counts
    # A stream of its own: the start order does not follow the first round's order.
    same = sum(start_order(2, s) == round_orders(2, 1, s)[0] for s in range(2000))
    assert 900 < same < 1100


def test_sequential_order_is_a_seeded_permutation():
    assert sorted(sequential_order(6, 2)) == list(range(6))
    assert sequential_order(6, 2) == sequential_order(6, 2)
    assert len({tuple(sequential_order(6, s)) for s in range(20)}) > 1


def test_arms_that_fit_together_stay_interleaved():
    assert fallback_reason("cpu", [None, None], [2 * GiB, 3 * GiB], 16 * GiB) is None
    assert fallback_reason("cuda", [None, None, None], [10 * GiB] * 3, 80 * GiB) is None


def test_arms_that_do_not_fit_fall_back_with_the_figures_in_the_note():
    cuda = fallback_reason("cuda", [None, None], [40 * GiB, 40 * GiB], 80 * GiB)
    assert cuda and "device memory" in cuda and "80.00 GiB" in cuda
    cpu = fallback_reason("cpu", [None, None], [6 * GiB, 6 * GiB], 16 * GiB)
    assert cpu and "host RAM" in cpu and "12.00 GiB" in cpu


def test_a_cuda_out_of_memory_next_to_other_arms_falls_back_but_a_cpu_one_does_not():
    assert fallback_reason("cuda", [None, "oom"], [GiB, None], 80 * GiB)
    # On CPU each arm has its own address-space cap: its oom is its own.
    assert fallback_reason("cpu", [None, "oom"], [GiB, None], 16 * GiB) is None
    # Only failed or single arms: nothing to co-reside.
    assert fallback_reason("cpu", [None, "crashed"], [100 * GiB, None], 16 * GiB) is None
    assert fallback_reason(None, ["error", "error"], [None, None], None) is None


def test_window_timeout_bounds():
    assert window_timeout(300, 0.5) == 30
    assert window_timeout(300, 5) == 100
    assert window_timeout(10, 5) == 10


def test_replies_are_classified_per_arm():
    assert classify_reply({"kind": "window"}, timed_out=False, returncode=None, timeout_s=5, what="window 1") is None
    status, error = classify_reply(None, timed_out=True, returncode=None, timeout_s=5, what="window 2")
    assert status == "timeout" and "window 2" in error and "5 s" in error
    status, error = classify_reply(None, timed_out=False, returncode=-signal.SIGSEGV, timeout_s=5, what="warm-up")
    assert status == "crashed" and "SIGSEGV" in error and "warm-up" in error
    status, error = classify_reply(None, timed_out=False, returncode=3, timeout_s=5, what="warm-up")
    assert status == "crashed" and "code 3" in error
    assert classify_reply({"kind": "failed", "status": "nonfinite", "error": "the training loss became nan"},
                          timed_out=False, returncode=None, timeout_s=5, what="x") == ("nonfinite", "the training loss became nan")


def _window(samples, elapsed, wait=0.0, steps=10):
    return {"kind": "window", "elapsed_s": elapsed, "steps": steps, "samples": samples, "data_wait_s": wait,
            "last_loss": 0.5}


def test_arm_result_keeps_the_steady_windows():
    ready = {"window_steps": 10, "warmup_s": 2.0, "compile_s": None, "first_step_s": 0.1, "first_loss": 2.3,
             "dataset_len": 512, "peak_memory_bytes": 123, "env": {"torch": "x"}}
    # A slow first window (a transient), then steady ones of 100 samples in ~1 s.
    times = [3.0, 1.0, 1.02, 0.98, 1.01, 0.99, 1.0]
    windows = [_window(100, t, wait=0.1 * t) for t in times]
    r = arm_result(_request(), ready, windows, {"peak_memory_bytes": 456, "steps": 90}, None)
    assert r.ok and r.windows == pytest.approx([100 / t for t in times])
    cut = steady_state(r.windows)
    assert r.steady_from == cut.start >= 1 and r.steady == cut.steady
    kept = times[cut.start:]
    assert r.samples_per_s == pytest.approx(100 * len(kept) / sum(kept))
    assert r.step_time_s == pytest.approx(sum(kept) / (10 * len(kept)))
    assert r.data_wait_fraction == pytest.approx(0.1)
    assert r.peak_memory_bytes == 456 and r.steps == 90 and r.env == {"torch": "x"} and r.dataset_len == 512
    assert r.median == pytest.approx(100.0, rel=0.02)


def test_a_failed_arm_keeps_its_status_and_windows_but_no_throughput():
    r = arm_result(_request(), {"window_steps": 10}, [_window(100, 1.0)], None, ("nonfinite", "loss became nan"))
    assert r.status == "nonfinite" and r.error == "loss became nan" and r.samples_per_s is None
    assert len(r.windows) == 1
    assert arm_result(_request(), None, [], None, ("crashed", "killed by SIGSEGV")).status == "crashed"
    assert arm_result(_request(), {"window_steps": 1}, [], None, None).status == "error"


def test_ratio_is_none_when_either_arm_failed():
    ok = TrialResult(status="ok", samples_per_s=200.0)
    ok2 = TrialResult(status="ok", samples_per_s=100.0)
    bad = TrialResult(status="crashed")
    s = SessionResult(arms=[ok, ok2, bad], mode="interleaved")
    assert s.ratio(0, 1) == 2.0 and s.ratio(1, 0) == 0.5
    assert s.ratio(0, 2) is None and s.ratio(2, 0) is None


class _RecordingRunner:
    def __init__(self):
        self.calls = []

    def run(self, request, log_path, timeout_s):
        self.calls.append((request.settings["tag"], str(log_path), timeout_s))
        return TrialResult(status="ok", settings=request.settings, samples_per_s=float(len(self.calls)))


def test_sequential_session_runs_arms_in_a_seeded_order_and_returns_them_in_request_order(tmp_path):
    runner = _RecordingRunner()
    requests = [_request(t) for t in "abcd"]
    logs = [tmp_path / f"{t}.log" for t in "abcd"]
    result = SequentialSessionRunner(runner).run_session(requests, logs, 12.0, seed=5)
    order = sequential_order(4, 5)
    assert [c[0] for c in runner.calls] == ["abcd"[i] for i in order]
    assert all(c[2] == 12.0 for c in runner.calls)
    assert [a.settings["tag"] for a in result.arms] == list("abcd")
    assert result.mode == "sequential" and result.rounds == 0 and result.order == [order]
    assert result.wall_s is not None and not math.isnan(result.wall_s)
    # The arm that ran k-th got the k-th figure from the recording runner.
    for k, i in enumerate(order):
        assert result.arms[i].samples_per_s == k + 1


def test_hopeless_arms_are_those_far_below_the_incumbent_in_every_window_so_far():
    from trainopt.decide.session_plan import FIRST_WINDOW_FAST, HOPELESS, hopeless_arms

    one = HOPELESS / FIRST_WINDOW_FAST
    # After one window: only below HOPELESS / FIRST_WINDOW_FAST of the incumbent's first.
    assert hopeless_arms([[100.0], [30.0], [40.0], [200.0], []]) == [1]
    assert hopeless_arms([[100.0], [100 * one], [100 * one - 0.01]]) == [2]
    # After two: the arm's fastest window against the incumbent's slowest.
    assert hopeless_arms([[150.0, 100.0], [45.0, 49.0], [45.0, 51.0]]) == [1]
    # The incumbent never stops, and without its figure no arm is judged.
    assert hopeless_arms([[], [1.0], [2.0]]) == []
    assert hopeless_arms([[10.0]]) == []
    assert hopeless_arms([]) == []


def test_rewarm_steps_are_kept_for_short_steps_and_dropped_for_long_ones():
    from trainopt.trial.arm import REWARM_SHARE, rewarm_for

    assert rewarm_for(0.05, 0.5, 1) == 1
    assert rewarm_for(0.45, 0.5, 1) == 0
    assert rewarm_for(REWARM_SHARE * 0.5, 0.5, 2) == 2
    assert rewarm_for(REWARM_SHARE * 0.5 + 0.01, 0.5, 1) == 0
    assert rewarm_for(1.2, 0.5, 1) == 0
    assert rewarm_for(0.01, 0.5, 0) == 0


def test_millisecond_steps_rewarm_for_a_minimum_time_within_the_share():
    from trainopt.trial.arm import REWARM_MIN_S, REWARM_SHARE, rewarm_for

    # A 1 ms step: one step would re-warm for 1 ms; the re-warm covers REWARM_MIN_S instead.
    steps = rewarm_for(0.001, 2.0, 1)
    assert steps * 0.001 >= REWARM_MIN_S and steps * 0.001 <= REWARM_SHARE * 2.0
    # A short window caps it at its share.
    assert rewarm_for(0.001, 0.1, 1) == int(REWARM_SHARE * 0.1 / 0.001)
    # The CPU demo's 60 ms step keeps its single re-warm step.
    assert rewarm_for(0.06, 0.5, 1) == 1


def test_only_a_compiled_arm_asks_the_fork_server_for_the_compiler():
    from trainopt.contract.boundary import COMPILER_PRELOAD as COMPILER

    def request(compile_value):
        return TrialRequest(spec={}, source_dir=".", settings={"compile": compile_value}, mode="measure",
                            result_path="r.json", trial_id="t")

    assert arm_preload(request("off")) == ()
    assert arm_preload(request("default")) == COMPILER == ("torch._inductor.compile_fx",)
    assert arm_preload(request("max-autotune")) == COMPILER
