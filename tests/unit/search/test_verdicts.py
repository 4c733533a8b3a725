"""The search's verdicts, simulated through ``Search`` itself with a fake runner of known truth.

Each run is a whole search of one knob: a screen session, confirmations on fresh pair
sessions under the sequential rule, held-out pairs for a kept change, and the final
check. The noise is the pair log-ratio's sd: 0.05 (a quiet machine), 0.18 (sequential
fresh processes here, sd ~0.165) and 0.5 (extreme); interleaved sessions of live arms at 2
threads here measure about 0.09 (benchmarks/RESULTS.md). Every search has the CLI's
stability guard, as users run it.

Bounds are tested, not point figures: a rate passes when it is not significantly above
its limit (a one-sided binomial test at 0.1 %), so a rule at the old design's 7.7 %
false-win rate fails these tests, and a rule at the limit passes them.
"""

from __future__ import annotations

import math
import statistics

import pytest
from scipy.stats import binom

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, simulated_search
from trainopt.contract.spec import MeasureSection, spec_from_dict

pytestmark = pytest.mark.simulation

# The spec's own default budget: what a user who writes no measure section gets.
DEFAULT_BUDGET = {k: getattr(MeasureSection(), k) for k in ("pairs", "max_pairs", "confidence")}


def search_once(tmp_path, *, effect, sd, seed, knob="amp", values=("off", "bf16"), winner=None, tail="normal", **measure):
    """One search of one knob; returns (the kept decision or None, every decision of the knob).

    The recommended settings (``best``) ride along on the returned decisions list as
    ``decisions.best`` for the tests that check what the user is handed.
    """
    spec = spec_from_dict(tiny_spec_dict(search={knob: list(values)}, measure={**DEFAULT_BUDGET, **measure}), "t.yaml", tmp_path)
    winners = values[1:] if winner is None else [winner]
    runner = FakeRunner({(knob, v): effect for v in winners}, arm_sd=sd / math.sqrt(2), session_sd=0.1, tail=tail, seed=seed)
    doc = simulated_search(spec, tmp_path, runner).run()
    decisions = Decisions(d for d in doc["decisions"] if d["knob"] == knob)
    decisions.best = doc["best"]["settings"]
    kept = [d for d in decisions if d["kept"]]
    return (kept[0] if kept else None), decisions


class Decisions(list):
    """A knob's decisions, with the search's recommended settings as ``best``."""

    best: dict


def not_above(count: int, n: int, limit: float) -> bool:
    """True unless ``count`` of ``n`` is significantly (p < 0.001) above the rate ``limit``."""
    return binom.sf(count - 1, n, limit) >= 0.001


def false_wins(tmp_path, n, rule=None, **kw) -> int:
    wins = 0
    for seed in range(n):
        spec_kw = {k: v for k, v in kw.items() if k not in ("sd", "tail")}
        spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={**DEFAULT_BUDGET, **spec_kw}), "t.yaml", tmp_path)
        runner = FakeRunner({}, arm_sd=kw["sd"] / math.sqrt(2), session_sd=0.1, tail=kw.get("tail", "normal"), seed=seed)
        doc = simulated_search(spec, tmp_path, runner, rule=rule).run()
        wins += any(d["verdict"] == "improved" for d in doc["decisions"] if d["knob"] == "amp")
    return wins


@pytest.mark.parametrize("sd", [0.05, 0.18, 0.5])
@pytest.mark.parametrize("min_speedup", [0.0, 0.03])
def test_no_effect_is_rarely_called_improved_at_any_noise(tmp_path, sd, min_speedup):
    n = 1000
    wins = false_wins(tmp_path, n, sd=sd, min_speedup=min_speedup)
    print(f"false improved {wins}/{n}")
    assert not_above(wins, n, 0.025), f"{wins}/{n} false improved"


def test_the_check_above_fails_the_old_fixed_interval_rule(tmp_path):
    # The old rule looked after every added pair without spending its error: the same
    # check, with the same screen, must catch it, or the bound above proves nothing.
    from trainopt.decide.confirmation import IntervalRule

    n = 1000
    spec = spec_from_dict(tiny_spec_dict(measure={**DEFAULT_BUDGET, "min_speedup": 0.0}), "t.yaml", tmp_path)
    wins = false_wins(tmp_path, n, rule=IntervalRule.from_measure(spec.measure), sd=0.18, min_speedup=0.0)
    assert not not_above(wins, n, 0.025), f"{wins}/{n} false improved"


