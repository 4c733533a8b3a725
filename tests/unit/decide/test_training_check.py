"""The training check's rule: verdicts against a reference and its data-order twin, and which knobs it suspects."""

from __future__ import annotations

import math
import random

import pytest

from trainopt.decide import training_check as rule
from trainopt.knobs import catalog as knobs

STEPS = 40


def curve(seed: int, start: float = 2.3, end: float = 0.2, noise: float = 0.05, steps: int = STEPS) -> list[float]:
    """A falling loss with minibatch noise; ``seed`` is the data order."""
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-4.0 * k / steps) + noise * rng.gauss(0, 1) for k in range(steps)]


def test_a_run_in_the_references_order_with_low_order_bits_changed_trains_the_same():
    ref, twin = curve(0), curve(1)
    cand = [v * (1 + 1e-6) for v in ref]
    v = rule.judge(ref, twin, cand, STEPS)
    assert v.verdict == "same" and v.tail_steps == 10
    assert v.candidate_tail == pytest.approx(v.reference_tail, rel=1e-5)
    assert "within" in v.reason and f"{v.tolerance:.4g}" in v.reason


def test_a_run_that_stays_at_chance_trains_worse_and_the_reason_names_the_losses():
    ref, twin = curve(0), curve(1)
    cand = curve(0, start=2.3, end=2.3)
    v = rule.judge(ref, twin, cand, STEPS)
    assert v.verdict == "worse"
    assert f"{v.candidate_tail:.4g}" in v.reason and f"{v.reference_tail:.4g}" in v.reason and f"{v.twin_tail:.4g}" in v.reason


def test_a_non_finite_loss_is_diverged_and_so_is_a_blow_up():
    ref, twin = curve(0), curve(1)
    v = rule.judge(ref, twin, ref[:7] + [None], STEPS)
    assert v.verdict == "diverged" and "step 8 of 40" in v.reason
    blown = ref[:20] + [50.0 * (k + 1) for k in range(20)]
    assert rule.judge(ref, twin, blown, STEPS).verdict == "diverged"


def test_a_lower_loss_than_the_reference_is_not_a_failure():
    ref, twin = curve(0), curve(1)
    assert rule.judge(ref, twin, curve(0, end=0.01), STEPS).verdict == "same"


def test_without_a_trained_reference_or_twin_nothing_is_judged():
    ref, twin = curve(0), curve(1)
    assert rule.judge(ref[:5] + [None], twin, ref, STEPS).verdict == "inconclusive"
    assert rule.judge(ref, twin[:3], ref, STEPS).verdict == "inconclusive"


def test_the_yardstick_is_the_twins_distance_or_the_step_noise_whichever_is_larger():
    ref = curve(0)
    # A twin that lands on the reference by chance leaves the step noise as the yardstick.
    v = rule.judge(ref, list(ref), ref, STEPS)
    assert v.twin_gap == 0 and v.yardstick == v.noise_floor > 0
    # A twin far from the reference widens it.
    far = [x + 0.3 for x in curve(1)]
    w = rule.judge(ref, far, ref, STEPS)
    assert w.yardstick == pytest.approx(w.twin_gap) and w.twin_gap > 0.25
    assert w.tolerance == pytest.approx(max(rule.TOLERANCE_FACTOR * w.yardstick, rule.RELATIVE_FLOOR * w.reference_tail))
    # Just inside and just outside the tolerance.
    inside = [x + 0.99 * w.tolerance for x in ref]
    outside = [x + 1.01 * w.tolerance for x in ref]
    assert rule.judge(ref, far, inside, STEPS).verdict == "same"
    assert rule.judge(ref, far, outside, STEPS).verdict == "worse"


def test_a_smooth_noiseless_curve_keeps_the_relative_floor():
    ref = [2.0 * math.exp(-k / 10) + 0.5 for k in range(STEPS)]
    v = rule.judge(ref, list(ref), [x * 1.015 for x in ref], STEPS)
    assert v.noise_floor == pytest.approx(0.0, abs=1e-3) and v.verdict == "same"
    assert rule.judge(ref, list(ref), [x * 1.05 for x in ref], STEPS).verdict == "worse"


@pytest.mark.parametrize("steps,tail", [(8, 5), (20, 5), (21, 6), (40, 10), (1000, 250)])
def test_the_tail_is_a_quarter_of_the_run_and_never_under_five_steps(steps, tail):
    assert rule.tail_steps(steps) == tail


def test_the_reference_takes_the_recommended_batch_and_nothing_else():
    base = knobs.default_settings()
    rec = {**base, "batch_size": 128, "grad_accum": 2, "amp": "bf16", "num_workers": 2}
    ref = rule.reference_settings(base, rec)
    assert ref == {**base, "batch_size": 128, "grad_accum": 2}


def test_suspects_are_the_changed_knobs_that_can_change_the_numbers():
    base = knobs.default_settings()
    rec = {**base, "batch_size": 128, "amp": "bf16", "num_workers": 2, "compile": "default", "sync_every": 0}
    assert rule.suspects(rule.reference_settings(base, rec), rec) == ["amp", "compile"]
    # Only loader knobs changed: they are all that can explain a failure.
    only_loader = {**base, "num_workers": 2, "persistent_workers": True}
    assert rule.suspects(base, only_loader) == ["num_workers", "persistent_workers"]


def test_every_knob_says_whether_it_can_change_the_numbers():
    assert {k for k, knob in knobs.KNOBS.items() if not knob.numerics} == {
        "num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "sync_every", "ddp_find_unused_parameters"}


def test_dropping_a_knob_puts_it_back_at_the_references_value():
    base = knobs.default_settings()
    rec = {**base, "batch_size": 64, "amp": "bf16", "channels_last": True}
    out = rule.without(rec, rule.reference_settings(base, rec), ["amp"])
    assert out == {**rec, "amp": "off"}
