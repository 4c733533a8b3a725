"""The sequential confirmation rule, screening selection and held-out estimates (no torch, seeded).

The guarantees are proved in the module docstring (union bound over the spent looks); these
tests check the pieces the proof rests on (exact levels, a budget that sums to at most
alpha) and then the claims themselves by simulation, including noise where a plain t-rule
breaks.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainopt.contract.spec import MeasureSection
from trainopt.decide.screen import MAX_CONFIRM, SCREEN_GATE, select_for_confirmation
from trainopt.decide.sequential import SequentialRule, holdout_estimate, holdout_pairs
from trainopt.stats import intervals as stats


def confirm(rule: SequentialRule, x: np.ndarray):
    """Feed pairs one at a time until the rule stops; the caller's loop, as the search runs it."""
    for n in range(1, rule.max_pairs + 1):
        d = rule.decide(x[:n])
        if d.done:
            return d
    raise AssertionError("the rule never stopped at max_pairs")


def draws(rng, kind: str, size: int, sd: float) -> np.ndarray:
    if kind == "normal":
        return rng.normal(0, sd, size)
    if kind == "t3":
        return sd * rng.standard_t(3, size) / math.sqrt(3)
    if kind == "rademacher":
        # Equal-size log-ratios of random sign: symmetric, but the worst case for a t-interval.
        return sd * rng.choice([-1.0, 1.0], size)
    raise ValueError(kind)


def rate(decisions, verdict="improved"):
    return sum(d.verdict == verdict for d in decisions) / len(decisions)


def upper_limit(p: float, reps: int) -> float:
    """A target plus three binomial standard errors: the simulation's own noise."""
    return p + 3 * math.sqrt(p * (1 - p) / reps)


@pytest.mark.parametrize("n", [6, 9, 12, 20, 45])
def test_rank_interval_matches_the_fixed_sample_interval_at_its_level(n):
    rng = np.random.default_rng(n)
    r = rng.normal(0.05, 0.1, n)
    fixed = stats.paired_interval(np.exp(r), np.ones(n), 0.95)
    rule = SequentialRule(3, 100)
    mine = rule.interval_at(r, 1 - fixed.coverage)
    assert mine.low == pytest.approx(fixed.low) and mine.high == pytest.approx(fixed.high)
    assert mine.speedup == pytest.approx(fixed.speedup)
    assert mine.coverage == pytest.approx(fixed.coverage)


@pytest.mark.parametrize(
    "pairs,max_pairs,confidence,family,method",
    [(3, 3, 0.95, 1, "hodges-lehmann"), (6, 20, 0.95, 1, "hodges-lehmann"), (6, 20, 0.9, 2, "t"),
     (3, 1000, 0.95, 1, "hodges-lehmann"), (1000, 1000, 0.99, 3, "hodges-lehmann"), (6, 6, 0.95, 1, "t"),
     (4, 80, 0.8, 1, "hodges-lehmann")],
)
def test_spent_levels_never_exceed_the_budget_and_end_at_max_pairs(pairs, max_pairs, confidence, family, method):
    rule = SequentialRule(pairs, max_pairs, confidence, 0.0, method, family=family)
    alpha = (1 - confidence) / family
    assert rule.looks[0].n == pairs and rule.looks[-1].n == max_pairs
    assert [lk.n for lk in rule.looks] == sorted({lk.n for lk in rule.looks})
    assert sum(lk.alpha for lk in rule.looks) <= alpha * (1 + 1e-12)
    assert rule.coverage >= 1 - alpha - 1e-12
    for look in rule.looks:
        if look.alpha > 0 and method == "hodges-lehmann":
            # The level spent is one the exact rank interval reaches exactly.
            iv = rule.interval_at(np.linspace(-1, 1, look.n), look.alpha)
            assert 1 - iv.coverage == pytest.approx(look.alpha)


def test_the_default_budget_leaves_most_of_alpha_for_the_last_look():
    rule = SequentialRule.from_measure(MeasureSection())
    assert (rule.pairs, rule.max_pairs, rule.min_speedup) == (6, 40, 0.03)
    assert rule.looks[-1].alpha > 0.5 * 0.05
    assert rule.coverage >= 0.95


def test_between_looks_the_rule_asks_for_more_and_rejects_bad_input():
    rule = SequentialRule(6, 20)
    assert rule.decide([0.1, 0.2]).action == "continue"
    assert rule.decide([0.1] * 7).action == "continue"  # 7 is not a look
    with pytest.raises(ValueError, match="max_pairs"):
        rule.decide([0.0] * 21)
    with pytest.raises(ValueError, match="finite"):
        rule.decide([0.0] * 5 + [math.inf])
    with pytest.raises(ValueError, match="unknown interval"):
        SequentialRule(6, 20, interval="bootstrap")


def test_a_budget_too_small_for_the_confidence_never_claims_anything():
    # 3 pairs can reach at most 75 % two-sided coverage with a rank interval.
    rule = SequentialRule(3, 3)
    d = rule.decide([1.0, 1.1, 1.2])
    assert d.done and d.verdict == "inconclusive"


