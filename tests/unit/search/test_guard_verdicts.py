"""Error rates of the whole search with the stability guard on, as the CLI runs it (fake runner, known truth).

The guard judges a session by its incumbent arm; a pair session it flags is kept and marked,
never re-run, so the pairs a verdict rests on are the same with the guard on and off. The
offsets case is the one where re-running flagged pairs picked a biased sample: 1 % window
noise and +0.15 log offsets in 10 % of processes, the change exactly at the margin.
"""

from __future__ import annotations

import math

import pytest
from scipy.stats import binom

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, simulated_search
from trainopt.contract.spec import spec_from_dict

pytestmark = pytest.mark.simulation

OFFSETS = dict(window_sd=0.01, windows=8, session_sd=0.01, arm_sd=0.02, offsets=(0.10, 0.15))


def search(tmp_path, seed, effect, guard=True, **kw):
    measure = {"pairs": 6, "max_pairs": 40, "confidence": 0.95, "min_speedup": 0.03}
    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure=measure), "t.yaml", tmp_path)
    runner = FakeRunner({("amp", "bf16"): effect}, seed=seed, **kw)
    return simulated_search(spec, tmp_path, runner, guard=guard).run()


def amp(doc):
    return [d for d in doc["decisions"] if d["knob"] == "amp"]


def not_above(count, n, limit):
    """True unless ``count`` of ``n`` is significantly (p < 0.001) above the rate ``limit``."""
    return binom.sf(count - 1, n, limit) >= 0.001


def test_with_planted_offsets_the_guard_flags_sessions_but_the_verdicts_rest_on_the_same_pairs(tmp_path):
    n, wins, flagged = 300, 0, 0
    for seed in range(n):
        on = search(tmp_path, seed, 1.03, **OFFSETS)
        off = search(tmp_path, seed, 1.03, guard=False, **OFFSETS)
        # Same pairs, same verdicts: the guard chose none of them.
        assert [(d["verdict"], d["n_pairs"], d["speedup"]) for d in amp(on)] == \
               [(d["verdict"], d["n_pairs"], d["speedup"]) for d in amp(off)]
        wins += any(d["verdict"] == "improved" for d in amp(on))
        flagged += sum(1 for p in on["stability"]["points"] if not p["stable"] and p["role"] != "screen")
    assert flagged > 0  # the offsets were seen, and the sessions kept
    assert not_above(wins, n, 0.025), f"false improved in {wins}/{n}"


def test_pairs_of_a_drifting_machine_keep_false_wins_within_the_budget(tmp_path):
    # Each configuration's speed drifts as AR(1): lag-1 autocorrelation 0.3 of the pair log-ratios.
    n, wins = 400, 0
    for seed in range(n):
        doc = search(tmp_path, seed, 1.03, window_sd=0.02, windows=8, session_sd=0.01, arm_sd=0.0,
                     drift=(0.3, 0.06 / math.sqrt(2)))
        wins += any(d["verdict"] == "improved" for d in amp(doc))
    assert not_above(wins, n, 0.025), f"false improved in {wins}/{n}"


def test_a_clean_ten_percent_win_is_still_found_with_the_guard_on(tmp_path):
    n = 150
    found = sum(any(d["verdict"] == "improved" for d in amp(search(tmp_path, seed, 1.10, window_sd=0.02, windows=8,
                                                                       session_sd=0.01, arm_sd=0.09 / math.sqrt(2))))
                for seed in range(n))
    assert found / n >= 0.88, f"found {found}/{n}"
