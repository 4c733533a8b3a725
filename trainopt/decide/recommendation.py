"""Which settings a search recommends (``best`` in results.json and best.yaml), and why.

Every kept change was confirmed ``improved`` against its incumbent, so the final settings
(the baseline with every kept change) are recommended unless the final check, fresh pairs
of those settings against the baseline, *contradicts* them (``check_claim``): the kept
changes claim together at least the product of their deciding intervals' lower bounds
(each above ``1 + min_speedup``), and the final check contradicts that claim when its exact
one-sided upper bound at ``1 - CONTRADICTION_LEVEL`` lies below it: the combination is then
shown slower than what the kept changes promise, no faster than the baseline included. A
single kept change claims only ``1 + min_speedup`` (``claimed_speedup``): its fallback is the
baseline, so fresh pairs drop it only when they show it no faster than the margin, not when it
is merely slower than a deciding interval that stopped early on a few pairs and ran high.

Error rates, for noise symmetric about the truth (the exact signed-rank bound needs no
more): if every kept change is at least as fast as its lower bound says, a final check
contradicts them with probability at most ``CONTRADICTION_LEVEL`` (5 %); real wins sit well
above their lower bounds, so the rate at them is far lower. The other error, keeping a
combination no faster than the baseline, depends on the noise: with two or more kept
changes the final check gets enough pairs (``final_pairs``, from the pair noise the
confirmations measured) to catch a combination no faster than the baseline in at least
``CONTRADICTION_POWER`` (90 %) of searches. With a single kept change the final check
measures exactly the comparison its confirmation decided, with that change's 6 held-out
pairs, and catches only what those can show.

Hence, in order:

1. ``final-check``: the final check does not contradict the final settings: they are
   recommended, with the final check's figure and interval.
2. ``first-kept-change``: otherwise (contradicted, failed, or not run yet) the baseline plus
   the first kept change, the other settings confirmed against the baseline itself, unless
   those are the settings the final check contradicted or their own held-out pairs
   contradict them by the same rule.
3. ``baseline``: otherwise the baseline.

A kept change that the training check drops (it made the recommended settings train
differently) is left out of every step above; the search then checks the remaining
settings again, speed and training alike.

Pure: plain data in, plain data out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np
from scipy.stats import chi2, norm
from scipy.stats import t as student_t

from trainopt.decide import plan
from trainopt.decide.verdict import Decision
from trainopt.stats import ranks

__all__ = [
    "CONTRADICTION_LEVEL",
    "CONTRADICTION_POWER",
    "SOURCES",
    "ClaimCheck",
    "Recommendation",
    "check_claim",
    "claim_sentence",
    "claimed_speedup",
    "final_pairs",
    "pooled_pair_sd",
    "recommend",
    "settings_after",
]

SOURCES = ("final-check", "first-kept-change", "baseline")

# One-sided level of the contradiction test: the chance that a final check contradicts
# kept changes that are each at least as fast as their confirmed lower bound.
CONTRADICTION_LEVEL = 0.05
# The chance, planned for with two or more kept changes, that a final check catches a
# combination no faster than the baseline.
CONTRADICTION_POWER = 0.90
# Asymptotic efficiency of the signed-rank interval against the mean's under normal noise
# (3 / pi): it needs about 1 / 0.955 times the pairs of a t-test for the same power.
_RANK_EFFICIENCY = 3.0 / math.pi


@dataclass(frozen=True)
class ClaimCheck:
    """The final check (or a held-out set) against what the kept changes claim together.

    Attributes:
        claim: The speedup claimed: the product of the kept changes' deciding lower bounds.
        upper: The pairs' exact one-sided upper bound at ``1 - level`` (None: too few pairs).
        level: The one-sided level reached (at most ``CONTRADICTION_LEVEL``).
        contradicted: ``upper`` lies below ``claim``.
        n_pairs: Pairs behind ``upper``.
    """

    claim: float
    upper: float | None
    level: float
    contradicted: bool
    n_pairs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def claimed_speedup(kept: Sequence[Decision], margin: float | None = None) -> float:
    """What kept changes claim together: the product of their deciding intervals' lower bounds.

    Each lower bound is above ``1 + min_speedup`` (an ``improved`` verdict needs it); the
    deciding interval is the confirmation's, kept in ``extra.decision_interval`` once a
    held-out figure replaces it. A single change, given ``margin`` (``1 + min_speedup``),
    claims only that margin: its fallback is the baseline, so fresh pairs should drop it only
    when they show it no faster than the margin, not when it is merely slower than its
    deciding interval promised (an interval that stopped early, on a few pairs, can run high
    while the change is still a large win).
    """
    if margin is not None and len(kept) == 1:
        return margin
    claim = 1.0
    for d in kept:
        iv = d.extra.get("decision_interval") if isinstance(d.extra, dict) else None
        low = (iv or {}).get("ci", [None])[0] if iv else (d.ci[0] if d.ci else None)
        if low is not None and low > 0:
            claim *= low
    return claim


def claim_sentence(check: Mapping[str, Any], single: bool) -> str:
    """The contradiction test in plain words, for the summary, the report and the reasons.

    Args:
        check: ``ClaimCheck.to_dict()`` (``claim``, ``upper``, ``level``, ``contradicted``).
        single: One kept change (its claim is the margin ``1 + min_speedup``), not a combination.
    """
    what = "the change" if single else "the combination"
    claim = (f"the {check['claim']:.3f}x margin a single change must clear" if single
             else f"the {check['claim']:.3f}x its changes claim together (the product of their confirmed lower bounds)")
    if check.get("upper") is None:
        return f"too few fresh pairs to test {what} against {claim}"
    if check.get("contradicted"):
        return (f"fresh pairs show {what} slower than {claim}: at most {check['upper']:.3f}x "
                f"with {100 * (1 - check['level']):.0f} % confidence")
    return f"fresh pairs do not show {what} slower than {claim}"


def check_claim(log_ratios: Sequence[float], claim: float, level: float = CONTRADICTION_LEVEL) -> ClaimCheck:
    """Whether fresh pairs contradict a claimed speedup (the rule in this module's docstring).

    Args:
        log_ratios: ``log(candidate / baseline)`` of pairs that no decision used.
        claim: The claimed speedup (``claimed_speedup``).
        level: One-sided error level: the chance of a contradiction when the truth is at
            least ``claim`` and the noise symmetric about it.
    """
    x = np.asarray(log_ratios, dtype=float)
    k, achieved = ranks.exact_rank_level(len(x), 2.0 * level) if len(x) >= 2 else (0, 0.0)
    if k == 0:
        return ClaimCheck(claim, None, 0.0, False, len(x))
    upper = math.exp(ranks.rank_interval(x, k)[2])
    return ClaimCheck(claim, upper, achieved / 2.0, upper < claim, len(x))


def final_pairs(claim: float, pair_sd: float | None, minimum: int, maximum: int, *, level: float = CONTRADICTION_LEVEL,
                power: float = CONTRADICTION_POWER) -> int:
    """Pairs for a final check to catch a combination no faster than the baseline with probability ``power``.

    The contradiction test at ``level`` against ``claim`` must reject a true speedup of 1:
    about ``((q(1 - level) + q(power)) * sd / log(claim))^2`` pairs for a normal mean
    (``q``: Student t quantiles at the pairs' degrees of freedom), divided by the
    signed-rank test's efficiency (0.955). Chosen before any of the final
    check's pairs is seen, from the pair noise the confirmations measured, so the check's
    interval keeps its fixed-sample coverage.

    Args:
        claim: What the kept changes claim together (``claimed_speedup``).
        pair_sd: The sd of one pair's log-ratio (``pooled_pair_sd``), or None if unknown.
        minimum: The fewest pairs (the spec's ``pairs``, and a valid interval's 6).
        maximum: The most pairs (``max_pairs``).
    """
    if pair_sd is None or claim <= 1.0:
        return minimum
    z = float(norm.ppf(1.0 - level) + norm.ppf(power))
    n = max(minimum, math.ceil((z * pair_sd / math.log(claim)) ** 2 / _RANK_EFFICIENCY))
    for _ in range(20):
        # Few pairs: the t quantiles at n - 1 degrees of freedom, not the normal ones
        # (with the normal ones, a planted case meant to be caught in 90 % was caught in 82 %).
        if n >= maximum:
            break
        q = float(student_t.ppf(1.0 - level, max(n - 1, 1)) + student_t.ppf(power, max(n - 1, 1)))
        nxt = math.ceil((q * pair_sd / math.log(claim)) ** 2 / _RANK_EFFICIENCY)
        if nxt <= n:
            break
        n = nxt
    return max(minimum, min(maximum, n))


def pooled_pair_sd(decisions: Sequence[Decision], upper: float = 0.8) -> float | None:
    """The sd of one pair's log-ratio pooled over every confirmation (``extra.pair_sd``), at its ``upper`` bound.

    Raised to its one-sided ``upper`` confidence bound (chi-square, the pooled degrees of
    freedom): a confirmation that stopped early stopped more often on pairs that happened
    to agree, so their spread runs low (0.085 on average against a true 0.09 in the
    searches simulated by ``benchmarks/final_check.py``). None when nothing was confirmed.
    """
    num = den = 0.0
    for d in decisions:
        got = d.extra.get("pair_sd") if isinstance(d.extra, dict) else None
        if got and got.get("n", 0) >= 2:
            num += (got["n"] - 1) * got["sd"] ** 2
            den += got["n"] - 1
    if not den:
        return None
    return math.sqrt(num / float(chi2.ppf(1.0 - upper, den)))


@dataclass(frozen=True)
class Recommendation:
    """The recommended settings with the evidence behind them.

    Attributes:
        settings: Every knob's value.
        source: One of ``SOURCES``: which confirmation backs these settings.
        reason: One sentence saying why these settings and not others.
        samples_per_s: Their median throughput in that confirmation (the baseline's own when
            ``source`` is ``baseline``; None when not measured yet).
        speedup: Their speedup over the baseline (1.0 for the baseline).
        ci: The interval of that speedup, or None.
        n_pairs: Pairs behind the interval.
    """

    settings: dict[str, Any]
    source: str
    reason: str
    samples_per_s: float | None
    speedup: float | None
    ci: list[float] | None
    n_pairs: int


def settings_after(baseline: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """The baseline with one decision's change applied (grad_accum too for a batch change)."""
    out = plan.with_knob(baseline, decision.knob, decision.to_value)
    if "grad_accum" in decision.extra:
        out["grad_accum"] = decision.extra["grad_accum"]
    return out


def _pairs(d: Decision) -> int:
    """Pairs behind a kept change's reported speedup: its held-out pairs when it has them
    (the figure comes from those), else the pairs that decided it."""
    held = d.extra.get("holdout") if isinstance(d.extra, dict) else None
    return int(held["n_pairs"]) if held and held.get("n_pairs") else d.n_pairs


def _change(d: Decision) -> str:
    ci = f" [{d.ci[0]:.3f}, {d.ci[1]:.3f}]" if d.ci else ""
    held = " held-out" if isinstance(d.extra, dict) and d.extra.get("holdout") else ""
    speed = f", {d.speedup:.3f}x{ci} over {_pairs(d)}{held} pairs" if d.speedup is not None else ""
    return f"{d.knob} {d.from_value} -> {d.to_value}{speed}"


def recommend(
    baseline: Mapping[str, Any], baseline_samples_per_s: float | None, decisions: Sequence[Decision], final: Mapping[str, Any],
    dropped: Sequence[str] = (),
) -> Recommendation:
    """Choose the recommended settings by the rule in this module's docstring.

    Knobs in ``dropped`` are left out whatever their speed: their kept changes made the
    recommended settings train differently (``trainopt.decide.training_check``). A final
    check of settings that change one of them is not used, and the fallback skips them.

    Args:
        baseline: The baseline's settings.
        baseline_samples_per_s: The baseline's throughput (None before it is measured).
        decisions: Every decision so far, in order.
        final: The final check (``settings``, ``verdict``, ``reason``, ``speedup``, ``ci``,
            ``n_pairs``, ``samples_per_s``, and ``contradicted``: whether its pairs contradict
            the kept changes, False only when it measured them and they stand), or empty
            while the search is still running.
        dropped: Knobs the training check dropped.
    """
    if dropped and any((final.get("settings") or {}).get(k) != baseline.get(k) for k in dropped):
        final = {}
    verdict = final.get("verdict")
    if final and verdict != "unchanged" and final.get("contradicted") is False:
        return Recommendation(
            dict(final["settings"]), "final-check",
            "every kept change: the final check does not contradict them",
            final.get("samples_per_s"), final.get("speedup"), final.get("ci"), final.get("n_pairs") or 0,
        )
    kept = [d for d in decisions if d.kept and d.knob not in dropped]
    checked_and_failed = ""
    if final and verdict != "unchanged":
        # The final check's own line gives its figures; the reason only says what it did.
        if (final.get("claim_check") or {}).get("contradicted"):
            checked_and_failed = "the final check contradicts " + ("the kept changes together" if len(kept) > 1 else "the kept change")
        else:
            checked_and_failed = f"the final check of the combined settings said {verdict}"
    if kept:
        first = kept[0]
        candidate = settings_after(baseline, first)
        tested_by_final = bool(final) and plan.settings_hash(candidate) == plan.settings_hash(final.get("settings") or {})
        held = first.extra.get("holdout") if isinstance(first.extra, dict) else None
        own = held.get("check") if held else None
        if not tested_by_final and own and own.get("contradicted"):
            checked_and_failed += (f"{'; ' if checked_and_failed else ''}the held-out pairs of {first.knob}={first.to_value} "
                                   f"contradict it too ({claim_sentence(own, single=True)})")
        elif not tested_by_final:
            lead = f"{checked_and_failed}; " if checked_and_failed else ("the final check has not run yet; " if not final else "")
            return Recommendation(
                candidate, "first-kept-change",
                f"{lead}these are the other settings confirmed against the baseline: {_change(first)}",
                first.after_samples_per_s, first.speedup, first.ci, _pairs(first),
            )
    if checked_and_failed:
        reason = f"{checked_and_failed}; no other settings were confirmed against the baseline, so the baseline stays"
    elif final:
        reason = final.get("reason") or "no change was confirmed as an improvement; the baseline stays"
    else:
        reason = "no change has been confirmed as an improvement yet; the baseline stays"
    return Recommendation(dict(baseline), "baseline", reason, baseline_samples_per_s, 1.0 if final else None, None, 0)
