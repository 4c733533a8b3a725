"""The compile judgement and the ETA count as pure functions."""

from __future__ import annotations

import pytest

from trainopt.decide.plan import remaining_trials
from trainopt.decide.verdict import Decision, judge_compile


def improved():
    return Decision(knob="compile", stage="compile", from_value="off", to_value="default", verdict="improved", reason="1.3x")


@pytest.mark.parametrize("run_length,verdict", [(4000, "inconclusive"), (6000, "improved")])
def test_compile_is_kept_only_when_it_repays_within_the_run_length(run_length, verdict):
    # 0.1 s per step at the interval's lower bound 1.25 saves 0.02 s per step: 100 s repay after 5,000 steps.
    d = improved()
    judge_compile(d, compile_s=100.0, incumbent_step_s=0.1, low=1.25, run_length_steps=run_length)
    assert d.verdict == verdict
    assert d.extra["break_even_steps"] == pytest.approx(5000.0)
    assert d.extra["compile_s"] == 100.0 and d.extra["run_length_steps"] == run_length
    if verdict == "inconclusive":
        assert d.reason == "1.3x; compile takes 100.0 s and repays it only after 5,000 steps, beyond run_length_steps 4,000"


def test_compile_without_a_confirmed_gain_never_repays():
    d = improved()
    judge_compile(d, compile_s=1.0, incumbent_step_s=0.1, low=0.99, run_length_steps=10**9)
    assert d.verdict == "inconclusive" and d.extra["break_even_steps"] is None
    assert "only after never steps" in d.reason


def test_remaining_trials_counts_screens_confirmations_holdouts_and_the_final_check():
    from trainopt.decide.plan import remaining_in_knob

    search = {"amp": ["off", "bf16", "fp16"], "num_workers": [0, 2], "pin_memory": [False, True],
              "compile": ["off", "default", "max-autotune"]}
    kw = dict(confirm_pairs=8, holdout_pairs=6, final_pairs=6, batch_candidates=4)
    # amp: incumbent + 2 candidates in the screen (1.4 arms each), the typical 0.8 confirmations
    # of 8 pairs, 0.36 of a holdout of 6 pairs.
    amp = 3 * 1.4 + 0.8 * 16 + 0.36 * 12
    # num_workers: incumbent + 1 candidate, and at most one confirmation for one candidate.
    workers = 2 * 1.4 + 0.8 * 16 + 0.36 * 12
    assert remaining_trials(["amp", "num_workers"], search, **kw) == pytest.approx(amp + workers + 12)
    # A knob that cannot apply on this device runs nothing.
    assert remaining_trials(["amp", "pin_memory"], search, skip=["pin_memory"], **kw) == pytest.approx(amp + 12)
    # batch_size: its probes (1.8 arms each), incumbent + 4 candidates.
    assert remaining_trials(["batch_size"], {"batch_size": {}}, batch_probes=4, **kw) == pytest.approx(
        4 * 1.8 + 5 * 1.4 + 0.8 * 16 + 0.36 * 12 + 12)
    assert remaining_trials([], search, **kw) == 12
    # The final check's pairs may be an expected, fractional count.
    assert remaining_trials([], search, **{**kw, "final_pairs": 1.5}) == 3
    # compile: a compiled arm at 2.6 plain arms, the incumbent plain; one cold-compile trial (14 arms)
    # per compiled candidate; the final check's candidate compiles if compile is kept (0.36 of the time).
    pair = 1 + 2.6
    assert remaining_trials(["compile"], search, **kw) == pytest.approx(
        1.4 + 2 * 2.6 + (0.8 * 8 + 0.36 * 6) * pair + 2 * 14 + 6 * (1 + 1 + 0.36 * 1.6))
    # Once compile is adopted every later arm compiles, the final check's candidate arm too.
    on = {"compile": "default"}
    assert remaining_trials(["num_workers"], search, incumbent=on, **kw) == pytest.approx(
        2.6 * 2 + 2.6 * (0.8 * 16 + 0.36 * 12) + 6 * (1 + 2.6))
    assert remaining_trials([], search, incumbent=on, baseline=on, **kw) == pytest.approx(6 * 2 * 2.6)
    # After a screen: nothing selected leaves nothing; two selected, the second three times in four.
    assert remaining_in_knob(0, confirm_pairs=8, holdout_pairs=6) == 0
    assert remaining_in_knob(1, confirm_pairs=8, holdout_pairs=6) == 16 + 0.5 * 12
    assert remaining_in_knob(2, confirm_pairs=8, holdout_pairs=6) == 1.75 * 16 + 0.5 * 12
    assert remaining_in_knob(1, confirm_pairs=8, holdout_pairs=6, pair_cost=pair) == pytest.approx(pair * (8 + 0.5 * 6))
    # After a kept change, each held-out session also runs the baseline.
    assert remaining_in_knob(1, confirm_pairs=8, holdout_pairs=6, third_arm=1.0) == 16 + 0.5 * 6 * 3