def test_a_large_effect_stops_early_and_a_clear_loss_is_regressed():
    rng = np.random.default_rng(0)
    rule = SequentialRule(6, 20)
    win = confirm(rule, rng.normal(math.log(1.5), 0.05, 20))
    assert win.verdict == "improved" and win.n < 20 and win.interval.low > 1.03
    x = rng.normal(math.log(0.7), 0.05, 20)
    no_futility = SequentialRule(6, 20, futility_confidence=None, projection_confidence=None)
    loss = confirm(no_futility, x)
    assert loss.verdict == "regressed" and loss.interval.high < 1.0


def test_a_look_that_spends_nothing_can_still_stop_for_futility():
    # At 95 % the first look (6 pairs) cannot reach any rank level within its share of the
    # budget, so nothing can be claimed there; a clear loss still stops there, unclaimed,
    # instead of running to the next look to be called regressed.
    x = np.random.default_rng(0).normal(math.log(0.7), 0.05, 20)
    rule = SequentialRule(6, 20)
    assert rule.looks[0].alpha == 0 and rule.next_look(0) == 6
    d = confirm(rule, x)
    assert (d.n, d.verdict, d.interval) == (6, "inconclusive", None)
    assert d.reason.startswith("0.") and "improvement ruled out" in d.reason
    # Without a futility stop that look is skipped: the pairs go straight to the next one.
    assert SequentialRule(6, 20, futility_confidence=None, projection_confidence=None).next_look(0) == 9


@pytest.mark.parametrize("kind", ["normal", "t3", "rademacher"])
@pytest.mark.parametrize("method", ["hodges-lehmann", "t"])
def test_aa_false_wins_stay_within_half_alpha_with_no_margin(kind, method):
    # min_speedup 0 is the hardest case: any lower bound above 1 is a false win. The
    # rule is scale-free, so one noise level stands for all of them.
    rng = np.random.default_rng(11)
    rule = SequentialRule(6, 20, 0.95, 0.0, method)
    reps = 1000
    got = [confirm(rule, draws(rng, kind, 20, 0.2)) for _ in range(reps)]
    assert rate(got) <= upper_limit(0.025, reps)
    assert rate(got, "regressed") <= upper_limit(0.025, reps)


def test_the_reported_interval_keeps_its_coverage_under_the_stopping_rule():
    rng = np.random.default_rng(3)
    truth = math.log(1.08)
    rule = SequentialRule(6, 20, 0.95, 0.03)
    reps = 1000
    got = [confirm(rule, truth + draws(rng, "t3", 20, 0.1)) for _ in range(reps)]
    # The guarantee is on the interval reported at the stop; a futility stop at a look that
    # may claim nothing reports none, and so cannot miss.
    missed = sum(d.interval is not None and not d.interval.low <= 1.08 <= d.interval.high for d in got)
    assert sum(d.interval is not None for d in got) >= 0.9 * reps
    assert missed / reps <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / reps)


def test_ten_percent_is_found_at_interleaved_session_noise_with_the_default_budget():
    rng = np.random.default_rng(4)
    rule = SequentialRule.from_measure(MeasureSection())
    # 0.09: the pair noise of live arms at 2 threads on a 2-core CPU.
    got = [confirm(rule, rng.normal(math.log(1.10), 0.09, rule.max_pairs)) for _ in range(400)]
    assert rate(got) >= 0.95
    big = [confirm(rule, rng.normal(math.log(1.25), 0.09, rule.max_pairs)) for _ in range(200)]
    # Under 10 pairs with independent pairs taken as such; the widening of the mean check
    # for serial dependence (its estimate taken RHO_MARGIN standard errors high) costs some.
    assert np.mean([d.n for d in big]) < 11
    plain = SequentialRule.from_measure(MeasureSection(), dependence=False)
    assert np.mean([confirm(plain, rng.normal(math.log(1.25), 0.09, plain.max_pairs)).n for _ in range(200)]) < 10


def test_selection_confirms_the_best_screens_above_the_gate_and_splits_the_budget():
    sel = select_for_confirmation([1.02, None, 0.90, 1.20, 0.97], max_confirm=2, gate=0.95)
    assert sel.indices == [3, 0] and sel.family == 2
    assert "failed" in sel.reasons[1] and "gate" in sel.reasons[2] and "faster" in sel.reasons[4]
    none = select_for_confirmation([0.5, None], max_confirm=2, gate=SCREEN_GATE)
    assert none.indices == [] and none.family == 1


