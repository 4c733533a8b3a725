"""Simulated verdicts: a stepwise confirmation loop ("old") against the sequential rule ("new"), side by side.

Every confirmation draws fresh paired log-ratios ``r = log(candidate / incumbent)`` with a
known true speedup, so false wins, detection, coverage and bias are counted exactly.

* old: a loop that adds one pair at a time, called through ``stats.paired_interval``,
  ``stats.needs_more_pairs`` and ``stats.verdict`` (start at ``pairs``, add one pair at a
  time, stop when the verdict is decided or improvement is ruled out);
* new: ``trainopt.decide.sequential.SequentialRule`` (alpha spent over planned looks), with the
  reported speedup of a kept change taken from ``holdout_pairs()`` extra pairs.

Sections:
  confirm   A/A false ``improved``, detection at +5/+10/+25 %, mean pairs, coverage of the
            reported interval and the mean reported speedup among kept changes, over noise
            sd 0.05/0.18/0.5, normal/t3/contaminated tails, min_speedup 0/0.03;
  budgets   the spec's pair-budget edges and both interval methods;
  futility  the rule with and without its futility stop by projection: improved rate and
            mean pairs at 1.00-1.25, normal and t3 noise, budgets 14 and 40;
  real      resampled real A/A pairs, sign-symmetrised, and the same pairs consumed in order
            (``--real-data``: benchmarks/data/aa-pairs.json, sequential fresh processes, and
            benchmarks/data/aa-sessions.json, interleaved sessions as the search runs them);
  screen    one knob end to end: a multi-arm screen session, then confirmation(s);
            adoption of a true +10 % change and A/A adoption per knob;
  search    today's ``Search`` driven through ``tests.fakes.FakeRunner`` for a reference.

Usage:
    python benchmarks/verdicts.py [--reps 2000] [--sections confirm,budgets,futility,real,screen,search]
        [--real-data FILE ...] [--real-budgets 6-40 6-20 6-14]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainopt.decide.screen import MAX_CONFIRM, SCREEN_GATE, select_for_confirmation  # noqa: E402
from trainopt.decide.sequential import SequentialRule, holdout_estimate, holdout_pairs  # noqa: E402
from trainopt.stats import intervals as stats  # noqa: E402

EFFECTS = (1.0, 1.05, 1.10, 1.25)
DATA = ROOT / "benchmarks" / "data" / "aa-pairs.json"
SESSIONS_DATA = ROOT / "benchmarks" / "data" / "aa-sessions.json"


# ---- noise ---------------------------------------------------------------------------------


def noise(rng: np.random.Generator, tail, sd: float, size) -> np.ndarray:
    """Zero-median noise with standard deviation ``sd``; ``tail`` an array: resampled measured log-ratios."""
    if isinstance(tail, np.ndarray):
        x = tail[rng.integers(0, len(tail), size)]
        # A/A with random order inside each pair is symmetric about 0: flip signs at
        # random so the measured sample's own median does not flatter the rule.
        return x * rng.choice([-1.0, 1.0], size)
    if tail == "normal":
        return rng.normal(0.0, sd, size)
    if tail == "t3":
        return sd * rng.standard_t(3, size) / math.sqrt(3.0)
    if tail == "contaminated":
        wide = np.where(rng.random(size) < 0.1, 5.0, 1.0)
        return sd * wide * rng.normal(0.0, 1.0, size) / math.sqrt(3.4)
    raise ValueError(tail)


def load_log_ratios(path: Path) -> np.ndarray:
    """Measured A/A log-ratios: ``pairs`` of throughputs (``confirmation.py measure``) or
    ``interleaved_log_ratios`` (``sessions.py --json``)."""
    data = json.loads(Path(path).read_text())
    if "pairs" in data:
        return np.array([math.log(a / b) for a, b in data["pairs"]])
    return np.array(data["interleaved_log_ratios"])


# ---- the two rules -------------------------------------------------------------------------


def old_rule(r: np.ndarray, pairs: int, max_pairs: int, confidence: float, min_speedup: float, method: str):
    """``Search.confirm``'s loop on given log-ratios; returns (verdict, interval, n)."""
    ones = np.ones(len(r))
    n = pairs
    while True:
        iv = stats.paired_interval(np.exp(r[:n]), ones[:n], confidence, method)
        if not stats.needs_more_pairs(iv, min_speedup, max_pairs):
            return stats.verdict(iv, min_speedup), iv, n
        n += 1