def test_the_whole_search_counts_the_final_check_only_as_far_as_it_is_expected_to_run():
    from trainopt.decide.plan import arm_cost, kept_states, search_remaining

    search = {"amp": ["off", "bf16"], "num_workers": [0, 2]}
    order = ["amp", "num_workers"]
    base = {"batch_size": 32, "amp": "off", "num_workers": 0}
    kept = {**base, "amp": "bf16"}
    kw = dict(confirm_pairs=8, holdout_pairs=6, final_pairs=6, batch_candidates=4, baseline=base)
    # num_workers' screen (incumbent + 1 candidate at 1.4 arms) and its typical confirmations.
    knob = 2 * 1.4 + 0.8 * 16
    # The recommended settings' diagnosis trial, run once some change is kept.
    diag = arm_cost(kept, "diagnosis")
    # Nothing kept and no knob left: no final check and no diagnosis trial at all.
    assert search_remaining(order, 2, search, incumbent=base, **kw) == 0
    # Nothing kept, one knob left: a change kept there (0.36) is the first, so it measures no
    # held-out sessions then; its six two-arm ones come at the end and are the final check.
    assert search_remaining(order, 1, search, incumbent=base, **kw) == pytest.approx(knob + 0.36 * 6 * 2 + 0.36 * diag)
    # One change kept and settled, 6 reusable pairs: if the last knob keeps another change, its
    # held-out sessions run the baseline as a third arm and are the final check.
    assert search_remaining(order, 1, search, incumbent=kept, reusable=6, **kw) == pytest.approx(knob + 0.36 * 6 * 3 + diag)
    # One change kept, its held-out pairs still owed: measured by the last knob's three-arm
    # held-out sessions if it keeps a change, else at the end (two arms).
    assert search_remaining(order, 1, search, incumbent=kept, pending=True, **kw) == pytest.approx(
        knob + 0.36 * 6 * 3 + 0.64 * 6 * 2 + diag)
    assert search_remaining(order, 2, search, incumbent=kept, pending=True, **kw) == pytest.approx(12 + diag)
    assert search_remaining(order, 2, search, incumbent=kept, reusable=6, **kw) == pytest.approx(diag)
    # Kept, with nothing reusable (a third arm failed): the final check's 6 pairs are sure.
    assert search_remaining(order, 2, search, incumbent=kept, **kw) == pytest.approx(12 + diag)
    # A final check of 8 pairs measures the 2 beyond the held-out ones itself.
    assert search_remaining(order, 2, search, incumbent=kept, reusable=6, **{**kw, "final_pairs": 8}) == pytest.approx(4 + diag)
    assert search_remaining(order, 1, search, incumbent=base, **{**kw, "final_pairs": 8}) == pytest.approx(
        knob + 0.36 * 8 * 2 + 0.36 * diag)
    # After the last knob's screen selected one candidate: its confirmation now, and at half
    # the held-out pairs of the first kept change at the end, and the diagnosis trial as often.
    after = search_remaining(order, 1, search, incumbent=base, selected=1, **kw)
    assert after == pytest.approx(2 * 8 + 0.5 * 6 * 2 + 0.5 * diag)
    assert search_remaining(order, 1, search, incumbent=base, selected=0, **kw) == 0
    # A knob expected to confirm nothing (its gain bounded below the margin) costs its screen only.
    assert search_remaining(order, 1, search, incumbent=base, screen_only=["num_workers"], **kw) == pytest.approx(2 * 1.4)
    assert search_remaining(order, 0, search, incumbent=base, screen_only=["num_workers"], **kw) == pytest.approx(
        2 * 1.4 + 0.8 * 16 + 2 * 1.4 + 0.36 * 6 * 2 + 0.36 * diag)
    # The three situations (none kept, first kept and owed, settled) over two knobs at 0.5 each.
    assert kept_states((1.0, 0.0, 0.0), [0.5, 0.5]) == [(1.0, 0.0, 0.0), (0.5, 0.5, 0.0), (0.25, 0.5, 0.25)]


