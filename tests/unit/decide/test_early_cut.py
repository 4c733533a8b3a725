"""The early cut of a session's far-slower arms: which arms it may retire, and when."""

from __future__ import annotations

import math
import random

from trainopt.decide.session_plan import (
    FIRST_WINDOW_FAST,
    HOPELESS,
    cuttable_arms,
    hopeless_arms,
    session_role,
)

BASE = {"batch_size": 32, "amp": "off"}
FAST = {"batch_size": 256, "amp": "bf16"}
SLOW = {"batch_size": 32, "amp": "fp16"}


def ids(role, n):
    return [f"{role}/amp/tag/arm{i}-hash{i}" for i in range(n)]


def test_the_role_is_read_from_a_search_trial_id_and_is_empty_otherwise():
    assert session_role("holdout/amp/abc-vs-def/pair0/arm2/123abc") == "holdout"
    assert session_role("screen/amp/screen/abc") == "screen"
    assert session_role("arm1") == ""
    assert session_role("") == ""


def test_only_a_screens_candidates_may_be_cut():
    assert cuttable_arms(ids("screen", 3), [BASE, SLOW, BASE]) == [False, True, False]
    # Every arm of a confirmation, a held-out session (its baseline arm too) or the final
    # check gives a figure that a comparison needs.
    for role in ("confirm", "holdout", "final"):
        assert cuttable_arms(ids(role, 3), [FAST, SLOW, BASE]) == [False, False, False]
    # Outside a search (no role in the id) a session cuts like a screen.
    assert cuttable_arms(["a", "b"], [BASE, SLOW]) == [False, True]
    assert cuttable_arms([], []) == []


def test_a_held_out_baseline_arm_far_below_the_incumbent_is_measured_in_full():
    # The incumbent after amp and batch size is 4x the baseline: the baseline arm of a
    # held-out session is the final check's figure and must not be cut.
    windows = [[4000.0, 4010.0], [4400.0, 4390.0], [1000.0, 1002.0]]
    protected = cuttable_arms(ids("holdout", 3), [FAST, {**FAST, "compile": "default"}, BASE])
    assert hopeless_arms(windows, protected) == []
    assert hopeless_arms(windows) == [2]


def test_a_fast_first_window_of_the_incumbent_never_cuts_a_fair_candidate():
    # The incumbent's first window at 1.5x its later ones, a candidate at 0.55x the
    # incumbent's steady rate whose own first window is slow too: not cut, in any round.
    inc = [1500.0, 1000.0, 1000.0]
    cand = [0.55 * 1000.0 * 0.95, 550.0, 552.0]
    for r in (1, 2, 3):
        assert hopeless_arms([inc[:r], cand[:r]]) == []


def test_the_cut_is_a_ratio_and_means_the_same_at_any_speed():
    rng = random.Random(1)
    for _ in range(200):
        scale = math.exp(rng.uniform(-5, 8))
        ratio = rng.uniform(0.05, 1.0)
        inc = [scale * math.exp(rng.gauss(0, 0.02)) for _ in range(2)]
        cand = [ratio * scale * math.exp(rng.gauss(0, 0.02)) for _ in range(2)]
        expected = hopeless_arms([[x / scale for x in inc], [x / scale for x in cand]])
        assert hopeless_arms([inc, cand]) == expected


def test_a_far_slower_arm_is_cut_after_one_window_and_a_half_rate_one_after_two():
    slow = [[1000.0], [0.08 * 1000.0]]
    assert hopeless_arms(slow) == [1]
    half = [[1000.0], [0.45 * 1000.0]]
    assert hopeless_arms(half) == []
    assert hopeless_arms([[1000.0, 980.0], [450.0, 440.0]]) == [1]
    # Exactly at the boundaries: not cut.
    assert hopeless_arms([[900.0], [900.0 * HOPELESS / FIRST_WINDOW_FAST]]) == []
    assert hopeless_arms([[900.0, 1000.0], [450.0, 400.0]]) == []