def new_rule(rule: SequentialRule, r: np.ndarray):
    """The sequential rule fed pair by pair (only looks can stop, so only looks are asked)."""
    for look in rule.looks:
        d = rule.decide(r[: look.n])
        if d.done:
            return d.verdict, d.interval, d.n
    raise AssertionError("no stop at max_pairs")


def cell(rng, reps, tail, sd, budget, confidence, min_speedup, method, effects=EFFECTS, rules=("old", "new")):
    """One row group: both rules on the same draws, every effect; returns per-effect figures."""
    pairs, max_pairs = budget
    rule = SequentialRule(pairs, max_pairs, confidence, min_speedup, method)
    hold = holdout_pairs(confidence, method)
    out = {}
    for eff in effects:
        theta = math.log(eff)
        acc = {k: {"improved": 0, "regressed": 0, "n": 0, "covered": 0, "kept": []} for k in ("old", "new", "new-deciding")}
        for _ in range(reps):
            r = theta + noise(rng, tail, sd, max_pairs)
            runs = []
            if "old" in rules:
                runs.append(("old", old_rule(r, pairs, max_pairs, confidence, min_speedup, method)))
            if "new" in rules:
                runs.append(("new", new_rule(rule, r)))
            for name, (v, iv, n) in runs:
                a = acc[name]
                a["improved"] += v == "improved"
                a["regressed"] += v == "regressed"
                a["n"] += n
                # A futility stop at a look that may claim nothing reports no interval: it cannot miss.
                a["covered"] += iv is None or iv.low <= eff <= iv.high
                if v == "improved":
                    if name == "new":
                        acc["new-deciding"]["kept"].append(iv.speedup)
                        held = theta + noise(rng, tail, sd, hold)
                        a["kept"].append(holdout_estimate(held, confidence, method).speedup)
                    else:
                        a["kept"].append(iv.speedup)
        out[eff] = {
            k: {
                "improved": a["improved"] / reps,
                "regressed": a["regressed"] / reps,
                "mean_n": a["n"] / reps,
                "coverage": a["covered"] / reps,
                "kept_mean": float(np.mean(a["kept"])) if a["kept"] else None,
                "kept_gmean": float(np.exp(np.mean(np.log(a["kept"])))) if a["kept"] else None,
            }
            for k, a in acc.items()
            if k != "new-deciding"
        }
        d = acc["new-deciding"]["kept"]
        out[eff]["new"]["deciding_mean"] = float(np.mean(d)) if d else None
    return out, rule


def pct(x):
    return "—" if x is None else f"{x:.1%}"


def ratio_or_dash(x):
    return "—" if x is None else f"{x:.3f}"


def print_cell_rows(label, res, rules=("old", "new")):
    """One markdown row per rule: A/A, detection, mean pairs, worst coverage, kept bias."""
    effects = sorted(res)
    for name in rules:
        aa = res[1.0][name]
        det = " / ".join(f"{res[e][name]['improved']:.1%}" if e in res else "—" for e in (1.05, 1.10, 1.25))
        pairs = " / ".join(f"{res[e][name]['mean_n']:.1f}" if e in res else "—" for e in EFFECTS)
        cov = min(res[e][name]["coverage"] for e in effects)
        kept = " / ".join(
            f"{ratio_or_dash(res[e][name]['kept_mean'])} ({ratio_or_dash(res[e][name]['kept_gmean'])})" if e in res else "—"
            for e in (1.05, 1.10))
        extra = ""
        if name == "new" and 1.10 in res:
            extra = " (deciding: " + " / ".join(ratio_or_dash(res[e]["new"]["deciding_mean"]) for e in (1.05, 1.10)) + ")"
        print(f"| {label} | {name} | **{aa['improved']:.1%}** | {aa['regressed']:.1%} | {det} | {pairs} | {cov:.1%} | {kept}{extra} |", flush=True)


HEADER = ("| setting | rule | A/A improved | A/A regressed | detected +5/+10/+25 % | mean pairs at 1.00/1.05/1.10/1.25 "
          "| worst coverage | mean (geometric mean) reported among kept at 1.05 / 1.10 |\n|---|---|---|---|---|---|---|---|")


