"""The ETA's prices per kind of trial process, learned from the search's own trials (pure)."""

import statistics

import pytest

from trainopt.decide import plan
from trainopt.decide.plan import ArmCosts, PRIOR_WEIGHT, arm_cost, arm_kind, prior_cost


def plain_pairs(costs: ArmCosts, n: int, arm_s: float) -> None:
    for _ in range(n):
        costs.observe(["plain", "plain"], 2 * arm_s)


def test_kinds_follow_the_role_and_whether_the_process_compiles():
    assert arm_kind({"compile": "off"}, "confirm") == "plain"
    assert arm_kind({"compile": "default"}, "holdout") == "plain+compiled"
    assert arm_kind({"compile": "default"}, "screen") == "screen+compiled"
    assert arm_kind(None, "baseline") == "baseline"
    assert arm_kind({"compile": "default"}, "cold-compile") == "cold-compile"
    assert set(plan.PROCESS_COUNT) == set(plan.KINDS) and all(v == 1.0 for v in plan.PROCESS_COUNT.values())


def test_every_kind_is_priced_at_its_prior_until_a_trial_of_it_is_measured():
    costs = ArmCosts()
    assert costs.costs() == {}
    for kind in plan.KINDS:
        assert costs.cost(kind) == prior_cost(kind)
        assert arm_cost({"compile": "default" if "compiled" in kind else "off"}, kind.split("+")[0],
                        costs.costs()) == prior_cost(kind)
    plain_pairs(costs, 4, 10.0)
    # Plain arms are the unit: they set the price in seconds, not a weight.
    assert costs.costs() == {} and costs.unit() == 10.0


def test_a_kind_s_price_moves_from_its_prior_to_the_measured_mean_as_its_trials_finish():
    costs = ArmCosts()
    plain_pairs(costs, 4, 10.0)
    prior = prior_cost("plain+compiled")
    # Compiled arms that cost 5 plain arms each (a start-up and a compile far dearer than the
    # CPU demo's): a pair of one plain and one compiled arm takes 10 + 50 s.
    seen = []
    for n in range(1, 21):
        costs.observe(["plain", "plain+compiled"], 60.0)
        seen.append(costs.cost("plain+compiled"))
        assert seen[-1] == pytest.approx((PRIOR_WEIGHT * prior + n * 5.0) / (PRIOR_WEIGHT + n))
    assert seen == sorted(seen) and seen[-1] == pytest.approx(5.0, abs=0.15)
    assert costs.measured("plain+compiled") == 20
    # What a kind learned prices it wherever it is asked for.
    assert arm_cost({"compile": "default"}, "confirm", costs.costs()) == seen[-1]
    assert arm_cost({"compile": "off"}, "confirm", costs.costs()) == 1.0


def test_trials_before_the_first_plain_arm_are_measured_against_the_first_plain_arms():
    costs = ArmCosts()
    # The baseline (25 s) and a 4-arm screen (88 s) run before any confirmation pair.
    costs.observe(["baseline"], 25.0)
    costs.observe(["screen"] * 4, 88.0)
    assert costs.costs() == {}
    # Priced at their priors meanwhile: the plain arm's price is their walls over those.
    assert costs.unit() == pytest.approx(statistics.median([25.0 / prior_cost("baseline")] + [88.0 / (4 * prior_cost("screen"))] * 4))
    plain_pairs(costs, 1, 20.0)
    assert costs.measured("baseline") == 1 and costs.measured("screen") == 1
    assert costs.cost("baseline") == pytest.approx((PRIOR_WEIGHT * prior_cost("baseline") + 25.0 / 20.0) / (PRIOR_WEIGHT + 1))
    assert costs.cost("screen") == pytest.approx((PRIOR_WEIGHT * prior_cost("screen") + 22.0 / 20.0) / (PRIOR_WEIGHT + 1))



def test_a_mixed_session_leaves_to_its_dearest_kind_what_its_cheaper_arms_did_not_take():
    costs = ArmCosts()
    plain_pairs(costs, 3, 10.0)
    # A held-out session: two compiled arms and the baseline's plain arm, 10 + 2 x 40 s.
    costs.observe(["plain+compiled", "plain+compiled", "plain"], 90.0)
    assert costs.measured("plain+compiled") == 1 and costs.measured("plain") == 0
    assert costs.cost("plain+compiled") == pytest.approx((PRIOR_WEIGHT * prior_cost("plain+compiled") + 4.0) / (PRIOR_WEIGHT + 1))
    # A screen of the compile knob: the incumbent's screen arm at its learned price, the rest
    # is the compiled candidate's.
    costs.observe(["screen"] * 3, 33.0)
    screen = costs.cost("screen")
    costs.observe(["screen", "screen+compiled"], 70.0)
    assert costs._ratios["screen+compiled"] == [pytest.approx((70.0 - screen * 10.0) / 10.0)]
    # A session faster than its cheaper arms' prices does not give a price of zero or below.
    costs.observe(["plain", "plain+compiled"], 5.0)
    assert min(costs._ratios["plain+compiled"]) == pytest.approx(0.1 * prior_cost("plain+compiled"))


def test_the_diagnosis_trial_is_priced_like_the_measured_baseline_trial():
    costs = ArmCosts()
    costs.observe(["baseline"], 12.0)
    plain_pairs(costs, 2, 10.0)
    assert costs.cost("diagnosis") == costs.cost("baseline") != prior_cost("diagnosis")
    assert costs.costs()["diagnosis"] == costs.cost("baseline")


def test_the_price_of_a_plain_arm_follows_the_recent_arms_and_not_one_slow_one():
    costs = ArmCosts()
    plain_pairs(costs, 20, 1.0)
    plain_pairs(costs, ArmCosts.RECENT // 2, 4.0)
    assert costs.unit() == 4.0
    costs.observe(["plain"], 400.0)
    assert costs.unit() == 4.0
    # Nothing is learned from an empty or timeless observation.
    costs.observe([], 3.0)
    costs.observe(["screen"], 0.0)
    assert costs.measured("screen") == 0


def test_priced_trials_of_unknown_kind_set_the_plain_price_only():
    costs = ArmCosts()
    costs.observe_priced(25.0, 10.0)
    assert costs.unit() == 2.5 and costs.costs() == {}


def test_learned_prices_change_the_remaining_work_and_unit_prices_count_processes():
    search = {"amp": ["off", "bf16"], "compile": ["off", "default"]}
    kw = dict(confirm_pairs=6, holdout_pairs=6, final_pairs=0, batch_candidates=4)
    base = {"compile": "off", "amp": "off"}
    # Screens only: amp's (incumbent and one candidate), compile's and its cold compile.
    processes = plan.remaining_trials(["amp", "compile"], search, incumbent=base, screen_only=["amp", "compile"],
                                      costs=plan.PROCESS_COUNT, **kw)
    assert processes == pytest.approx(2 + 2 + 1)
    priors = plan.remaining_trials(["amp", "compile"], search, incumbent=base, screen_only=["amp", "compile"], **kw)
    assert priors == pytest.approx(2 * prior_cost("screen") + prior_cost("screen") + prior_cost("screen+compiled")
                                   + prior_cost("cold-compile"))
    learned = {"screen": 1.0, "screen+compiled": 4.0, "cold-compile": 6.0}
    assert plan.remaining_trials(["amp", "compile"], search, incumbent=base, screen_only=["amp", "compile"],
                                 costs=learned, **kw) == pytest.approx(2 + 1 + 4 + 6)
