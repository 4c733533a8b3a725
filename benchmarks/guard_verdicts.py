"""False ``improved`` and power of the whole search with the stability guard on, as the CLI runs it.

Every row runs ``--reps`` complete searches of one knob (``amp``: off -> bf16) through
``Search`` with ``StabilityGuard()`` (the CLI's guard), ``tests.fakes.FakeRunner`` and
``tests.fakes.MemoryStore``: the real decision code, fake processes of known truth. The
cases are the ones a real machine differs from the rule's model in:

* ``offsets``: 1 % (or 2 %) window noise and a planted +0.15 (+0.25) log offset in 10 %
  (5 %) of processes, the change exactly at the margin (true ratio 1 + min_speedup);
  the same rows with the guard off, for comparison;
* ``ar1``: each configuration's speed drifts as AR(1) over sessions, so successive pair
  log-ratios have lag-1 autocorrelation ``rho`` (pair sd 0.06), truth at the margin;
* ``skew``: the 80/20 mixture (+0.06 in 80 % of the candidate's arms, -0.24 in 20 %) at
  pair sd 0.02, the ratio of MEAN throughputs at the margin;
* ``power``: a clean +10 % change at pair sd 0.09 and 0.02;
* ``demo``: two knobs, each a true +10 % change, at pair sd 0.09, with max_pairs 14 (the
  demo spec), 20 and 40: how often the recommended settings hold both.

Printed per row: how often the knob was called ``improved`` (false when the truth is at the
margin), with a one-sided 95 % Clopper-Pearson upper bound, and the mean pairs of its
confirmation.

Usage:
    python benchmarks/guard_verdicts.py [--reps 400] [--cases offsets ar1 skew power demo] [--max-pairs 40]
        [--guard-off-too] [--rerun-pairs] [--rhos 0.1 0.2 0.3] [--rho-margin X] [--seed0 0]

``--rerun-pairs`` lets the guard re-run flagged pair sessions and drop their pairs, judged on
the incumbent arm alone: the data selection the search does not do, for comparison.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scipy.stats import beta  # noqa: E402

from tests.conftest import tiny_spec_dict  # noqa: E402
from tests.fakes import SKEW_MEAN, FakeRunner, simulated_search  # noqa: E402
from trainopt.contract.spec import spec_from_dict  # noqa: E402
from trainopt.decide import dependence  # noqa: E402

MARGIN = 0.03


def upper(k: int, n: int) -> float:
    return 1.0 if k == n else float(beta.ppf(0.95, k + 1, n - k))


def improved_rate(tmp: Path, reps: int, *, effect: float, guard: bool = True, max_pairs: int = 40,
                  seed0: int = 0, **runner_kw) -> tuple[int, float]:
    """(searches calling amp=bf16 improved, mean pairs of its confirmation) over ``reps`` searches."""
    wins, pairs = 0, 0
    for seed in range(seed0, seed0 + reps):
        measure = {"pairs": 6, "max_pairs": max_pairs, "confidence": 0.95, "min_speedup": MARGIN}
        spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure=measure), "t.yaml", tmp)
        runner = FakeRunner({("amp", "bf16"): effect}, seed=seed, **runner_kw)
        search = simulated_search(spec, tmp, runner, guard=guard)
        doc = search.run()
        ds = [d for d in doc["decisions"] if d["knob"] == "amp"]
        wins += any(d["verdict"] == "improved" for d in ds)
        pairs += sum(d.get("n_pairs") or 0 for d in ds)
    return wins, pairs / reps


def ar1_case(rho: float) -> tuple[str, dict]:
    """Each configuration's speed drifting as AR(1) over sessions: pair log-ratios with lag-1 autocorrelation ``rho``."""
    return (f"AR(1) lag-1 {rho}, pair sd 0.06", dict(window_sd=0.02, windows=8, session_sd=0.01, arm_sd=0.0,
                                                    drift=(rho, 0.06 / math.sqrt(2))))


CASES = {
    "offsets": [
        ("1 % windows, +0.15 in 10 % of processes", dict(window_sd=0.01, windows=8, session_sd=0.01, arm_sd=0.02,
                                                          offsets=(0.10, 0.15))),
        ("1 % windows, +0.15 in 5 % of processes", dict(window_sd=0.01, windows=8, session_sd=0.01, arm_sd=0.02,
                                                         offsets=(0.05, 0.15))),
        ("2 % windows, +0.25 in 10 % of processes", dict(window_sd=0.02, windows=8, session_sd=0.01, arm_sd=0.02,
                                                          offsets=(0.10, 0.25))),
    ],
    "ar1": [],  # ar1_case(rho) for each --rhos
    "skew": [("80/20 mixture, pair sd 0.02", dict(window_sd=0.02, windows=8, session_sd=0.01, arm_sd=0.02 / math.sqrt(2),
                                                  skewed={("amp", "bf16"): "mixture"}))],
    "power": [(f"clean, pair sd {sd}", dict(window_sd=0.02, windows=8, session_sd=0.01, arm_sd=sd / math.sqrt(2)))
              for sd in (0.09, 0.02)],
}


