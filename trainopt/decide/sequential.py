"""The sequential confirmation rule: when to stop adding pairs, and what may be claimed then.

A confirmation measures fresh pairs of incumbent and candidate, one log-ratio
``r = log(candidate / incumbent)`` per pair, and looks at the data as it grows. Looking
repeatedly and stopping on a good look inflates the error of any fixed-sample interval,
so this rule *spends* its error budget ``alpha = 1 - confidence`` over a schedule of
looks planned before any data is seen:

* The looks are at ``pairs``, then growing geometrically, and always at ``max_pairs``.
* Look ``k`` gets a two-sided level ``a_k`` with ``sum(a_k) <= alpha``: a fixed share
  (60 %) on the last look, where a real but modest win is decided, and the rest in equal
  parts over the earlier looks, where large effects stop early. A rank interval only
  reaches levels in discrete steps; what a look cannot use is carried to the next one,
  and the schedule depends on ``n`` alone, never on the data.
* At each look the interval is the exact Wilcoxon signed-rank (Hodges-Lehmann) interval
  at level ``1 - a_k``. It misses the true shift with probability at most ``a_k`` for
  any noise that is symmetric about the shift, whatever its scale or tails.

Two guarantees follow from the union bound, for *any* stopping rule over these looks:

* coverage: the interval reported at the stop misses the true shift with probability at
  most ``sum(a_k) <= alpha``, because it can only miss if some look's interval misses;
* false wins: ``improved`` needs the reported lower bound above ``1 + min_speedup``; if
  the true speedup is at most ``1 + min_speedup`` (an A/A pair in particular, where the
  randomised order makes the log-ratio symmetric about 0), some look's interval must lie
  entirely above the truth, which happens with probability at most
  ``sum(a_k) / 2 <= (1 - confidence) / 2``, at every noise level, budget and
  ``min_speedup >= 0``.

What ``improved`` claims, precisely: the rank interval bounds the pseudo-median of the
log-ratios, the typical pair's speedup, which equals their mean only for symmetric noise;
for skewed pair noise (uneven windows of loader-worker arms, a slow pair now and then) it
can lie above it, and so above the ratio of mean throughputs that a run pays for. So
``improved`` also needs the t-interval at the same level to clear ``1 + min_speedup``: it
bounds the mean log-ratio, which is at most the log of that ratio (Jensen). That lowers the
rate of false wins under skew but cannot bound it (a rare slow pair may be absent from a few
dozen pairs); the guarantees above are for symmetric noise, where it changes nothing they say.

The guarantees also assume independent pairs. A speed that drifts over minutes makes
successive pairs' log-ratios serially dependent, and their mean less certain than as many
independent pairs: the mean check is widened by the effective-sample-size factor from the
pairs' lag-1 autocorrelation (``decide.dependence``), which holds false wins at the margin
within the budget up to lag-1 autocorrelation 0.3 in simulation.

Because the guarantees hold for any stopping time, the rule may also stop for futility
(improvement practically ruled out) with a cheaper, unspent interval, or once even an
optimistic effect for the pairs still to come could not lift the last look's lower bound
above ``1 + min_speedup``, also at a look that may claim nothing; that only decides *when*
to stop, never what is claimed. The ``t`` method cannot be made distribution-free this way
(see ``SequentialRule``), so its ``improved`` and ``regressed`` claims also need the spent
rank interval to agree.

The reported speedup of an ``improved`` change is inflated by the stop itself (a look is
more likely to stop when its pairs happened to run high). ``holdout_estimate`` gives the
unbiased figure from extra fresh pairs measured *after* the verdict, which took no part
in it.

The exact signed-rank levels and Walsh-average bounds come from ``stats.ranks``; which
screened candidates are confirmed at all is ``decide.screen``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
from scipy.stats import norm as _norm
from scipy.stats import t as _t

from trainopt.decide import dependence
from trainopt.stats import intervals as stats
from trainopt.stats import ranks

__all__ = [
    "Look",
    "RuleDecision",
    "SequentialRule",
    "holdout_pairs",
    "typical_pairs",
    "holdout_estimate",
    "false_adoption",
    "scope_family",
]

CONTINUE = "continue"
STOP = "stop"


@dataclass(frozen=True)
class Look:
    """One planned look at the confirmation's pairs.

    Attributes:
        n: Number of pairs at this look.
        alpha: Two-sided error level spent here (0 when no interval at this ``n`` can
            reach the level planned so far; the budget then carries to the next look).
        spent: Total level spent up to and including this look.
    """

    n: int
    alpha: float
    spent: float


@dataclass(frozen=True)
class RuleDecision:
    """What the rule says after the pairs seen so far: another pair, or stop with a verdict.

    Attributes:
        action: ``continue`` (measure another pair) or ``stop``.
        verdict: One of ``stats.VERDICTS`` when stopping, else None.
        interval: The spent interval at this look (the one the verdict rests on); None
            between looks. Its ``confidence`` is the rule's overall confidence and its
            ``coverage`` the guaranteed coverage under the stopping rule,
            ``1 - sum(all a_k)``.
        n: Pairs seen.
        alpha_spent: Level spent on the looks up to and including this one.
        reason: Why the rule stopped or went on, in words.
    """

    action: str
    verdict: str | None
    interval: stats.PairedInterval | None
    n: int
    alpha_spent: float
    reason: str = ""

    @property
    def done(self) -> bool:
        return self.action == STOP


def _schedule(pairs: int, max_pairs: int, growth: float) -> list[int]:
    looks = [pairs]
    while looks[-1] < max_pairs:
        looks.append(min(max_pairs, max(looks[-1] + 1, math.ceil(looks[-1] * growth))))
    # A last step much shorter than the others adds a look that costs alpha for little
    # information: merge it into the final look.
    if len(looks) >= 3 and (looks[-1] - looks[-2]) < 0.5 * (looks[-2] - looks[-3]):
        looks.pop(-2)
    return looks


def _shares(ns: list[int], final_share: float, weight: float) -> list[float]:
    """Fraction of the budget planned for each look: ``final_share`` on the last, the
    rest over the earlier looks in proportion to ``n ** weight``."""
    if len(ns) == 1:
        return [1.0]
    w = np.asarray(ns[:-1], dtype=float) ** weight
    return [float(x) for x in (1.0 - final_share) * w / w.sum()] + [final_share]


class SequentialRule:
    """Alpha-spending confirmation over fresh pairs; see the module docstring.

    Args:
        pairs: First look (``measure.pairs``).
        max_pairs: Last look (``measure.max_pairs``).
        confidence: Overall confidence; the error budget is ``1 - confidence``.
        min_speedup: ``improved`` needs the lower bound above ``1 + min_speedup``.
        interval: ``hodges-lehmann`` (exact signed-rank, distribution-free under
            symmetry) or ``t``. With ``t`` the reported interval is the spent t-interval,
            whose level rests on near-normal log-ratios; since no t-interval can be
            guaranteed for every symmetric noise (with six equal-size log-ratios of one
            sign, a chance of 1/64, its interval excludes 0 at any level), ``improved``
            and ``regressed`` also need the spent rank interval to agree, which keeps
            the false-win guarantee.
        family: Number of confirmations sharing the budget for one knob (Bonferroni):
            each gets ``(1 - confidence) / family``.
        growth: Ratio between successive look sizes.
        final_share: Share of the budget planned for the last look.
        weight: Earlier looks share the rest in proportion to ``n ** weight`` (0: equally).
        futility_confidence: Stop early once the unspent interval at this level lies
            below ``1 + min_speedup`` (the candidate cannot be adopted). It only decides
            when to stop; every claim rests on the spent interval. None disables it.
        projection_confidence: Also stop early once the last look could not call the
            candidate ``improved`` even if every pair still to come had the mean log-ratio
            of this one-sided upper bound (t, from the pairs so far): the projected mean at
            ``max_pairs`` minus the last look's normal half-width at the observed sd stays
            below ``log(1 + min_speedup)``. This ends the confirmations of changes of a
            few per cent, which otherwise run to the budget (with 40 pairs at a pair sd
            of 0.09: 29 pairs on average at a true 1.035, 21 with it), at a cost in
            power of under half a point at normal noise. Like futility it only decides
            when to stop. None disables it.
        mean_agrees: With ``hodges-lehmann``, ``improved`` also needs the t-interval at
            the same level to clear ``1 + min_speedup``: the rank interval bounds the
            pairs' pseudo-median, the t-interval their mean log-ratio, and only the mean
            is bounded by the ratio of mean throughputs that a user's run pays for
            (see the module docstring). False: the rank interval alone.
        dependence: Widen the t-interval for the serial dependence of the pairs
            (``decide.dependence.inflation``: the effective-sample-size factor from their
            bias-corrected lag-1 autocorrelation): the mean check that ``improved`` needs
            (and, with ``t``, the reported interval), so drifting speed cannot make pairs
            look more certain than they are. The rank interval is left as it is: it is
            the reported one, and widening it too cost a further 2-3 points of power on two
            +10 % wins for no fewer false wins. False: pairs taken as independent.
    """

    def __init__(
        self,
        pairs: int,
        max_pairs: int,
        confidence: float = 0.95,
        min_speedup: float = 0.03,
        interval: str = "hodges-lehmann",
        *,
        family: int = 1,
        growth: float = 1.5,
        final_share: float = 0.6,
        weight: float = 0.0,
        futility_confidence: float | None = 0.5,
        projection_confidence: float | None = 0.99,
        mean_agrees: bool = True,
        dependence: bool = True,
    ):
        if pairs < 2 or max_pairs < pairs:
            raise ValueError(f"need 2 <= pairs <= max_pairs, got pairs={pairs}, max_pairs={max_pairs}")
        if not 0.5 <= confidence < 1:
            raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
        if min_speedup < 0:
            raise ValueError(f"min_speedup must be >= 0, got {min_speedup}")
        if interval not in ("hodges-lehmann", "t"):
            raise ValueError(f"unknown interval method {interval!r}; use hodges-lehmann or t")
        if family < 1:
            raise ValueError(f"family must be >= 1, got {family}")
        self.pairs, self.max_pairs = int(pairs), int(max_pairs)
        self.confidence = float(confidence)
        self.alpha = (1.0 - confidence) / family
        self.min_speedup = float(min_speedup)
        self.method = interval
        self.family = family
        self.futility_confidence = futility_confidence
        self.projection_confidence = projection_confidence
        self.mean_agrees = mean_agrees
        self.dependence = dependence
        self.looks = self._plan(_schedule(self.pairs, self.max_pairs, growth), final_share, weight)
        self._by_n = {look.n: look for look in self.looks}
        # Guaranteed coverage of whatever interval is reported at the stop.
        self.coverage = 1.0 - self.looks[-1].spent

    @classmethod
    def from_measure(cls, measure: Any, **kwargs) -> "SequentialRule":
        """Build from the spec's ``measure`` section (a MeasureSection or its dict)."""
        m = measure if isinstance(measure, dict) else measure.model_dump()
        return cls(m["pairs"], m["max_pairs"], m["confidence"], m["min_speedup"], m["interval"], **kwargs)

    def _plan(self, ns: list[int], final_share: float, weight: float) -> tuple[Look, ...]:
        looks, carry, spent = [], 0.0, 0.0
        shares = _shares(ns, final_share, weight)
        for n, share in zip(ns, shares):
            budget = self.alpha * share + carry
            k, rank_level = ranks.exact_rank_level(n, budget)
            # A t look spends its whole budget, but only where a rank interval exists
            # too: its improved/regressed claims need the rank interval to agree.
            level = (budget if k else 0.0) if self.method == "t" else rank_level
            carry = budget - level
            spent += level
            looks.append(Look(n, level, spent))
        return tuple(looks)

    # ---- intervals ----------------------------------------------------------------

    def interval_at(self, r: Sequence[float], level: float, method: str | None = None) -> stats.PairedInterval | None:
        """The interval at two-sided error ``level`` from log-ratios (None if unreachable)."""
        method = method or self.method
        x = np.asarray(r, dtype=float)
        n = len(x)
        if n < 2 or level <= 0:
            return None
        if method == "t":
            ones = np.ones(n)
            return stats.paired_interval(np.exp(x), ones, 1.0 - level, "t")
        k, achieved = ranks.exact_rank_level(n, level)
        if k == 0:
            return None
        est, low, high = ranks.rank_interval(x, k)
        return stats.PairedInterval(math.exp(est), math.exp(low), math.exp(high), n, 1.0 - level, "hodges-lehmann", 1.0 - achieved)

    def _claimable(self, x: np.ndarray, look: Look) -> stats.PairedInterval:
        """The spent interval at a look (a t-interval widened for serial dependence), relabelled with the rule's overall guarantee."""
        iv = self.interval_at(x, look.alpha)
        if self.method == "t":
            iv = _widened(iv, self._inflation(x))
        return stats.PairedInterval(iv.speedup, iv.low, iv.high, iv.n, self.confidence, iv.method, self.coverage)

    def _inflation(self, x: np.ndarray) -> float:
        """How much serial dependence of the pairs widens a claim's interval (1: none; ``decide.dependence``)."""
        return dependence.inflation(x.tolist()) if self.dependence else 1.0

    def _verdict(self, x: np.ndarray, look: Look, iv: stats.PairedInterval) -> str:
        v = stats.verdict(iv, self.min_speedup)
        if self.method == "t" and v in ("improved", "regressed"):
            rank = self.interval_at(x, look.alpha, "hodges-lehmann")
            if stats.verdict(rank, self.min_speedup) != v:
                return "inconclusive"
        if self.method == "hodges-lehmann" and v == "improved" and self.mean_agrees:
            # The rank interval bounds the pairs' pseudo-median; for skewed pair noise (80 %
            # of pairs at +0.06 and 20 % at -0.24 in log) that lies above their mean. The
            # t-interval's lower bound at the same level bounds the mean log-ratio, which is
            # at most the log of the ratio of mean throughputs: both must clear the margin
            # (at 2 % noise, 12 % false wins instead of 15 % for the 80/20 mixture at the
            # margin and 37 % instead of 48 % for 10 % slow pairs, for under half a point of
            # power at normal noise; benchmarks/search_verdicts.py --table skew).
            # Serially dependent pairs (a speed that drifts over minutes) are worth fewer
            # independent ones: the mean check is widened by their effective sample size
            # (decide.dependence), which holds false wins at the margin to the budget up to
            # lag-1 autocorrelation 0.3 (benchmarks/guard_verdicts.py --cases ar1).
            mean = _widened(self.interval_at(x, look.alpha, "t"), self._inflation(x))
            if mean is None or stats.verdict(mean, self.min_speedup) != "improved":
                return "inconclusive"
        return v

    # ---- the rule -----------------------------------------------------------------

    def next_look(self, n: int) -> int:
        """The pair count at which the rule can next stop, after ``n`` pairs.

        Between looks the rule always goes on, so every pair up to this count will be
        needed: they can be measured together. A look that cannot spend anything counts
        only while a futility stop is on (it may stop there, claiming nothing).
        """
        # A look that spends nothing can still stop for futility (a claim needs no level
        # there), so it is a look while a futility stop is on.
        futile_stops = self.futility_confidence is not None or self.projection_confidence is not None
        for look in self.looks:
            if look.n > n and (look.alpha > 0 or look.n == self.max_pairs or futile_stops):
                return look.n
        return self.max_pairs

    def assess(self, candidate: Sequence[float], incumbent: Sequence[float]) -> Any:
        """The ``confirmation.DecisionRule`` view of ``decide``, from paired throughputs."""
        from trainopt.decide.confirmation import Assessment

        d = self.decide([math.log(c / i) for c, i in zip(candidate, incumbent)])
        return Assessment(done=d.done, verdict=d.verdict, interval=d.interval, reason=d.reason)

    def decide(self, log_ratios: Sequence[float]) -> RuleDecision:
        """Stop with a verdict, or ask for another pair.

        Args:
            log_ratios: ``log(candidate / incumbent)`` of every pair so far, in order.

        Returns:
            The decision; the verdict and interval are set when it stops.
        """
        x = np.asarray(log_ratios, dtype=float)
        n = len(x)
        if not np.all(np.isfinite(x)):
            raise ValueError("log-ratios must be finite")
        if n > self.max_pairs:
            raise ValueError(f"{n} pairs exceed max_pairs {self.max_pairs}")
        look = self._by_n.get(n)
        spent = max([lk.spent for lk in self.looks if lk.n <= n], default=0.0)
        if look is None:
            return RuleDecision(CONTINUE, None, None, n, spent, "between looks")
        if look.alpha <= 0 and n < self.max_pairs:
            # Nothing can be claimed here (no rank level within what this look may spend),
            # but a candidate that cannot be adopted need not run on: no interval is
            # reported, the reason carries the estimate.
            futile = self._futile(x)
            if futile:
                est = math.exp(float(np.median(ranks.walsh_averages(x))))  # the Hodges-Lehmann estimate
                return RuleDecision(STOP, "inconclusive", None, n, spent, f"{est:.3f}x over {n} pairs; {futile}")
            return RuleDecision(CONTINUE, None, None, n, spent, "a look that spends nothing: nothing to claim yet")
        if look.alpha <= 0:
            # Only possible when the whole budget cannot reach any rank level at
            # max_pairs (e.g. 3 pairs at 95 %): nothing can be claimed.
            est = float(np.median(x)) if n else 0.0
            iv = stats.PairedInterval(math.exp(est), 0.0, math.inf, n, self.confidence, self.method, 1.0)
            return RuleDecision(STOP, "inconclusive", iv, n, spent, f"{n} pairs cannot reach {self.confidence:.0%} confidence")
        iv = self._claimable(x, look)
        v = self._verdict(x, look, iv)
        if v in ("improved", "regressed", "equivalent"):
            return RuleDecision(STOP, v, iv, n, spent, f"{v} at look n={n} (level {look.alpha:.4f} spent here)")
        if n >= self.max_pairs:
            return RuleDecision(STOP, v, iv, n, spent, f"pair budget {self.max_pairs} reached")
        futile = self._futile(x)
        if futile:
            return RuleDecision(STOP, v, iv, n, spent, futile)
        return RuleDecision(CONTINUE, None, iv, n, spent, "interval straddles a boundary")

    def _futile(self, x: np.ndarray) -> str | None:
        """Why the candidate cannot be adopted any more (stop for futility), or None."""
        n = len(x)
        if self.futility_confidence is not None:
            fut = self.interval_at(x, 1.0 - self.futility_confidence)
            if fut is not None and fut.high < 1.0 + self.min_speedup:
                return f"improvement ruled out: {self.futility_confidence:.0%} upper bound {fut.high:.3f}"
        projected = self._projected_low(x)
        if projected is not None and projected < math.log1p(self.min_speedup):
            return (f"improvement ruled out: with {self.max_pairs - n} more pairs at the {self.projection_confidence:.0%} "
                    f"upper bound, the last look's lower bound would be {math.exp(projected):.3f}")
        return None

    def _projected_low(self, x: np.ndarray) -> float | None:
        """The last look's lower bound (log scale) if the pairs still to come were optimistic.

        The pairs to come are given the mean of the one-sided ``projection_confidence``
        upper bound of the pairs so far; the last look's half-width is the normal one at
        its spent level and the observed sd (a rank interval is about as wide for normal
        noise). None when the projection does not apply (off, too few pairs, no spread, or
        a last look that cannot claim anything).
        """
        n, big = len(x), self.max_pairs
        last = self.looks[-1].alpha
        if self.projection_confidence is None or n < 3 or n >= big or last <= 0:
            return None
        sd = float(np.std(x, ddof=1))
        if sd <= 0:
            return None
        mean = float(np.mean(x))
        upper = mean + float(_t.ppf(self.projection_confidence, n - 1)) * sd / math.sqrt(n)
        projected_mean = (n * mean + (big - n) * upper) / big
        return projected_mean - float(_norm.ppf(1.0 - last / 2.0)) * sd / math.sqrt(big)