def section_confirm(args, rng):
    print("\n### Confirmation, default budget (pairs 6, max_pairs 20), Hodges–Lehmann, confidence 0.95\n")
    print(HEADER)
    for m in (0.0, 0.03):
        for tail in ("normal", "t3", "contaminated"):
            for sd in (0.05, 0.18, 0.5):
                res, _ = cell(rng, args.reps, tail, sd, (6, 20), 0.95, m, "hodges-lehmann")
                print_cell_rows(f"{tail} sd {sd}, min_speedup {m}", res)


def _run_rule(rule: SequentialRule, effect: float, sd: float, reps: int, tail: str, seed: int = 0) -> tuple[float, float]:
    """Improved rate and mean pairs of ``rule`` over ``reps`` confirmations, looking as the search looks."""
    rng = np.random.default_rng(seed)
    improved, pairs = 0, []
    for _ in range(reps):
        noise = rng.standard_t(3, rule.max_pairs) * sd / math.sqrt(3) if tail == "t3" else rng.normal(0, sd, rule.max_pairs)
        x = math.log(effect) + noise
        n = rule.next_look(0)
        while not (d := rule.decide(x[:n])).done:
            n = rule.next_look(n)
        improved += d.verdict == "improved"
        pairs.append(n)
    return improved / reps, float(np.mean(pairs))