@pytest.mark.parametrize("budget", [{"pairs": 3, "max_pairs": 7}, {"pairs": 7, "max_pairs": 7}, {"pairs": 20, "max_pairs": 60}],
                         ids=["smallest", "fixed", "large"])
def test_the_false_win_bound_holds_at_the_edges_of_the_pair_budget(tmp_path, budget):
    n = 1000
    wins = false_wins(tmp_path, n, sd=0.18, min_speedup=0.0, tail="t3", **budget)
    print(f"false improved {wins}/{n}")
    assert not_above(wins, n, 0.025), f"{wins}/{n} false improved"


def test_a_knob_with_two_null_candidates_is_rarely_adopted(tmp_path):
    n = 1000
    adopted = sum(
        search_once(tmp_path, effect=1.0, sd=0.06, seed=seed, knob="num_workers", values=(0, 1, 2), min_speedup=0.0)[0] is not None
        for seed in range(n)
    )
    assert not_above(adopted, n, 0.025), f"{adopted}/{n} adopted"


def test_a_real_ten_percent_win_is_found_at_the_interleaved_noise(tmp_path):
    # Two candidates, one of them the real win: the screen must not lose it and the
    # shared budget must still confirm it, with the default budget and margin at the pair
    # noise measured for live arms at 2 threads on a 2-core CPU.
    # And it reaches the user: the recommended settings (best.yaml) hold it, which a final
    # check that must also clear 1 over its own 6 pairs allowed in only 41 % of searches.
    n = 300
    found = handed = 0
    for seed in range(n):
        kept, decisions = search_once(tmp_path, effect=1.10, sd=0.09, seed=seed, knob="num_workers", values=(0, 1, 2), winner=2)
        found += kept is not None and kept["to"] == 2
        handed += decisions.best["num_workers"] == 2
    assert found / n >= 0.90, f"found {found}/{n}"
    assert handed / n >= 0.90, f"recommended {handed}/{n}"


@pytest.mark.parametrize("effect", [1.05, 1.10])
def test_reported_speedups_of_kept_changes_are_not_inflated(tmp_path, effect):
    reported = []
    covered = 0
    for seed in range(1500 if effect == 1.05 else 300):
        kept, _ = search_once(tmp_path, effect=effect, sd=0.06, seed=seed)
        if kept is not None:
            reported.append(kept["speedup"])
            covered += kept["ci"][0] <= effect <= kept["ci"][1]
    mean = statistics.fmean(reported)
    assert len(reported) >= 100
    assert abs(mean / effect - 1) <= 0.02, f"mean reported {mean:.4f} for a true {effect}"
    # The held-out interval keeps its nominal 95 % coverage among kept changes.
    assert not_above(len(reported) - covered, len(reported), 0.05), f"covered {covered}/{len(reported)}"


# ---- what reaches best.yaml: every kept change unless the final check contradicts them ----

BOTH = {"amp": ["off", "bf16"], "num_workers": [0, 1]}
PLANTED = [({"amp": "bf16", "num_workers": 1}, {"amp": "off", "num_workers": 0}, 1 / 1.21)]


def two_wins(tmp_path, seed, sd, beside=None):
    """One search of two knobs, each a true +10 % change; returns (both kept, best.yaml holds both, the document)."""
    spec = spec_from_dict(tiny_spec_dict(search=BOTH, measure=DEFAULT_BUDGET), "t.yaml", tmp_path)
    runner = FakeRunner({("amp", "bf16"): 1.10, ("num_workers", 1): 1.10}, arm_sd=sd / math.sqrt(2), session_sd=0.1, seed=seed,
                        beside=beside)
    doc = simulated_search(spec, tmp_path, runner).run()
    best = doc["best"]["settings"]
    return sum(d["kept"] for d in doc["decisions"]) == 2, best["amp"] == "bf16" and best["num_workers"] == 1, doc


