"""The final check taken from three-arm held-out sessions, simulated through ``Search``.

After two kept changes the final check's pairs are the baseline arms of the second change's
held-out sessions (``search.holdout.HeldOutSessions``). This runs ``--reps`` complete searches of two
knobs (amp off -> bf16 with true factor A, then num_workers 0 -> 1 with true factor B)
through ``tests.fakes.simulated_search`` (the real decision code with the CLI's stability
guard, fake processes) and, among searches that kept both changes, prints how often the final
check's interval covers the true combined speedup A x B (nominal: the confidence, 0.95),
its mean log error, and the same for the second change's held-out estimate against B and
for the first change's against A (measured in the same sessions: the incumbent arm against
the baseline arm, since the first kept change measures no held-out sessions of its own).

Usage:
    python benchmarks/final_check.py [--reps 300] [--sd 0.10 0.165] [--effects 1.25 1.25 1.10 1.25]
    python benchmarks/final_check.py --table contradiction [--reps 400] [--sd 0.09 0.02]

``--table contradiction``: two true +10 % changes (amp bf16, one loader worker), with the
default budget (pairs 6, max_pairs 40). Row ``real``: the combination is 1.21x; row
``planted``: the combined settings run 1/1.21 times as fast whenever an arm of the
baseline is in the same session (``FakeRunner(beside=...)``), so each change confirms
against its incumbent but the combination is no faster than the baseline, which only the
final check measures. Printed: searches keeping both, how often ``best.yaml`` holds both
(of all searches and of those keeping both: for ``planted`` the rest are the ones caught),
the final check's mean pair count, and among recommended combinations the mean reported
speedup and the coverage of its interval.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import tiny_spec_dict  # noqa: E402
from tests.fakes import FakeRunner, simulated_search  # noqa: E402
from trainopt.contract.spec import spec_from_dict  # noqa: E402


def row(tmp: Path, reps: int, a: float, b: float, sd: float) -> str:
    both = covered = covered_b = covered_a = from_holdout = 0
    err, err_b, err_a = [], [], []
    for seed in range(reps):
        measure = {"pairs": 6, "max_pairs": 20, "confidence": 0.95, "min_speedup": 0.03}
        spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"], "num_workers": [0, 1]}, measure=measure),
                              "t.yaml", tmp)
        runner = FakeRunner({("amp", "bf16"): a, ("num_workers", 1): b}, arm_sd=sd / math.sqrt(2), session_sd=0.1, seed=seed)
        doc = simulated_search(spec, tmp, runner).run()
        kept = [d for d in doc["decisions"] if d["kept"]]
        if len(kept) != 2:
            continue
        both += 1
        final, first, second = doc["final"], kept[0], kept[1]
        from_holdout += final.get("reused_pairs") == final["n_pairs"]
        covered += final["ci"][0] <= a * b <= final["ci"][1]
        err.append(math.log(final["speedup"] / (a * b)))
        covered_b += second["ci"][0] <= b <= second["ci"][1]
        err_b.append(math.log(second["speedup"] / b))
        covered_a += first["ci"][0] <= a <= first["ci"][1]
        err_a.append(math.log(first["speedup"] / a))
    if not both:
        return f"| {a} × {b} | {sd} | {reps} | 0 | — | — | — | — | — | — | — |"
    return (f"| {a} × {b} | {sd} | {reps} | {both} | {from_holdout / both:.0%} | {covered / both:.1%} | "
            f"{statistics.fmean(err):+.4f} | {covered_b / both:.1%} | {statistics.fmean(err_b):+.4f} | "
            f"{covered_a / both:.1%} | {statistics.fmean(err_a):+.4f} |")


def contradiction_row(tmp: Path, reps: int, sd: float, planted: bool) -> str:
    both = kept_both = pairs = covered = 0
    reported = []
    truth = 1.0 if planted else 1.21
    for seed in range(reps):
        measure = {"pairs": 6, "max_pairs": 40, "confidence": 0.95, "min_speedup": 0.03}
        spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"], "num_workers": [0, 1]}, measure=measure),
                              "t.yaml", tmp)
        beside = [({"amp": "bf16", "num_workers": 1}, {"amp": "off", "num_workers": 0}, 1 / 1.21)] if planted else None
        runner = FakeRunner({("amp", "bf16"): 1.10, ("num_workers", 1): 1.10}, arm_sd=sd / math.sqrt(2), session_sd=0.1,
                            seed=seed, beside=beside)
        doc = simulated_search(spec, tmp, runner).run()
        best = doc["best"]["settings"]
        holds = best["amp"] == "bf16" and best["num_workers"] == 1
        both += holds
        if sum(d["kept"] for d in doc["decisions"]) == 2:
            kept_both += 1
            pairs += doc["final"]["n_pairs"]
        if holds:
            reported.append(doc["speedup"])
            covered += doc["speedup_ci"][0] <= truth <= doc["speedup_ci"][1]
    mean = f"{statistics.fmean(reported):.4f}" if reported else "—"
    cov = f"{covered / len(reported):.1%}" if reported else "—"
    among = f"{both / kept_both:.1%}" if kept_both else "—"
    return (f"| {'planted' if planted else 'real'} | {truth} | {sd} | {reps} | {kept_both / reps:.1%} | {both / reps:.1%} | "
            f"{among} | {pairs / max(kept_both, 1):.1f} | {mean} | {cov} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--sd", type=float, nargs="+", default=[0.10, 0.165], help="pair log-ratio sds")
    ap.add_argument("--effects", type=float, nargs="+", default=[1.25, 1.25, 1.10, 1.25],
                    help="pairs of true factors A B, A B, ...")
    ap.add_argument("--table", choices=["holdout", "contradiction"], default="holdout")
    args = ap.parse_args()
    if args.table == "contradiction":
        print(f"command: python benchmarks/final_check.py --table contradiction --reps {args.reps} --sd {' '.join(map(str, args.sd))}")
        print("| combination | its true speedup | pair sd | searches | both kept | best.yaml holds both | "
              "of those keeping both | final check pairs | mean reported | coverage |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        with tempfile.TemporaryDirectory() as tmp:
            for sd in args.sd:
                for planted in (False, True):
                    print(contradiction_row(Path(tmp), args.reps, sd, planted), flush=True)
        return
    print(f"command: python benchmarks/final_check.py --reps {args.reps} --sd {' '.join(map(str, args.sd))} "
          f"--effects {' '.join(map(str, args.effects))}")
    print("| A × B | pair sd | searches | both kept | final check from held-out sessions | final covers A×B | "
          "final mean log error | second held-out covers B | its mean log error | first held-out covers A | "
          "its mean log error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    pairs = list(zip(args.effects[::2], args.effects[1::2]))
    with tempfile.TemporaryDirectory() as tmp:
        for a, b in pairs:
            for sd in args.sd:
                print(row(Path(tmp), args.reps, a, b, sd), flush=True)


if __name__ == "__main__":
    main()