def test_aa_adoption_per_knob_with_several_confirmed_candidates_stays_within_half_alpha():
    # Four null candidates: the screen picks up to two, which share alpha; any improved
    # one would be adopted.
    rng = np.random.default_rng(8)
    reps = 800
    adopted = 0
    for _ in range(reps):
        screen = np.exp(rng.normal(0, 0.09, 4))
        # The search's own selection: its gate and its most candidates confirmed per knob.
        sel = select_for_confirmation(list(screen), MAX_CONFIRM, SCREEN_GATE)
        rule = SequentialRule(6, 20, 0.95, 0.0, family=sel.family)
        if any(confirm(rule, rng.normal(0, 0.09, 20)).verdict == "improved" for _ in sel.indices):
            adopted += 1
    assert adopted / reps <= upper_limit(0.025, reps)


def test_holdout_pairs_reach_the_confidence():
    assert holdout_pairs(0.95) == 6
    assert holdout_pairs(0.99) == 8
    assert holdout_pairs(0.95, "t") == 6


def test_held_out_speedups_of_kept_changes_are_not_inflated():
    # At a true 1.05, a change is kept only when its pairs ran high, so the deciding
    # interval's estimate is inflated; fresh pairs after the verdict are not.
    rng = np.random.default_rng(9)
    rule = SequentialRule(6, 20, 0.95, 0.03)
    truth = 1.05
    deciding, held = [], []
    for _ in range(1500):
        d = confirm(rule, math.log(truth) + rng.normal(0, 0.09, 20))
        if d.verdict == "improved":
            deciding.append(d.interval.speedup)
            held.append(holdout_estimate(math.log(truth) + rng.normal(0, 0.09, holdout_pairs())).speedup)
    assert len(held) > 50
    assert np.mean(deciding) > truth * 1.02
    assert abs(np.mean(held) / truth - 1) < 0.02


def test_futility_stops_a_null_change_before_the_budget_without_claiming_a_loss():
    rng = np.random.default_rng(12)
    rule = SequentialRule(6, 20, 0.95, 0.03)
    got = [confirm(rule, rng.normal(-0.05, 0.06, 20)) for _ in range(200)]
    early = [d for d in got if d.n < 20]
    assert len(early) > 150
    assert all(d.verdict != "improved" for d in got)
    assert any("ruled out" in d.reason for d in early)


def test_with_t_intervals_a_win_the_rank_interval_does_not_back_is_not_claimed():
    # Nine log-ratios of equal size, one negative: the spent t-interval excludes 1, while
    # the rank interval at the same level does not (a sign pattern this lopsided is far
    # more likely under symmetric equal-size noise than the t-interval assumes).
    x = [0.1] * 8 + [-0.1]
    rule = SequentialRule(6, 20, 0.95, 0.0, "t")
    look = rule._by_n[9]
    assert rule.interval_at(x, look.alpha, "t").low > 1.0
    assert rule.interval_at(x, look.alpha, "hodges-lehmann").low <= 1.0
    assert rule.decide(x).verdict != "improved"


def exact(n: int, mean: float, sd: float, seed: int = 0) -> np.ndarray:
    """n log-ratios with exactly this mean and sample sd."""
    z = np.random.default_rng(seed).normal(size=n)
    return mean + sd * (z - z.mean()) / z.std(ddof=1)


def test_a_change_of_a_few_percent_stops_once_no_optimistic_future_could_clear_the_margin():
    # 21 pairs at +3.5 % with sd 0.09 and 40 allowed: the 50 % futility bound is still above
    # 1.03, but even if the 19 pairs to come all ran at the 99 % upper bound of the mean,
    # the last look's lower bound would stay below 1.03.
    x = exact(21, math.log(1.035), 0.09)
    plain = SequentialRule(6, 40, family=2, projection_confidence=None)
    assert plain.decide(x).action == "continue"
    d = SequentialRule(6, 40, family=2).decide(x)
    assert d.done and d.verdict == "inconclusive" and "last look's lower bound" in d.reason
    # The same pairs at +7 % have a future: not decided yet, and the rule goes on.
    assert SequentialRule(6, 40, family=2).decide(exact(21, math.log(1.07), 0.09)).action == "continue"
    # With no pairs left to come there is nothing to project (the budget decides).
    assert SequentialRule(6, 21, family=2)._projected_low(x) is None


def test_stopping_by_projection_saves_pairs_and_keeps_the_power_for_ten_percent():
    rng = np.random.default_rng(21)
    with_it = SequentialRule(6, 40, family=2)
    without = SequentialRule(6, 40, family=2, projection_confidence=None)
    marginal = [rng.normal(math.log(1.035), 0.09, 40) for _ in range(300)]
    assert np.mean([confirm(with_it, x).n for x in marginal]) < 0.8 * np.mean([confirm(without, x).n for x in marginal])
    real = [rng.normal(math.log(1.10), 0.09, 40) for _ in range(300)]
    # Paired on the same data: stopping early for futility can lose a win, never make one.
    lost = sum(rate([confirm(without, x)]) - rate([confirm(with_it, x)]) for x in real)
    assert 0 <= lost <= 0.01 * len(real)
    assert all(not (confirm(with_it, x).verdict == "improved" and confirm(without, x).verdict != "improved") for x in real)
