"""GPU-like searches, simulated through ``Search`` itself: verdicts, bias, the early cut, the guard.

A GPU measures with about 1 % noise and its wins are 2-5x. Each search here is a whole
``trainopt.search.search.Search`` over three knobs (amp, num_workers, compile) with
``tests.fakes.FakeRunner`` as the machine: 1 % or 2 % noise per arm, per session, per
window and per fresh process, every arm's first window 1.5x fast, and far-slower arms
retired with the session runner's own rules (``early_cut``). Tables:

1. verdicts and bias: how often each real win is kept and reaches ``best.yaml``, how
   often the effect-free knob is kept, the mean and sd of the log error of the reported
   figures (each kept change's speedup, the final check's), and searches with a session
   the stability guard flagged on a quiet machine (screens re-measured, pairs kept and marked);
2. the early cut: windows measured by the arms a comparison needs (confirmation,
   held-out, final check) and by a screen's far-slower arm;
3. a 25 % step of every arm's speed after ``k`` sessions: searches in which the guard
   flagged a session as shifted, searches with a verdict marked unstable (a flagged pair
   session is kept and its verdict marked), searches warned by the final check,
   and searches whose kept changes are still the real ones.

Usage:
    python benchmarks/gpu_like_search.py [--searches 200]
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
from trainopt.contract.spec import MeasureSection, spec_from_dict  # noqa: E402

BUDGET = {k: getattr(MeasureSection(), k) for k in ("pairs", "max_pairs", "confidence")}
KNOBS = {"amp": ["off", "bf16"], "num_workers": [0, 2], "compile": ["off", "default"]}


def search(out: Path, seed: int, effects: dict, sd: float, **fake) -> tuple[dict, FakeRunner]:
    spec = spec_from_dict(tiny_spec_dict(search=KNOBS, measure=BUDGET), "t.yaml", out)
    runner = FakeRunner(effects, seed=seed, arm_sd=sd, session_sd=sd, process_sd=2 * sd, window_sd=sd,
                        first_window=1.5, early_cut=True, **fake)
    return simulated_search(spec, out, runner).run(), runner


def verdict_table(out: Path, n: int) -> None:
    print("| noise | truth (amp, compile; num_workers none) | amp kept | compile kept | both in best.yaml | "
          "num_workers kept | log error of amp / compile / final: mean (sd) | searches with a flagged session (re-measured screens / marked pairs) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = [(sd, amp, comp) for sd in (0.01, 0.02) for amp, comp in ((2.0, 1.2), (2.5, 1.4), (5.0, 1.2))]
    for r, (sd, amp, comp) in enumerate(rows):
        kept = {"amp": 0, "compile": 0, "num_workers": 0}
        best = flagged = retried = 0
        err: dict[str, list[float]] = {"amp": [], "compile": [], "final": []}
        for seed in range(1000 * r, 1000 * r + n):
            doc, _ = search(out, seed, {("amp", "bf16"): amp, ("compile", "default"): comp}, sd)
            d = {x["knob"]: x for x in doc["decisions"]}
            for k in kept:
                kept[k] += bool(d[k]["kept"])
            best += doc["best"]["settings"]["amp"] == "bf16" and doc["best"]["settings"]["compile"] == "default"
            retried += doc["stability"]["retries"] > 0
            flagged += any(not p["stable"] for p in doc["stability"]["points"])
            for k, truth in (("amp", amp), ("compile", comp)):
                if d[k]["kept"]:
                    err[k].append(math.log(d[k]["speedup"] / truth))
            if doc["final"].get("speedup"):
                err["final"].append(math.log(doc["final"]["speedup"] / (amp * comp)))
        errs = " / ".join(f"{statistics.fmean(e):+.4f} ({statistics.stdev(e):.4f})" for e in err.values())
        print(f"| {sd:.0%} | {amp:g}x, {comp:g}x | {kept['amp']}/{n} | {kept['compile']}/{n} | {best}/{n} | "
              f"{kept['num_workers']}/{n} | {errs} | {flagged}/{n} ({retried}) |")


def cut_table(out: Path, n: int) -> None:
    print("| truth | arms a comparison needs (confirm, held-out, final) | their windows: min-max | "
          "held-out baseline arms | screened-out 0.2x arm's windows |")
    print("|---|---|---|---|---|")
    effects = {("amp", "bf16"): 6.0, ("compile", "default"): 1.2, ("num_workers", 2): 0.2}
    needed: list[int] = []
    baselines = 0
    starved: list[int] = []
    for seed in range(n):
        doc, _ = search(out, seed, effects, 0.01)
        for t in doc["trials"]:
            if t["status"] != "ok":
                continue
            if t["role"] in ("confirm", "holdout", "final"):
                needed.append(len(t["windows"]))
                baselines += t["role"] == "holdout" and t["session"]["arm"] == 2
            if t["role"] == "screen" and t["settings"]["num_workers"] == 2:
                starved.append(len(t["windows"]))
    print(f"| bf16 6x, compile 1.2x, num_workers 2 at 0.2x; 1 % noise; {n} searches | {len(needed)} | "
          f"{min(needed)}-{max(needed)} of 4 | {baselines} (at 1/7.2 of the incumbent), all measured in full | "
          f"{min(starved)}-{max(starved)} |")


def step_table(out: Path, n: int) -> None:
    print("| step after session | searches flagged as shifted | with verdicts marked unstable | warned by the final check | "
          "kept changes right |")
    print("|---|---|---|---|---|")
    effects = {("amp", "bf16"): 2.5, ("compile", "default"): 1.4}
    for after in (4, 8, 10, 14, 20, 26, 30):
        flagged = marked = warned = right = 0
        for seed in range(n):
            doc, _ = search(out, seed, effects, 0.01, step=(after, 0.75))
            flagged += any("below its level" in p["reason"] for p in doc["stability"]["points"])
            marked += doc["stability"]["unstable_verdicts"] > 0
            warned += any("final check disagrees" in w for w in doc["warnings"])
            right += [d["to"] for d in doc["decisions"] if d["kept"]] == ["bf16", "default"]
        print(f"| {after} | {flagged}/{n} | {marked}/{n} | {warned}/{n} | {right}/{n} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--searches", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        verdict_table(out, args.searches)
        print()
        cut_table(out, max(1, args.searches // 4))
        print()
        step_table(out, max(1, args.searches // 4))


if __name__ == "__main__":
    main()