@pytest.mark.parametrize("sd", [0.09, 0.02])
def test_two_confirmed_wins_both_reach_best_yaml(tmp_path, sd):
    # The final check keeps every kept change it does not contradict: at 0.09 a 6-pair
    # final check that had to say "improved" kept both in only about half the searches.
    n = 150
    runs = [two_wins(tmp_path, seed, sd) for seed in range(n)]
    kept_both = sum(k for k, _, _ in runs)
    handed = sum(h for _, h, _ in runs)
    assert all(k for k, h, _ in runs if h)
    assert handed >= 0.97 * kept_both, f"best.yaml held both in {handed} of {kept_both} searches keeping both"
    # 84.0 % of 400 searches at 0.09 (89.8 % with the mean check not widened for serial
    # dependence: the price of holding false wins under drifting speed; see docs/deciding.md).
    assert kept_both / n >= (0.80 if sd == 0.09 else 0.95), f"both kept in {kept_both}/{n}"
    # The figure comes from the final check's pairs, which chose nothing but the contradiction test.
    reported = [doc["speedup"] for _, h, doc in runs if h]
    assert abs(statistics.fmean(reported) / 1.21 - 1) <= 0.02
    assert all(doc["best"]["n_pairs"] == doc["final"]["n_pairs"] for _, h, doc in runs if h)


def test_a_planted_interaction_that_makes_the_combination_no_faster_is_caught(tmp_path):
    # Each change confirms against its incumbent, but the combination, measured beside the
    # baseline, is no faster than it: only the final check sees that.
    n = 150
    runs = [two_wins(tmp_path, seed, 0.09, PLANTED) for seed in range(n)]
    kept_both = [doc for k, _, doc in runs if k]
    caught = sum(not h for k, h, _ in runs if k)
    assert binom.cdf(caught, len(kept_both), 0.90) >= 0.001, f"caught {caught} of {len(kept_both)}"
    # What is recommended instead is the first kept change, a real +10 %.
    fallback = [doc["best"] for doc in kept_both if doc["best"]["source"] == "first-kept-change"]
    assert len(fallback) >= caught - 3


# ---- skewed pair noise: the ratio of mean throughputs at the margin ----

@pytest.mark.parametrize("shape", ["mixture", "lognormal"])
def test_at_the_cpu_pair_noise_a_skewed_change_whose_mean_gain_is_at_the_margin_is_rarely_improved(tmp_path, shape):
    # At a GPU's 2 % noise the skew dominates and no rule over a few dozen pairs bounds
    # this, nor does it for 10 % slow outlier pairs (3.7 % at 0.09; docs/deciding.md); for
    # the 80/20 mixture and a skewed log-normal at the 2-core CPU's 0.09 the bound holds.
    from tests.fakes import SKEW_MEAN

    n = 300
    wins = 0
    for seed in range(n):
        spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure=DEFAULT_BUDGET), "t.yaml", tmp_path)
        runner = FakeRunner({("amp", "bf16"): 1.03 / SKEW_MEAN[shape]}, arm_sd=0.09 / math.sqrt(2), session_sd=0.1, seed=seed,
                            skewed={("amp", "bf16"): shape})
        doc = simulated_search(spec, tmp_path, runner).run()
        wins += any(d["verdict"] == "improved" for d in doc["decisions"] if d["knob"] == "amp")
    assert not_above(wins, n, 0.025), f"{wins}/{n} improved"


# ---- the error of a whole search ----

NULL_KNOBS = {"amp": ["off", "bf16"], "channels_last": [False, True], "num_workers": [0, 1], "threads": [1, 2],
              "sync_every": [1, 8], "optimizer_impl": ["default", "foreach"]}


def test_a_search_scoped_error_budget_bounds_the_whole_search(tmp_path):
    n = 200
    adopted = 0
    for seed in range(n):
        measure = {**DEFAULT_BUDGET, "error_scope": "search", "min_speedup": 0.0}
        spec = spec_from_dict(tiny_spec_dict(search=NULL_KNOBS, measure=measure), "t.yaml", tmp_path)
        doc = simulated_search(spec, tmp_path, FakeRunner({}, arm_sd=0.09 / math.sqrt(2), session_sd=0.1, seed=seed)).run()
        adopted += any(d["kept"] for d in doc["decisions"])
        assert doc["error_rates"]["search"] == pytest.approx(0.025) and doc["error_rates"]["knobs"] == 6
    assert not_above(adopted, n, 0.025), f"{adopted}/{n} searches adopted a change without effect"
