"""Serial dependence of a confirmation's pairs: the estimate and the widening it gives."""

from __future__ import annotations

import math

import numpy as np

from trainopt.decide import dependence
from trainopt.decide.sequential import SequentialRule


def ar1(rng, rho, n, sd=0.06):
    x = np.empty(n)
    x[0] = rng.normal(0, sd)
    for i in range(1, n):
        x[i] = rho * x[i - 1] + math.sqrt(1 - rho * rho) * rng.normal(0, sd)
    return x


def test_the_bias_corrected_estimate_finds_ar1_dependence_that_the_raw_one_understates():
    rng = np.random.default_rng(1)
    raw, corrected = [], []
    for _ in range(2000):
        x = ar1(rng, 0.3, 16).tolist()
        raw.append(dependence.lag1(x))
        corrected.append(dependence.corrected_rho(x))
    assert np.mean(raw) < 0.2  # short series read low
    assert 0.28 <= np.mean(corrected) <= 0.5
    assert all(0.0 <= c <= dependence.MAX_RHO for c in corrected)


def test_inflation_is_the_ar1_variance_ratio_and_never_narrows():
    assert dependence.inflation([0.1, 0.2]) == 1.0  # too few pairs to say
    alternating = [0.1, -0.1] * 8
    assert dependence.corrected_rho(alternating) == 0.0 and dependence.inflation(alternating) == 1.0
    trend = [0.01 * i for i in range(16)]
    rho = dependence.corrected_rho(trend)
    assert rho == dependence.MAX_RHO
    assert math.isclose(dependence.inflation(trend), math.sqrt((1 + rho) / (1 - rho)))


def test_dependent_pairs_need_more_to_be_called_improved():
    # A drifting series whose mean clears the margin only if its pairs were independent.
    rng = np.random.default_rng(7)
    widened = plain = 0
    for _ in range(300):
        x = math.log(1.03) + ar1(rng, 0.3, 40)
        for rule, counter in ((SequentialRule(6, 40, 0.95, 0.03), "w"), (SequentialRule(6, 40, 0.95, 0.03, dependence=False), "p")):
            for n in range(1, 41):
                d = rule.decide(x[:n])
                if d.done:
                    break
            if d.verdict == "improved":
                if counter == "w":
                    widened += 1
                else:
                    plain += 1
    assert widened < plain
    assert widened / 300 <= 0.04
