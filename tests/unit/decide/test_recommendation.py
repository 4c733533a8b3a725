"""Which settings are recommended: every kept change, unless the final check contradicts them."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy.stats import binom

from trainopt.decide.recommendation import (
    CONTRADICTION_LEVEL,
    SOURCES,
    check_claim,
    claim_sentence,
    claimed_speedup,
    final_pairs,
    pooled_pair_sd,
    recommend,
)
from trainopt.decide.verdict import Decision
from trainopt.knobs import catalog as knobs
from trainopt.stats import ranks

BASE = knobs.default_settings()


def kept(knob, old, new, speedup, extra=None, low=None):
    extra = dict(extra or {})
    extra.setdefault("decision_interval", {"speedup": speedup, "ci": [low or speedup - 0.1, speedup + 0.1], "n_pairs": 14})
    return Decision(knob=knob, stage="x", from_value=old, to_value=new, verdict="improved", kept=True,
                    speedup=speedup, ci=[speedup - 0.1, speedup + 0.1], n_pairs=6, after_samples_per_s=100 * speedup,
                    extra=extra)


def final(settings, contradicted, speedup=1.1, verdict="inconclusive"):
    return {"settings": settings, "verdict": verdict, "reason": f"{verdict} reason", "speedup": speedup,
            "ci": [speedup - 0.05, speedup + 0.05], "n_pairs": 8, "samples_per_s": 123.0, "contradicted": contradicted}


AMP = {**BASE, "amp": "bf16"}
BOTH = {**AMP, "num_workers": 2}
DECISIONS = [kept("amp", "off", "bf16", 1.5), kept("num_workers", 0, 2, 1.2)]


def test_a_final_check_that_does_not_contradict_keeps_every_change_with_its_own_figure():
    # Not "improved" by its own 8 pairs, yet no contradiction: both confirmed changes stay.
    r = recommend(BASE, 100.0, DECISIONS, final(BOTH, False, 1.8))
    assert (r.source, r.settings, r.speedup, r.ci, r.samples_per_s, r.n_pairs) == ("final-check", BOTH, 1.8, [1.75, 1.85], 123.0, 8)
    assert "does not contradict" in r.reason


def test_the_claim_sentence_says_the_test_in_plain_words():
    kept_two = check_claim([math.log(1.3)] * 4 + [math.log(1.2)] * 4, 1.1).to_dict()
    assert claim_sentence(kept_two, single=False) == (
        "fresh pairs do not show the combination slower than the 1.100x its changes claim together "
        "(the product of their confirmed lower bounds)")
    slow = check_claim([math.log(0.9), math.log(0.92), math.log(0.95), math.log(0.91), math.log(0.93), math.log(0.94)], 1.03)
    assert slow.contradicted
    text = claim_sentence(slow.to_dict(), single=True)
    assert text.startswith("fresh pairs show the change slower than the 1.030x margin a single change must clear: at most ")
    assert text.endswith(f"x with {100 * (1 - slow.level):.0f} % confidence") and "upper bound" not in text
    assert claim_sentence({"claim": 1.03, "upper": None, "level": 0.0, "contradicted": False}, single=True) == (
        "too few fresh pairs to test the change against the 1.030x margin a single change must clear")


def test_a_contradicting_final_check_falls_back_to_the_first_kept_change():
    r = recommend(BASE, 100.0, DECISIONS, final(BOTH, True, 0.99, "equivalent"))
    assert (r.source, r.settings, r.speedup, r.ci, r.samples_per_s) == ("first-kept-change", AMP, 1.5, [1.4, 1.6], 150.0)
    assert r.reason.startswith("the final check of the combined settings said equivalent;")
    assert "equivalent reason" not in r.reason  # the final check's own line gives its reason, once


def test_the_only_kept_change_contradicted_by_its_final_check_leaves_the_baseline():
    r = recommend(BASE, 100.0, DECISIONS[:1], final(AMP, True, 0.99, "regressed"))
    assert (r.source, r.settings, r.speedup, r.ci, r.samples_per_s) == ("baseline", BASE, 1.0, None, 100.0)


def test_the_only_kept_change_stands_on_an_uncontradicted_final_check_reaching_below_one():
    # A 6-pair interval spans about the smallest to the largest pair: 1.137x [0.942, 1.372]
    # does not contradict a change confirmed at 1.05x or more.
    check = {**final(AMP, False, 1.137), "ci": [0.942, 1.372], "n_pairs": 6}
    r = recommend(BASE, 100.0, DECISIONS[:1], check)
    assert (r.source, r.settings, r.speedup, r.ci, r.n_pairs) == ("final-check", AMP, 1.137, [0.942, 1.372], 6)


def test_a_first_change_contradicted_by_its_own_held_out_pairs_is_not_the_fallback():
    held = {"speedup": 0.97, "ci": [0.9, 1.05], "n_pairs": 6,
            "check": {"claim": 1.4, "upper": 1.02, "level": 0.047, "contradicted": True, "n_pairs": 6}}
    first = kept("amp", "off", "bf16", 0.97, extra={"holdout": held}, low=1.4)
    r = recommend(BASE, 100.0, [first, DECISIONS[1]], final(BOTH, True, 0.95))
    assert (r.source, r.settings) == ("baseline", BASE)
    assert "contradict it too" in r.reason


def test_a_failed_final_check_falls_back_to_the_first_kept_change():
    check = {**final(BOTH, True, 1.0, "crashed"), "speedup": None, "ci": None}
    r = recommend(BASE, 100.0, DECISIONS, check)
    assert (r.source, r.settings) == ("first-kept-change", AMP)


def test_a_batch_change_brings_its_grad_accum():
    d = kept("batch_size", 32, 64, 1.3, extra={"grad_accum": 2})
    r = recommend(BASE, 100.0, [d], {})
    assert r.settings == {**BASE, "batch_size": 64, "grad_accum": 2} and r.source == "first-kept-change"


def test_partial_results_without_a_kept_change_recommend_the_baseline_unmeasured():
    r = recommend(BASE, 100.0, [], {})
    assert (r.source, r.settings, r.speedup) == ("baseline", BASE, None)


def test_an_unchanged_search_recommends_the_baseline_at_one():
    r = recommend(BASE, 100.0, [], {**final(BASE, None, 1.0, "unchanged"), "reason": "unchanged reason"})
    assert (r.source, r.speedup, r.reason) == ("baseline", 1.0, "unchanged reason")


def test_the_report_names_every_source():
    from trainopt.outputs.report.html import SOURCE_TEXTS

    assert set(SOURCE_TEXTS) == set(SOURCES)


def test_a_held_out_figure_is_counted_by_its_own_pairs():
    d = kept("amp", "off", "bf16", 1.5, extra={"holdout": {"speedup": 1.5, "ci": [1.4, 1.6], "n_pairs": 6}})
    d.n_pairs = 14  # the pairs that decided it
    r = recommend(BASE, 100.0, [d], {})
    assert r.n_pairs == 6 and "1.500x [1.400, 1.600] over 6 held-out pairs" in r.reason


def test_the_claim_is_the_product_of_the_deciding_lower_bounds():
    a = kept("amp", "off", "bf16", 1.5, low=1.2)
    b = kept("num_workers", 0, 2, 1.2, low=1.05)
    assert math.isclose(claimed_speedup([a, b]), 1.2 * 1.05)


def test_the_contradiction_bound_is_the_exact_one_sided_signed_rank_bound():
    x = np.array([0.02, -0.05, 0.11, 0.07, -0.01, 0.04])
    check = check_claim(x, 1.05)
    k, level = ranks.exact_rank_level(6, 2 * CONTRADICTION_LEVEL)
    walsh = sorted((x[i] + x[j]) / 2 for i in range(6) for j in range(i, 6))
    assert check.upper == math.exp(walsh[-k]) and check.level == level / 2 == 3 / 64
    assert check.contradicted == (math.exp(walsh[-k]) < 1.05)


def not_above(count, n, limit):
    return binom.sf(count - 1, n, limit) >= 0.001


@pytest.mark.simulation
def test_kept_changes_as_fast_as_they_claim_are_rarely_contradicted_even_with_heavy_tails():
    # The truth exactly at the claim, t3 noise: the rate must stay within the stated level.
    rng = np.random.default_rng(1)
    n, claim = 6000, 1.08
    hits = sum(check_claim(math.log(claim) + 0.09 * rng.standard_t(3, 6) / math.sqrt(3), claim).contradicted for _ in range(n))
    assert not_above(hits, n, CONTRADICTION_LEVEL), f"{hits}/{n}"


@pytest.mark.simulation
def test_the_planned_final_check_catches_a_combination_no_faster_than_the_baseline():
    rng = np.random.default_rng(2)
    for claim, sd in [(1.06, 0.09), (1.09, 0.09), (1.2, 0.02)]:
        n = final_pairs(claim, sd, 6, 200)
        reps = 1500
        caught = sum(check_claim(rng.normal(0.0, sd, n), claim).contradicted for _ in range(reps))
        assert binom.cdf(caught, reps, 0.90) >= 0.001, f"claim {claim} sd {sd}: {caught}/{reps} over {n} pairs"


def test_the_final_check_grows_with_the_noise_and_keeps_to_its_bounds():
    assert final_pairs(1.08, None, 6, 40) == 6 and final_pairs(1.0, 0.09, 6, 40) == 6
    assert final_pairs(1.5, 0.02, 6, 40) == 6 and final_pairs(1.33, 0.12, 6, 40) == 6
    assert 6 < final_pairs(1.08, 0.06, 6, 40) < final_pairs(1.08, 0.09, 6, 40) <= 40
    assert final_pairs(1.01, 0.2, 6, 40) == 40


def test_the_pooled_pair_noise_is_raised_to_an_upper_bound():
    rng = random.Random(3)
    ds = [kept("amp", "off", "bf16", 1.5, extra={"pair_sd": {"sd": 0.08 + 0.01 * rng.random(), "n": 20}}) for _ in range(3)]
    raw = math.sqrt(sum(d.extra["pair_sd"]["sd"] ** 2 for d in ds) / 3)
    assert raw < pooled_pair_sd(ds) < raw * 1.2
    assert pooled_pair_sd(DECISIONS) is None
