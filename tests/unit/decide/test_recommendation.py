"""Which settings are recommended: only those a confirmation showed improved over the baseline."""

from __future__ import annotations

from trainopt.decide.recommendation import SOURCES, recommend
from trainopt.decide.verdict import Decision
from trainopt.knobs import catalog as knobs

BASE = knobs.default_settings()


def kept(knob, old, new, speedup, extra=None):
    return Decision(knob=knob, stage="x", from_value=old, to_value=new, verdict="improved", kept=True,
                    speedup=speedup, ci=[speedup - 0.1, speedup + 0.1], n_pairs=6, after_samples_per_s=100 * speedup,
                    extra=extra or {})


def final(settings, verdict, speedup=1.1):
    return {"settings": settings, "verdict": verdict, "reason": f"{verdict} reason", "speedup": speedup,
            "ci": [speedup - 0.05, speedup + 0.05], "n_pairs": 8, "samples_per_s": 123.0}


AMP = {**BASE, "amp": "bf16"}
BOTH = {**AMP, "num_workers": 2}
DECISIONS = [kept("amp", "off", "bf16", 1.5), kept("num_workers", 0, 2, 1.2)]


def test_an_improved_final_check_recommends_the_final_settings():
    r = recommend(BASE, 100.0, DECISIONS, final(BOTH, "improved", 1.8))
    assert (r.source, r.settings, r.speedup, r.samples_per_s, r.n_pairs) == ("final-check", BOTH, 1.8, 123.0, 8)


def test_a_failed_final_check_falls_back_to_the_first_kept_change():
    r = recommend(BASE, 100.0, DECISIONS, final(BOTH, "inconclusive"))
    assert (r.source, r.settings, r.speedup, r.ci, r.samples_per_s) == ("first-kept-change", AMP, 1.5, [1.4, 1.6], 150.0)
    assert r.reason.startswith("the final check of the combined settings said inconclusive (inconclusive reason)")


def test_the_first_change_is_not_recommended_when_the_final_check_just_rejected_it():
    r = recommend(BASE, 100.0, DECISIONS[:1], final(AMP, "regressed"))
    assert (r.source, r.settings, r.speedup, r.ci, r.samples_per_s) == ("baseline", BASE, 1.0, None, 100.0)


def test_a_batch_change_brings_its_grad_accum():
    d = kept("batch_size", 32, 64, 1.3, extra={"grad_accum": 2})
    r = recommend(BASE, 100.0, [d], {})
    assert r.settings == {**BASE, "batch_size": 64, "grad_accum": 2} and r.source == "first-kept-change"


def test_partial_results_without_a_kept_change_recommend_the_baseline_unmeasured():
    r = recommend(BASE, 100.0, [], {})
    assert (r.source, r.settings, r.speedup) == ("baseline", BASE, None)


def test_an_unchanged_search_recommends_the_baseline_at_one():
    r = recommend(BASE, 100.0, [], final(BASE, "unchanged", 1.0))
    assert (r.source, r.speedup, r.reason) == ("baseline", 1.0, "unchanged reason")


def test_the_report_names_every_source():
    from trainopt.outputs.report.html import SOURCE_TEXTS

    assert set(SOURCE_TEXTS) == set(SOURCES)


def test_an_inconclusive_final_check_above_one_leaves_the_confirmed_first_change_standing():
    # Demo run H: batch 256 confirmed (held-out 1.175x [1.089, 1.267]), then the final check
    # of exactly those settings said inconclusive 1.145x [1.027, 1.259] over 6 pairs.
    batch = kept("batch_size", 32, 256, 1.175, extra={"grad_accum": 1})
    check = {**final({**BASE, "batch_size": 256, "grad_accum": 1}, "inconclusive", 1.145), "ci": [1.027, 1.259]}
    r = recommend(BASE, 100.0, [batch], check)
    assert (r.source, r.settings["batch_size"], r.speedup) == ("first-kept-change", 256, 1.175)
    assert "measured the same comparison again" in r.reason and "inconclusive reason" in r.reason


def test_an_inconclusive_final_check_pointing_up_leaves_the_first_change_standing_even_reaching_below_one():
    # Demo run M: batch 64 confirmed over 14 pairs; its 6 held-out pairs (the final check)
    # said 1.137x [0.942, 1.372]: faster, not surely so over 6 pairs.
    check = {**final(AMP, "inconclusive", 1.137), "ci": [0.942, 1.372]}
    r = recommend(BASE, 100.0, DECISIONS[:1], check)
    assert (r.source, r.settings) == ("first-kept-change", AMP)
    assert "found them faster, though not surely by the margin" in r.reason


def test_an_inconclusive_final_check_pointing_down_rejects_the_first_change():
    check = {**final(AMP, "inconclusive", 0.99), "ci": [0.90, 1.09]}
    r = recommend(BASE, 100.0, DECISIONS[:1], check)
    assert (r.source, r.settings) == ("baseline", BASE)
    assert "said inconclusive" in r.reason
    # With two kept changes the final check measured other settings: the first change stands.
    r = recommend(BASE, 100.0, DECISIONS, {**final(BOTH, "inconclusive", 0.99), "ci": [0.90, 1.09]})
    assert (r.source, r.settings) == ("first-kept-change", AMP)


def test_a_held_out_figure_is_counted_by_its_own_pairs():
    d = kept("amp", "off", "bf16", 1.5, extra={"holdout": {"speedup": 1.5, "ci": [1.4, 1.6], "n_pairs": 6}})
    d.n_pairs = 14  # the pairs that decided it
    r = recommend(BASE, 100.0, [d], {})
    assert r.n_pairs == 6 and "1.500x [1.400, 1.600] over 6 held-out pairs" in r.reason
