"""What the win is worth: the run's hours and cost at both settings, the search's own cost, and when it pays back."""

from __future__ import annotations

import pytest

from trainopt.decide.batch import freeing_change, memory_edge, second_pass_possible
from trainopt.decide.run_costs import run_steps, run_worth, samples_per_step


def test_a_run_in_steps_priced_by_hand():
    # 10 samples a step at 100 samples/s: 0.1 s a step, 100,000 steps = 10,000 s = 2.78 h.
    w = run_worth({"steps": 100_000, "device_hour_cost": 2.5, "currency": "EUR"}, baseline_samples_per_s=100.0,
                  samples_per_step=10.0, dataset_len=None, speedup=2.0, ci=[1.6, 2.5], search_s=1800.0)
    assert w["basis"] == "run" and w["steps"] == 100_000
    assert w["baseline_hours"] == pytest.approx(10_000 / 3600)
    rec = w["recommended_hours"]
    # A higher speedup is a shorter run: the interval's ends swap.
    assert (rec["estimate"], rec["low"], rec["high"]) == pytest.approx((5000 / 3600, 4000 / 3600, 6250 / 3600))
    saved = w["saved_hours"]
    assert (saved["estimate"], saved["low"], saved["high"]) == pytest.approx((5000 / 3600, 3750 / 3600, 6000 / 3600))
    money = w["money"]
    assert money["currency"] == "EUR" and money["baseline"] == pytest.approx(10_000 / 3600 * 2.5)
    assert money["saved"]["estimate"] == pytest.approx(5000 / 3600 * 2.5)
    assert money["saved"]["low"] == pytest.approx(3750 / 3600 * 2.5)
    assert money["search"] == pytest.approx(0.5 * 2.5)
    # Each step saves 0.1 s x (1 - 1/2) = 0.05 s: 1,800 s of search after 36,000 steps.
    assert w["paid_back_after_steps"] == 36_000


def test_runs_in_hours_and_epochs_and_without_a_run_block():
    hours = run_worth({"hours": 10.0}, baseline_samples_per_s=50.0, samples_per_step=5.0, dataset_len=None,
                      speedup=1.25, ci=None, search_s=60.0)
    assert hours["baseline_hours"] == pytest.approx(10.0) and hours["recommended_hours"]["estimate"] == pytest.approx(8.0)
    assert hours["recommended_hours"]["low"] is None and hours["money"] is None
    assert hours["steps"] == pytest.approx(10 * 3600 * 50 / 5)
    epochs = run_worth({"epochs": 3}, baseline_samples_per_s=100.0, samples_per_step=10.0, dataset_len=1200,
                       speedup=None, ci=None, search_s=None)
    assert epochs["samples"] == 3600 and epochs["baseline_hours"] == pytest.approx(36 / 3600)
    assert epochs["recommended_hours"] is None and epochs["paid_back_after_steps"] is None
    # Epochs without a known data set length: per 1,000 steps, with the reason.
    unknown = run_worth({"epochs": 3, "device_hour_cost": 1.0}, baseline_samples_per_s=100.0, samples_per_step=10.0,
                        dataset_len=None, speedup=1.5, ci=[1.2, 1.8], search_s=10.0)
    assert unknown["basis"] == "per_steps" and unknown["steps"] == 1000 and unknown["money"] is None
    assert "data set's length" in unknown["note"]
    none = run_worth(None, baseline_samples_per_s=100.0, samples_per_step=10.0, dataset_len=None, speedup=0.9,
                     ci=[0.8, 1.0], search_s=10.0)
    assert none["basis"] == "per_steps" and none["money"] is None and none["paid_back_after_steps"] is None
    assert none["baseline_hours"] == pytest.approx(100 / 3600)
    assert run_worth(None, baseline_samples_per_s=None, samples_per_step=10.0, dataset_len=None, speedup=None,
                     ci=None, search_s=None) is None


def test_run_steps_for_the_compile_judgement():
    assert run_steps(None, None, None, None, 100_000) == 100_000
    assert run_steps({"steps": 500}, None, None, None, 100_000) == 500
    assert run_steps({"hours": 1.0}, 10.0, 100.0, None, 7) == 36_000
    assert run_steps({"epochs": 2}, 10.0, 100.0, 1000, 7) == 200
    assert run_steps({"epochs": 2}, 10.0, 100.0, None, 7) == 7
    assert samples_per_step({"batch_size": 8, "grad_accum": 4}, 2) == 64


def test_second_pass_conditions():
    assert second_pass_possible({"batch_size": {}, "amp": ["off", "bf16"]})
    assert second_pass_possible({"batch_size": {}, "num_workers": [0, 2]})
    assert not second_pass_possible({"batch_size": {}})
    assert not second_pass_possible({"amp": ["off", "bf16"]})
    assert memory_edge([{"size": 32, "fits": True}, {"size": 96, "fits": False, "status": "oom"},
                        {"size": 64, "fits": False, "status": "oom"}]) == 64
    # A crash is not a memory edge.
    assert memory_edge([{"size": 64, "fits": False, "status": "crashed"}]) is None
    mib = 2**20
    kept = {"knob": "amp", "kept": True, "from": "off", "to": "bf16", "before_peak_memory_bytes": 100 * mib}
    change = freeing_change([{**kept, "after_peak_memory_bytes": 94 * mib}])
    assert change["ratio"] == pytest.approx(0.94) and change["lowered"]
    # Under the threshold (a few per cent is noise between processes) it is the change, not shown lowering.
    assert freeing_change([{**kept, "after_peak_memory_bytes": 96 * mib}])["lowered"] is False
    assert freeing_change([{**kept, "kept": False, "after_peak_memory_bytes": 50 * mib}]) is None
    assert freeing_change([{**kept, "knob": "batch_size", "after_peak_memory_bytes": 50 * mib}]) is None
    best = freeing_change([{**kept, "after_peak_memory_bytes": 80 * mib},
                           {**kept, "knob": "compile", "to": "default", "after_peak_memory_bytes": 60 * mib}])
    assert best["knob"] == "compile"
    assert freeing_change([{**kept, "before_peak_memory_bytes": None, "after_peak_memory_bytes": None}])["ratio"] is None