def test_the_batch_stage_is_expected_to_probe_the_maximum_alone_or_double_and_bisect_where_memory_runs_out():
    from trainopt.decide.plan import (
        TYPICAL_BISECTION_PROBES,
        memory_bound,
        typical_batch_probes,
    )

    assert typical_batch_probes(32, 256, memory_bound=False) == 1  # 256 first, and it fits
    assert typical_batch_probes(32, 1000, memory_bound=False) == 1
    assert typical_batch_probes(32, 32, memory_bound=False) == 1
    assert typical_batch_probes(32, 256, memory_bound=True) == 4 + TYPICAL_BISECTION_PROBES  # 32, 64, 128, 256
    assert typical_batch_probes(32, 1000, memory_bound=True) == 6 + TYPICAL_BISECTION_PROBES  # 32 ... 512, 1000
    assert memory_bound("cuda", None) and memory_bound("cpu", 2.0) and memory_bound(None, 2.0)
    assert not memory_bound("cpu", None)


def test_a_compiled_arm_costs_more_than_a_plain_one_and_the_cold_compile_trial_most():
    from trainopt.decide.plan import arm_cost

    plain, compiled = arm_cost({"compile": "off"}), arm_cost({"compile": "max-autotune"})
    assert plain == 1.0 and compiled == 2.6 and arm_cost(None) == 1.0
    assert arm_cost({"compile": "default"}, role="cold-compile") == 14.0
    # One-shot trials and screen arms cost more than a plain confirmation arm; a compiled arm
    # costs what it costs whatever its role.
    assert arm_cost(None, "baseline") == 2.4 and arm_cost(None, "probe") == 1.8 and arm_cost(None, "screen") == 1.4
    # The diagnosis trial of the recommended settings is a one-shot diagnosed process like the baseline's.
    assert arm_cost(None, "diagnosis") == arm_cost(None, "baseline")
    assert arm_cost({"compile": "default"}, "screen") == 2.6 and arm_cost(None, "confirm") == 1.0


def test_typical_confirmation_pairs_lie_between_the_first_look_and_the_budget():
    from trainopt.decide.sequential import SequentialRule, typical_pairs

    rule = SequentialRule(6, 14, 0.95, 0.03, "hodges-lehmann", family=2)
    first = rule.next_look(0)
    assert first < 14
    assert typical_pairs(rule, 14) == -(-(first + 14) // 2)


def test_the_eta_prices_the_remaining_trials_at_the_recent_trials_cost():
    import io
    from types import SimpleNamespace

    from trainopt.search.progress import ConsoleProgress

    progress = ConsoleProgress(quiet=True, stream=io.StringIO())
    progress.set_remaining(40)
    for wall in [1.0] * 20 + [4.0] * ConsoleProgress.RECENT:
        progress.trial_finished(SimpleNamespace(samples_per_s=1.0, error=None, status="ok", wall_s=wall))
    # 40 - 36 finished = 4 left, each at the recent 4 s (the early 1 s arms no longer count).
    assert progress.remaining == 4
    assert progress._eta() == 16.0


def test_eta_is_unknown_until_the_search_says_how_many_trials_remain():
    import io
    from types import SimpleNamespace

    from trainopt.search.progress import ConsoleProgress

    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream)
    # The baseline trial ends before the plan is known: no "ETA 0s" for it.
    progress.trial_finished(SimpleNamespace(samples_per_s=5.0, error=None, status="ok", wall_s=3.0))
    assert progress._eta() is None
    assert "(ETA ?)" in stream.getvalue()
    progress.set_remaining(10)
    assert progress._eta() == 30.0