def demo_rows(tmp: Path, reps: int) -> None:
    """Two true +10 % changes (amp, num_workers) at pair sd 0.09: how often best.yaml holds both."""
    print()
    print(f"two knobs, each a true +10 % change (amp bf16, num_workers 1), pair sd 0.09, guard on; {reps} searches per row")
    print("| max_pairs | both recommended (best.yaml) | at least one | mean sessions |")
    print("|---|---|---|---|")
    for max_pairs in (14, 20, 40):
        both = one = sessions = 0
        for seed in range(reps):
            measure = {"pairs": 6, "max_pairs": max_pairs, "confidence": 0.95, "min_speedup": MARGIN}
            spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"], "num_workers": [0, 1]}, measure=measure),
                                  "t.yaml", tmp)
            runner = FakeRunner({("amp", "bf16"): 1.10, ("num_workers", 1): 1.10}, seed=seed, window_sd=0.02, windows=8,
                                session_sd=0.01, arm_sd=0.09 / math.sqrt(2))
            best = simulated_search(spec, tmp, runner).run()["best"]["settings"]
            hits = (best.get("amp") == "bf16") + (best.get("num_workers") == 1)
            both += hits == 2
            one += hits >= 1
            sessions += len(runner.sessions)
        print(f"| {max_pairs} | {both / reps:.1%} | {one / reps:.1%} | {sessions / reps:.1f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--cases", nargs="+", choices=[*CASES, "demo"], default=[*CASES, "demo"])
    ap.add_argument("--max-pairs", type=int, default=40)
    ap.add_argument("--guard-off-too", action="store_true", help="also run the offsets rows with the guard off")
    ap.add_argument("--rhos", type=float, nargs="+", default=[0.1, 0.2, 0.3], help="lag-1 autocorrelations of the ar1 rows")
    ap.add_argument("--rho-margin", type=float, default=None,
                    help="standard errors added to the credited autocorrelation (decide.dependence.RHO_MARGIN)")
    ap.add_argument("--seed0", type=int, default=0, help="first seed of every row")
    ap.add_argument("--rerun-pairs", action="store_true",
                    help="let the guard re-run pair sessions too and drop the flagged pairs (for comparison)")
    args = ap.parse_args()
    if args.rerun_pairs:
        from trainopt.search import broker

        broker.KEEP_ROLES = ()
    if args.rho_margin is not None:
        dependence.RHO_MARGIN = args.rho_margin
    CASES["ar1"] = [ar1_case(rho) for rho in args.rhos]
    tmp = Path(tempfile.mkdtemp())
    print(f"knob amp off -> bf16; pairs 6, max_pairs {args.max_pairs}, 95 %, min_speedup {MARGIN}; {args.reps} searches per row "
          f"(seeds {args.seed0}-{args.seed0 + args.reps - 1}); RHO_MARGIN {dependence.RHO_MARGIN}")
    print("| case | guard | true ratio of mean throughputs | improved (95 % upper) | mean pairs |")
    print("|---|---|---|---|---|")
    for case in [c for c in args.cases if c != "demo"]:
        for name, kw in CASES[case]:
            if case == "power":
                truth = 1.10
                effect = truth
            elif case == "skew":
                truth = 1 + MARGIN
                effect = truth / SKEW_MEAN["mixture"]
            else:
                truth = effect = 1 + MARGIN
            guards = (True, False) if case == "offsets" and args.guard_off_too else (True,)
            for guard in guards:
                k, pairs = improved_rate(tmp, args.reps, effect=effect, guard=guard, max_pairs=args.max_pairs,
                                         seed0=args.seed0, **kw)
                print(f"| {name} | {'on' if guard else 'off'} | {truth:.2f} | {k / args.reps:.1%} "
                      f"(≤ {upper(k, args.reps):.1%}) | {pairs:.1f} |", flush=True)
    if "demo" in args.cases:
        demo_rows(tmp, args.reps)


if __name__ == "__main__":
    main()