def section_futility(args, rng):
    print("\n### Futility by projection: the shipped rule with and without it (family 2, min_speedup 0.03)\n")
    print("| noise | budget | futility | " + " | ".join(f"{e}" for e in (1.0, 1.035, 1.05, 1.10, 1.25)) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for sd, tail, budgets in ((0.09, "normal", (40, 14)), (0.09, "t3", (40,)), (0.165, "normal", (40,))):
        for top in budgets:
            for pc in (None, 0.99):
                rule = SequentialRule(6, top, 0.95, 0.03, family=2, projection_confidence=pc)
                cells = [_run_rule(rule, e, sd, args.reps, tail) for e in (1.0, 1.035, 1.05, 1.10, 1.25)]
                label = "+ projection at 99 %" if pc else "50 % bound only"
                print(f"| {tail} sd {sd} | 6–{top} | {label} | " + " | ".join(f"{p:.3f} / {n:.1f}" for p, n in cells) + " |",
                      flush=True)


def section_budgets(args, rng):
    print("\n### Pair budgets at the spec's edges and both interval methods (sd 0.18, min_speedup 0)\n")
    print(HEADER)
    for method in ("hodges-lehmann", "t"):
        for tail in ("normal", "t3"):
            for budget in ((3, 3), (3, 20), (6, 20), (6, 80)):
                res, rule = cell(rng, args.reps, tail, 0.18, budget, 0.95, 0.0, method)
                print_cell_rows(f"{method} {tail} pairs {budget[0]}–{budget[1]}", res)
    # The largest budget the spec allows. The old loop recomputes its interval at every pair
    # up to 1,000 (seconds per confirmation), so it runs A/A only, on fewer repetitions.
    reps = max(100, args.reps // 10)
    for method in ("hodges-lehmann", "t"):
        res, rule = cell(rng, reps, "normal", 0.18, (3, 1000), 0.95, 0.0, method, rules=("new",))
        print_cell_rows(f"{method} normal pairs 3–1000 ({reps} reps)", res, rules=("new",))
    old_reps = 20
    res, rule = cell(rng, old_reps, "normal", 0.18, (3, 1000), 0.95, 0.0, "hodges-lehmann", effects=(1.0,), rules=("old",))
    print_cell_rows(f"hodges-lehmann normal pairs 3–1000 ({old_reps} reps, A/A only)", res, rules=("old",))


def in_order(real: np.ndarray, effect: float, budget, min_speedup: float) -> tuple[int, int, float]:
    """The new rule on the measured pairs consumed in order, fresh pairs for every confirmation.

    Returns (improved, confirmations, mean pairs); a confirmation that would need more pairs
    than are left is not counted.
    """
    rule = SequentialRule(*budget, 0.95, min_speedup)
    pos, improved, done, used = 0, 0, 0, 0
    while True:
        r = math.log(effect) + real[pos:pos + budget[1]]
        for look in rule.looks:
            if look.n > len(r):
                return improved, done, used / max(done, 1)
            d = rule.decide(r[: look.n])
            if d.done:
                break
        improved += d.verdict == "improved"
        done += 1
        used += d.n
        pos += d.n


def section_real(args, rng):
    for path in args.real_data:
        real = load_log_ratios(path)
        print(f"\n### Real A/A pairs from {Path(path).name}, resampled (sign-symmetrised; {len(real)} pairs, "
              f"sd {real.std(ddof=1):.3f}, mean {real.mean():+.3f})\n")
        print(HEADER)
        for m in (0.0, 0.03):
            for budget in args.real_budgets:
                res, _ = cell(rng, args.reps, real, 0.0, budget, 0.95, m, "hodges-lehmann")
                print_cell_rows(f"real pairs, pairs {budget[0]}-{budget[1]}, min_speedup {m}", res)
        print("\nThe same pairs consumed in order by the new rule (fresh pairs for every confirmation; "
              "planted effects multiply the candidate side):\n")
        print("| min_speedup | budget | A/A improved | +5 % | +10 % | +25 % | mean pairs (A/A) |\n|---|---|---|---|---|---|---|")
        for m in (0.0, 0.03):
            for budget in args.real_budgets:
                cells = [in_order(real, e, budget, m) for e in EFFECTS]
                print(f"| {m} | {budget[0]}-{budget[1]} | " + " | ".join(f"{i} of {k}" for i, k, _ in cells)
                      + f" | {cells[0][2]:.1f} |", flush=True)


def one_knob(rng, k, effect, sd, policy, budget=(6, 20), min_speedup=0.03, confidence=0.95):
    """One knob end to end: returns (adopted candidate index or None, confirmation pairs, reported speedup).

    Candidate 0 carries ``effect``, the others none. The screen is one multi-arm session:
    each arm gets a per-arm draw of sd ``sd / sqrt(2)`` (shared session noise cancels in
    the ratios), so one candidate/incumbent screen ratio has log-sd ``sd``, as one
    confirmation pair does.
    """
    truth = np.array([math.log(effect)] + [0.0] * (k - 1))
    arm = rng.normal(0.0, sd / math.sqrt(2), k + 1)
    screen = np.exp(truth + arm[1:] - arm[0])
    pairs_used = 0
    if policy == "old":
        best = int(np.argmax(screen))
        if screen[best] <= 1 + min_speedup:
            return None, 0, None
        r = truth[best] + rng.normal(0.0, sd, budget[1])
        v, iv, n = old_rule(r, *budget, confidence, min_speedup, "hodges-lehmann")
        return (best if v == "improved" else None), n, iv.speedup
    sel = select_for_confirmation(list(screen), MAX_CONFIRM, SCREEN_GATE)
    rule = SequentialRule(*budget, confidence, min_speedup, family=sel.family)
    improved = []
    for i in sel.indices:
        r = truth[i] + rng.normal(0.0, sd, budget[1])
        v, iv, n = new_rule(rule, r)
        pairs_used += n
        if v == "improved":
            improved.append((iv.speedup, i))
    if not improved:
        return None, pairs_used, None
    _, chosen = max(improved)
    hold = holdout_pairs(confidence)
    est = holdout_estimate(truth[chosen] + rng.normal(0.0, sd, hold), confidence).speedup
    return chosen, pairs_used + hold, est


def section_screen(args, rng):
    print("\n### One knob end to end: multi-arm screen session, then confirmation (default budget, min_speedup 0.03)\n")
    print(f"old: confirm the best screen if it beats 1.03. new: `select_for_confirmation` (best {MAX_CONFIRM} above the "
          f"search's {SCREEN_GATE} gate, budget split between them) + `SequentialRule` + held-out estimate of the adopted "
          "change.\n")
    print("| session log-ratio sd | candidates | policy | adopted true +10 % | adopted true +5 % | A/A adoption per knob "
          "| mean pairs per knob (A/A / +10 %) | mean reported among adopted at 1.05 / 1.10 |\n|---|---|---|---|---|---|---|---|")
    for sd in (0.06, 0.09):
        for k in (1, 2, 4):
            for policy in ("old", "new"):
                row = {}
                for eff in (1.0, 1.05, 1.10):
                    got = [one_knob(rng, k, eff, sd, policy) for _ in range(args.reps)]
                    hit = [g for g in got if g[0] == 0] if eff > 1 else [g for g in got if g[0] is not None]
                    row[eff] = (len(hit) / len(got), np.mean([g[1] for g in got]), np.mean([g[2] for g in hit]) if hit else None)
                print(f"| {sd} | {k} | {policy} | **{row[1.10][0]:.1%}** | {row[1.05][0]:.1%} | {row[1.0][0]:.1%} | "
                      f"{row[1.0][1]:.1f} / {row[1.10][1]:.1f} | {ratio_or_dash(row[1.05][2])} / {ratio_or_dash(row[1.10][2])} |", flush=True)
    print("\nBudget needed at the noisier end (sd 0.09, new policy):\n")
    print("| max_pairs | candidates | adopted true +10 % | A/A adoption | mean pairs per knob (A/A / +10 %) |\n|---|---|---|---|---|")
    for max_pairs in (30, 40):
        for k in (1, 2, 4):
            res = {}
            for eff in (1.0, 1.10):
                got = [one_knob(rng, k, eff, 0.09, "new", budget=(6, max_pairs)) for _ in range(args.reps)]
                hit = [g for g in got if g[0] == 0] if eff > 1 else [g for g in got if g[0] is not None]
                res[eff] = (len(hit) / len(got), np.mean([g[1] for g in got]))
            print(f"| {max_pairs} | {k} | {res[1.10][0]:.1%} | {res[1.0][0]:.1%} | {res[1.0][1]:.1f} / {res[1.10][1]:.1f} |", flush=True)


def section_search(args, rng):
    """Today's Search, through the fake runner: single fresh trials with the measured pair noise."""
    from tests.conftest import tiny_spec_dict
    from tests.fakes import FakeRunner, simulated_search
    from trainopt.contract.spec import spec_from_dict
    from trainopt.search.store import TrialStore

    reps = max(20, args.reps // 40)
    print(f"\n### Today's `Search` through `tests.fakes.FakeRunner` ({reps} searches per row; knob amp off→bf16, "
          "pairs 6–20, min_speedup 0.03)\n")
    print("| per-trial sd (pair log-ratio sd) | true bf16 effect | adopted | mean reported among adopted |\n|---|---|---|---|")
    for process_sd in (0.165 / math.sqrt(2), 0.09 / math.sqrt(2)):
        for eff in (1.0, 1.10):
            kept, reported = 0, []
            for i in range(reps):
                with tempfile.TemporaryDirectory() as tmp:
                    runner = FakeRunner({("amp", "bf16"): eff}, process_sd=process_sd, seed=int(rng.integers(1 << 30)))
                    spec = spec_from_dict(
                        tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={"pairs": 6, "max_pairs": 20, "confidence": 0.95}),
                        "t.yaml", Path(tmp))
                    store = TrialStore(f"sqlite:///{Path(tmp) / 'trials.db'}", spec.name, spec.fingerprint())
                    doc = simulated_search(spec, Path(tmp), runner, store=store).run()
                    (d,) = [x for x in doc["decisions"] if x["knob"] == "amp"]
                    if d["kept"]:
                        kept += 1
                        reported.append(d["speedup"])
            print(f"| {process_sd:.3f} ({process_sd * math.sqrt(2):.3f}) | {eff:.2f} | {kept / reps:.1%} | "
                  f"{ratio_or_dash(float(np.mean(reported)) if reported else None)} |", flush=True)


SECTIONS = {"confirm": section_confirm, "budgets": section_budgets, "futility": section_futility, "real": section_real, "screen": section_screen, "search": section_search}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2000, help="confirmations per effect and setting")
    ap.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--real-data", nargs="+", default=[str(DATA), str(SESSIONS_DATA)],
                    help="measured A/A pairs for the real section")
    ap.add_argument("--real-budgets", nargs="+", default=["6-40", "6-20", "6-14"],
                    help="pair budgets (pairs-max_pairs) of the real section")
    args = ap.parse_args()
    args.real_budgets = [tuple(int(x) for x in b.split("-")) for b in args.real_budgets]
    rng = np.random.default_rng(args.seed)
    start = time.time()
    for name in args.sections.split(","):
        SECTIONS[name.strip()](args, rng)
    print(f"\n({time.time() - start:.0f} s, {args.reps} repetitions per cell, seed {args.seed})")


if __name__ == "__main__":
    main()