def _widened(iv: stats.PairedInterval | None, factor: float) -> stats.PairedInterval | None:
    """``iv`` with both half-widths (log scale, around its estimate) times ``factor``."""
    if iv is None or factor <= 1.0 or not (iv.low > 0 and math.isfinite(iv.high)):
        return iv
    est = math.log(iv.speedup)
    low = est - factor * (est - math.log(iv.low))
    high = est + factor * (math.log(iv.high) - est)
    return stats.PairedInterval(iv.speedup, math.exp(low), math.exp(high), iv.n, iv.confidence, iv.method, iv.coverage)


# ---- unbiased figures -----------------------------------------------------------------


def typical_pairs(rule: "SequentialRule", max_pairs: int) -> int:
    """Pairs a confirmation typically takes, for the ETA: midway between the rule's first
    look that can decide and ``max_pairs`` (a clear effect stops at the first look, a
    small or absent one runs on towards the budget)."""
    return int(math.ceil((rule.next_look(0) + max_pairs) / 2))


def holdout_pairs(confidence: float = 0.95, method: str = "hodges-lehmann", minimum: int = 6) -> int:
    """Extra pairs measured after an ``improved`` verdict, for the reported speedup.

    The smallest count whose exact rank interval reaches ``confidence`` (6 at 95 %), so
    the held-out estimate comes with a valid interval of its own, and at least
    ``minimum``.
    """
    n = max(2, minimum)
    if method == "t":
        return n
    while ranks.exact_rank_level(n, 1.0 - confidence)[0] == 0:
        n += 1
    return n


