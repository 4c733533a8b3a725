"""Statistics and verdict rules on synthetic numbers (no torch, milliseconds)."""

import math

import numpy as np
import pytest

from trainopt.stats import intervals as stats
from trainopt.stats import ranks


def test_signed_rank_critical_values_match_published_tables():
    # Two-sided 5 % critical values T: n=12 -> 13, n=20 -> 52 (rank k = T + 1).
    assert stats._wilcoxon_rank(12, 0.05) == 14
    assert stats._wilcoxon_rank(20, 0.05) == 53
    # n=6 cannot reach 2.5 % per tail except with the extremes.
    assert stats._wilcoxon_rank(6, 0.05) == 1


def test_signed_rank_cdf_sums_to_one_and_is_symmetric():
    cdf = ranks.signed_rank_cdf(8)
    assert cdf[-1] == pytest.approx(1.0)
    pmf = np.diff((0.0,) + cdf)
    assert np.allclose(pmf, pmf[::-1])


def test_hl_interval_ignores_one_wild_pair_that_t_interval_swallows():
    # From 12 pairs on, the rank interval at 95 % has more Walsh averages to spare than
    # one outlier contaminates (12), so one wild pair cannot move its bounds far.
    inc = [100.0] * 12
    cand = [110, 111, 109, 110, 112, 108, 110, 111, 109, 110, 111, 40]
    hl = stats.paired_interval(cand, inc, 0.95, "hodges-lehmann")
    t = stats.paired_interval(cand, inc, 0.95, "t")
    assert stats.verdict(hl, 0.03) == "improved"
    assert stats.verdict(t, 0.03) != "improved"
    assert hl.low < hl.speedup < hl.high


def test_interval_is_symmetric_under_swapping_roles():
    rng = np.random.default_rng(1)
    a = 100 * np.exp(rng.normal(0.05, 0.03, 9))
    b = 100 * np.exp(rng.normal(0.0, 0.03, 9))
    ab = stats.paired_interval(a, b)
    ba = stats.paired_interval(b, a)
    assert ab.speedup == pytest.approx(1 / ba.speedup)
    assert ab.low == pytest.approx(1 / ba.high)


@pytest.mark.parametrize(
    "low,high,expected",
    [
        (1.05, 1.2, "improved"),
        (0.8, 0.99, "regressed"),
        (0.98, 1.02, "equivalent"),
        # A slowdown within min_speedup is immaterial: equivalent, not regressed.
        (0.975, 0.995, "equivalent"),
        (0.97, 0.999, "equivalent"),
        # Slower and possibly by more than min_speedup: regressed.
        (0.95, 0.995, "regressed"),
        (0.90, 0.96, "regressed"),
        (0.99, 1.10, "inconclusive"),
        (1.01, 1.04, "inconclusive"),
    ],
)
def test_verdict_rules(low, high, expected):
    iv = stats.PairedInterval(math.sqrt(low * high), low, high, 6, 0.95, "t", 0.95)
    assert stats.verdict(iv, 0.03) == expected


def test_too_few_pairs_for_the_confidence_never_give_a_verdict():
    # 4 pairs: the widest rank interval covers only 1 - 2/16 = 87.5 %.
    iv = stats.paired_interval([150, 151, 149, 152], [100, 100, 100, 100], 0.95)
    assert iv.coverage == pytest.approx(0.875)
    assert stats.verdict(iv, 0.03) == "inconclusive"
    assert stats.needs_more_pairs(iv, 0.03, 8)
    six = stats.paired_interval([150, 151, 149, 152, 150, 151], [100] * 6, 0.95)
    assert six.coverage >= 0.95 and stats.verdict(six, 0.03) == "improved"


def test_needs_more_pairs_only_while_inconclusive_and_budget_left():
    iv = stats.PairedInterval(1.04, 0.99, 1.10, 6, 0.95, "t", 0.95)
    assert stats.needs_more_pairs(iv, 0.03, 12)
    assert not stats.needs_more_pairs(iv, 0.03, 6)
    done = stats.PairedInterval(1.10, 1.05, 1.2, 6, 0.95, "t", 0.95)
    assert not stats.needs_more_pairs(done, 0.03, 12)


def _heavy_tailed_runs(rng, n, effect):
    """Runs like this machine's: mostly within a few percent, sometimes far off."""
    noise = rng.normal(0, 0.03, n)
    wild = rng.random(n) < 0.1
    noise[wild] = rng.normal(0, 0.3, wild.sum())
    return 100 * np.exp(effect + noise)


def test_aa_false_improved_rate_is_below_target_on_synthetic_heavy_tailed_noise():
    rng = np.random.default_rng(7)
    trials, false_wins = 2000, 0
    for _ in range(trials):
        a, b = _heavy_tailed_runs(rng, 8, 0.0), _heavy_tailed_runs(rng, 8, 0.0)
        if stats.verdict(stats.paired_interval(a, b), 0.03) == "improved":
            false_wins += 1
    assert false_wins / trials <= 0.025


def _sequential(rng, effect, pairs=6, max_pairs=20, min_speedup=0.03):
    """The search's stopping rule: start with ``pairs``, add one while ``needs_more_pairs``."""
    a, b = [], []
    while True:
        a.extend(_heavy_tailed_runs(rng, 1, effect))
        b.extend(_heavy_tailed_runs(rng, 1, 0.0))
        if len(a) < pairs:
            continue
        iv = stats.paired_interval(a, b)
        if not stats.needs_more_pairs(iv, min_speedup, max_pairs):
            return stats.verdict(iv, min_speedup), iv.n


def test_planted_ten_percent_effect_is_detected_with_the_default_pair_budget():
    rng = np.random.default_rng(11)
    results = [_sequential(rng, math.log(1.10)) for _ in range(400)]
    assert sum(v == "improved" for v, _ in results) / len(results) >= 0.9


def test_sequential_aa_never_exceeds_the_false_win_target():
    rng = np.random.default_rng(12)
    results = [_sequential(rng, 0.0) for _ in range(400)]
    assert sum(v == "improved" for v, _ in results) / len(results) <= 0.025
    assert all(n <= 20 for _, n in results)


def test_paired_interval_rejects_bad_input():
    with pytest.raises(ValueError, match="unequal"):
        stats.paired_interval([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="positive"):
        stats.paired_interval([1, 0, 3], [1, 2, 3])
    with pytest.raises(ValueError, match="at least 2"):
        stats.paired_interval([1], [1])


def test_mser_cuts_a_warmup_ramp_and_flags_a_trend():
    cut = stats.steady_state([50, 80, 95, 100, 101, 99, 100, 102])
    assert cut.steady and 2 <= cut.start <= 3
    flat = stats.steady_state([100, 101, 99, 100, 100, 101])
    assert flat.steady and flat.start <= 3
    trend = stats.steady_state([10, 20, 30, 40, 50, 60, 70, 80])
    assert not trend.steady


def test_summarize_windows():
    s = stats.summarize_windows([1.0, 2.0, 3.0, 4.0])
    assert s["median"] == 2.5
    assert s["iqr"] == pytest.approx(1.5)