def test_dearer_arms_count_down_by_their_cost_and_do_not_raise_the_plain_price():
    import io
    from types import SimpleNamespace

    from trainopt.search.progress import ConsoleProgress

    progress = ConsoleProgress(quiet=True, stream=io.StringIO())
    progress.set_remaining(30)
    for _ in range(4):
        progress.trial_finished(SimpleNamespace(samples_per_s=1.0, error=None, status="ok", wall_s=2.0))
    # A cold-compile trial priced at 10 arms took 25 s: 2.5 s per plain arm.
    progress.trial_finished(SimpleNamespace(samples_per_s=1.0, error=None, status="ok", wall_s=25.0), cost=10.0)
    # Compile arms at 1.7 took 3.4 s each: 2 s per plain arm, as before.
    for _ in range(4):
        progress.trial_finished(SimpleNamespace(samples_per_s=1.0, error=None, status="ok", wall_s=3.4), cost=1.7)
    progress.trial_reused(cost=1.7)
    left = 30 - 4 - 10 - 5 * 1.7
    assert progress.remaining == pytest.approx(left)
    assert progress._eta() == pytest.approx(left * 2.0)


def test_one_very_slow_arm_does_not_set_the_price_of_the_rest():
    import io
    from types import SimpleNamespace

    from trainopt.search.progress import ConsoleProgress

    progress = ConsoleProgress(quiet=True, stream=io.StringIO())
    progress.set_remaining(20)
    for wall in [2.0] * 9 + [40.0]:
        progress.trial_finished(SimpleNamespace(samples_per_s=1.0, error=None, status="ok", wall_s=wall))
    assert progress._eta() == 10 * 2.0


def test_the_loader_wait_bounds_what_loader_workers_can_gain_from_none():
    from trainopt.decide.plan import loader_gain_bound

    base = {"num_workers": 0}
    # Twice the measured wait: at 1 % the loop could lose at most 2 % of its step.
    assert loader_gain_bound("num_workers", base, 0.01) == pytest.approx(1 / 0.98)
    assert loader_gain_bound("num_workers", base, 0.0) == 1.0
    assert loader_gain_bound("num_workers", base, 0.6) == pytest.approx(100.0)
    # No bound where the wait was not measured, from an incumbent that already has workers, or
    # for loader knobs that act where a window need not see it.
    assert loader_gain_bound("num_workers", base, None) is None
    assert loader_gain_bound("num_workers", {"num_workers": 2}, 0.01) is None
    for knob in ("pin_memory", "persistent_workers", "prefetch_factor", "amp"):
        assert loader_gain_bound(knob, base, 0.01) is None


def test_reduced_precision_on_a_cpu_without_bf16_instructions_is_expected_to_confirm_nothing():
    from trainopt.decide.plan import expected_to_confirm_nothing

    amp = ["off", "bf16"]
    assert expected_to_confirm_nothing("amp", "cpu", ["avx2", "fma"], amp)
    assert expected_to_confirm_nothing("amp", "cpu", [], ["off", "bf16", "fp16"])
    # bf16 units, a GPU, unknown flags, or another knob: the usual expectation.
    assert not expected_to_confirm_nothing("amp", "cpu", ["avx2", "avx512_bf16"], amp)
    assert not expected_to_confirm_nothing("amp", "cpu", ["amx_bf16"], amp)
    assert not expected_to_confirm_nothing("amp", "cuda", [], amp)
    assert not expected_to_confirm_nothing("amp", "cpu", None, amp)
    assert not expected_to_confirm_nothing("compile", "cpu", [], ["off", "default"])


def test_a_confirmation_past_a_look_is_counted_from_where_it_stands():
    from trainopt.decide.plan import (
        CONTINUE_SHARE,
        confirmation_left,
        remaining_in_knob,
    )

    looks = [6, 9, 14]
    # Past the first look: 3 pairs are certain, the last look's 5 only at CONTINUE_SHARE.
    assert confirmation_left(6, 9, looks) == pytest.approx(3 + CONTINUE_SHARE * 5)
    assert confirmation_left(9, 14, looks) == 5
    assert confirmation_left(0, 6, looks) == pytest.approx(6 + CONTINUE_SHARE * 3 + CONTINUE_SHARE**2 * 5)
    # In the knob: this confirmation, the second candidate's at its usual share, the held-out pairs.
    kw = dict(confirm_pairs=10, holdout_pairs=6, pair_cost=2.0)
    assert remaining_in_knob(2, confirming=(0, 9, 14, looks), **kw) == pytest.approx(2 * (5 + 0.75 * 10) + 0.5 * 6 * 2)
    assert remaining_in_knob(2, confirming=(1, 9, 14, looks), **kw) == pytest.approx(2 * 5 + 0.5 * 6 * 2)