def holdout_estimate(log_ratios: Sequence[float], confidence: float = 0.95, method: str = "hodges-lehmann") -> stats.PairedInterval:
    """Speedup and interval from pairs that took no part in the verdict.

    Selection (the screen, the stop) acted only on earlier pairs, so this estimate is
    unbiased for the kept change and its interval has its plain nominal coverage.
    """
    x = np.asarray(log_ratios, dtype=float)
    return stats.paired_interval(np.exp(x), np.ones(len(x)), confidence, method)


# ---- the error of a whole search ------------------------------------------------------


def scope_family(scope: str, knobs: int) -> int:
    """How many parts a knob's error budget is split into by ``measure.error_scope``.

    ``knob``: 1, each knob spends the whole budget; ``search``: one part per knob of the
    search, so the budgets of all its knobs add up to one.
    """
    return max(1, int(knobs)) if scope == "search" else 1


def false_adoption(confidence: float, knobs: int, scope: str = "knob") -> dict[str, Any]:
    """The chance of adopting a change without effect, per knob and for a whole search.

    A knob's confirmations share ``(1 - confidence) / scope_family`` (``SequentialRule``'s
    ``family``), and a change no faster than ``1 + min_speedup`` is called ``improved``
    with at most half of it; over ``knobs`` knobs the union bound adds them up. With
    ``scope: search`` the whole search adopts no change without effect with probability at
    least ``1 - (1 - confidence) / 2``.

    Returns:
        ``{scope, knobs, per_knob, search}``: the bounds (``search`` capped at 1).
    """
    per_knob = (1.0 - confidence) / 2.0 / scope_family(scope, knobs)
    return {"scope": scope, "knobs": int(knobs), "per_knob": per_knob, "search": min(1.0, per_knob * max(1, int(knobs)))}
