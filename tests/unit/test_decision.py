"""The compile judgement and the ETA count as pure functions."""

from __future__ import annotations

import pytest

from trainopt.decision import Decision, judge_compile
from trainopt.plan import remaining_trials


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
    search = {"amp": ["off", "bf16", "fp16"], "num_workers": [0, 2]}
    kw = dict(confirm_pairs=8, holdout_pairs=6, final_pairs=6, batch_candidates=4)
    # amp: incumbent + 2 candidates, 1.5 confirmations of 8 pairs, half a holdout of 6 pairs.
    amp = 3 + 1.5 * 16 + 0.5 * 12
    # num_workers: incumbent + 1 candidate, one confirmation.
    workers = 2 + 16 + 0.5 * 12
    assert remaining_trials(["amp", "num_workers"], search, **kw) == amp + workers + 12
    # batch_size: 8 probes, incumbent + 4 candidates.
    assert remaining_trials(["batch_size"], {"batch_size": {}}, **kw) == 8 + 5 + 1.5 * 16 + 0.5 * 12 + 12
    assert remaining_trials([], search, **kw) == 12
