"""Serial dependence in a long real A/A series of measurement sessions, and what it does to the rule.

The confirmation's pairs come one after another from fresh sessions on one machine. If the
machine's speed for one configuration wanders over minutes, successive pairs' log-ratios
share part of their noise and the rule's intervals are too narrow. This script sizes that
on a measured series (``sessions.py --json``: ``interleaved_log_ratios`` in the order they
were measured) and runs the rule the search uses on it.

Printed:

* the series: pairs, mean, sd, lag-1 autocorrelation (raw, and as ``decide.dependence``
  credits it for 40 pairs and for the whole series), a Ljung-Box test over lags 1-10 and a
  runs test above/below the median;
* variance ratios of block means: ``b * var(means of blocks of b) / var(pairs)``, about 1
  for independent pairs and ``(1 + rho) / (1 - rho)`` for long blocks of an AR(1) series,
  the factor by which drift inflates the variance of a confirmation's mean;
* the rule as the search builds it (``SequentialRule.from_measure(MeasureSection())``,
  pairs 6-40, 95 %, min_speedup 0.03), with and without the dependence widening, on the
  series with the truth exactly at the margin (the series centred, then shifted by
  log 1.03): consumed in order (fresh pairs for every confirmation, no resampling), and
  resampled as a moving-block bootstrap (blocks of ``--block`` consecutive pairs, each
  block's sign flipped at random), which keeps the dependence inside blocks; and what the
  widening costs there: how often a true +10 % is found on the same resampled blocks.

Usage:
    python benchmarks/aa_series.py [--data benchmarks/data/aa-series.json] [--reps 4000] [--block 10]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.verdicts import load_log_ratios  # noqa: E402
from trainopt.contract.spec import MeasureSection  # noqa: E402
from trainopt.decide import dependence  # noqa: E402
from trainopt.decide.sequential import SequentialRule  # noqa: E402

MARGIN = 0.03


def acf(x: np.ndarray, lag: int) -> float:
    d = x - x.mean()
    return float(np.sum(d[:-lag] * d[lag:]) / np.sum(d * d))


def ljung_box(x: np.ndarray, lags: int = 10) -> tuple[float, float]:
    n = len(x)
    q = n * (n + 2) * sum(acf(x, k) ** 2 / (n - k) for k in range(1, lags + 1))
    return q, float(sps.chi2.sf(q, lags))


def runs_z(x: np.ndarray) -> float:
    """Wald-Wolfowitz runs test above/below the median: negative z = fewer runs than chance (clustering)."""
    above = x > np.median(x)
    n1, n2 = int(above.sum()), int((~above).sum())
    runs = 1 + int(np.sum(above[1:] != above[:-1]))
    mu = 2 * n1 * n2 / (n1 + n2) + 1
    var = 2 * n1 * n2 * (2 * n1 * n2 - n1 - n2) / ((n1 + n2) ** 2 * (n1 + n2 - 1))
    return (runs - mu) / math.sqrt(var)


def variance_ratio(x: np.ndarray, b: int) -> float:
    m = len(x) // b
    means = x[: m * b].reshape(m, b).mean(axis=1)
    return float(b * means.var(ddof=1) / x.var(ddof=1))


def confirm(rule: SequentialRule, r: np.ndarray) -> tuple[str, int] | None:
    """The rule fed the pairs in order; None when it would need more pairs than ``r`` holds."""
    for look in rule.looks:
        if look.n > len(r):
            return None
        d = rule.decide(r[: look.n])
        if d.done:
            return d.verdict, d.n
    raise AssertionError("no stop at max_pairs")


def in_order(rule: SequentialRule, r: np.ndarray) -> tuple[int, int, float]:
    pos, improved, done, used = 0, 0, 0, 0
    while (out := confirm(rule, r[pos:])) is not None:
        improved += out[0] == "improved"
        done += 1
        used += out[1]
        pos += out[1]
    return improved, done, used / max(done, 1)


def block_bootstrap(rule: SequentialRule, r: np.ndarray, reps: int, block: int, seed: int,
                    truth: float = 1 + MARGIN) -> tuple[int, float]:
    rng = np.random.default_rng(seed)
    need = rule.max_pairs
    improved, used = 0, 0
    starts = len(r) - block + 1
    for _ in range(reps):
        parts = []
        while sum(len(p) for p in parts) < need:
            s = int(rng.integers(starts))
            parts.append(r[s:s + block] * rng.choice([-1.0, 1.0]))
        x = math.log(truth) + np.concatenate(parts)[:need]
        verdict, n = confirm(rule, x)
        improved += verdict == "improved"
        used += n
    return improved, used / reps


def upper(k: int, n: int) -> float:
    return 1.0 if k == n else float(sps.beta.ppf(0.95, k + 1, n - k))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(ROOT / "benchmarks" / "data" / "aa-series.json"))
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    x = load_log_ratios(Path(args.data))
    n = len(x)
    print(f"series: {args.data}, {n} pairs, mean {x.mean():+.4f}, sd {x.std(ddof=1):.4f}")
    print(f"lag-1 autocorrelation {acf(x, 1):+.3f} (lags 2-5: " + ", ".join(f"{acf(x, k):+.3f}" for k in range(2, 6))
          + f"); standard error about {1 / math.sqrt(n):.3f}")
    print(f"credited by the rule (decide.dependence.corrected_rho): whole series {dependence.corrected_rho(x):.3f}; "
          f"over windows of 40 pairs: mean {np.mean([dependence.corrected_rho(x[i:i + 40]) for i in range(0, n - 39, 40)]):.3f}")
    q, p = ljung_box(x)
    print(f"Ljung-Box Q(10) = {q:.1f}, p = {p:.3f}; runs test z = {runs_z(x):+.2f}")
    print("variance ratio of block means (1 = independent): "
          + ", ".join(f"b={b}: {variance_ratio(x, b):.2f}" for b in (2, 4, 8, 16) if n // b >= 5))
    centred = x - x.mean()
    print()
    print(f"the rule at the margin (true ratio {1 + MARGIN:.2f}; series centred): pairs 6-40, 95 %, min_speedup {MARGIN}")
    print("| pairs drawn | dependence widening | confirmations | false improved (95 % upper) | mean pairs |")
    print("|---|---|---|---|---|")
    for widen in (True, False):
        rule = SequentialRule.from_measure(MeasureSection(), dependence=widen)
        k, done, mean_n = in_order(rule, math.log(1 + MARGIN) + centred)
        print(f"| in order, fresh for each | {'on' if widen else 'off'} | {done} | {k} of {done} | {mean_n:.1f} |")
    for widen in (True, False):
        rule = SequentialRule.from_measure(MeasureSection(), dependence=widen)
        k, mean_n = block_bootstrap(rule, centred, args.reps, args.block, args.seed)
        print(f"| blocks of {args.block}, resampled | {'on' if widen else 'off'} | {args.reps} | "
              f"{100 * k / args.reps:.1f} % (<= {100 * upper(k, args.reps):.1f} %) | {mean_n:.1f} |")
    print()
    print("its price: a true +10 % on the same resampled blocks")
    print("| dependence widening | found | mean pairs |")
    print("|---|---|---|")
    for widen in (True, False):
        rule = SequentialRule.from_measure(MeasureSection(), dependence=widen)
        k, mean_n = block_bootstrap(rule, centred, args.reps, args.block, args.seed, truth=1.10)
        print(f"| {'on' if widen else 'off'} | {100 * k / args.reps:.1f} % | {mean_n:.1f} |")


if __name__ == "__main__":
    main()
