"""Verdicts of the whole search, simulated through ``Search`` with a fake runner of known truth.

Every row runs ``--reps`` complete searches of one knob (screen session, sequential
confirmations on fresh pair sessions, held-out pairs, final check) through
``tests.fakes.FakeRunner`` and ``tests.fakes.MemoryStore``: the real decision code, fake
processes. Noise is the pair log-ratio sd of a session (0.06: live arms at one thread here;
0.10: live arms at 2 threads on 2 cores; 0.165: fresh sequential processes).

Printed per row: adoption of the change (the knob's kept value is the true one), how often
the recommended settings (``best.yaml``) hold it, false ``improved`` per knob (A/A), mean
sessions per search, and the mean reported speedup among kept changes with the coverage of
their reported interval.

Usage:
    python benchmarks/search_verdicts.py [--reps 400] [--rule sequential|old|both] [--max-pairs 14 20]
        [--sd 0.06 0.10 0.165] [--min-speedup 0.03] [--rescreen-floor off 0.9] [--projection 0.99 off]
        [--effects 1.0 1.05 1.10 1.25] [--guard on|off]
        (A/A rows always also at min_speedup 0)

Every search has the CLI's stability guard (``StabilityGuard()``: flagged sessions of a
comparison are kept and marked, screens re-run), as users run it; ``--guard off`` builds
them without one.

``--projection`` sets the sequential rule's ``projection_confidence`` (the futility stop by
projection; ``off`` disables it) for every confirmation the search builds.

Two more tables, each through ``Search`` with ``FakeRunner``:

    python benchmarks/search_verdicts.py --table scope [--reps 400] [--knobs 6] [--sd 0.09]
        a search of K knobs (amp, channels_last, num_workers, threads, sync_every,
        optimizer_impl; one candidate each): how often a search of K knobs without effect
        adopts any, and how often a single real +10 % knob among K - 1 without effect is
        adopted, with ``measure.error_scope`` knob and search, at min_speedup 0.03 and 0 (a
        change without effect sits exactly at a margin of 0: the worst case of the bound).
    python benchmarks/search_verdicts.py --table skew [--reps 1000] [--sd 0.02 0.09]
        one knob whose arms carry a skewed extra draw (``FakeRunner(skewed=...)``: the 80/20
        mixture, log-normal, 10 % outlier pairs) with its truth set so that the ratio of
        MEAN throughputs is exactly 1 + min_speedup (and 1.0): false ``improved`` with
        ``improved`` needing the mean to agree (the default) and with the rank rule alone.
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
from trainopt.decide.confirmation import IntervalRule  # noqa: E402
from trainopt.decide.screen import RESCREEN_FLOOR  # noqa: E402
from trainopt.decide.sequential import SequentialRule  # noqa: E402
from trainopt.search.search import Search  # noqa: E402

# The CLI's stability guard in every search (``--guard off``: none, as before the guard kept pairs).
GUARD = True


def make_search(spec, tmp: Path, runner, **kw) -> Search:
    """A ``Search`` as the CLI builds it: with the stability guard unless ``--guard off``."""
    return simulated_search(spec, tmp, runner, guard=GUARD, **kw)

_FROM_MEASURE = SequentialRule.from_measure.__func__


def use_projection(confidence: float | None) -> None:
    """Make every rule the search builds use this ``projection_confidence``."""
    SequentialRule.from_measure = classmethod(
        lambda cls, measure, **kw: _FROM_MEASURE(cls, measure, projection_confidence=confidence, **kw))


def row(tmp: Path, reps: int, *, effect: float, sd: float, values, winner, min_speedup=0.03, max_pairs=20, old=False,
        rescreen_floor: float | None = RESCREEN_FLOOR):
    adopted = recommended = false_wins = sessions = 0
    reported, covered = [], 0
    for seed in range(reps):
        measure = {"pairs": 6, "max_pairs": max_pairs, "confidence": 0.95, "min_speedup": min_speedup}
        spec = spec_from_dict(tiny_spec_dict(search={"num_workers": list(values)}, measure=measure), "t.yaml", tmp)
        runner = FakeRunner({("num_workers", winner): effect}, arm_sd=sd / math.sqrt(2), session_sd=0.1, seed=seed)
        rule = IntervalRule.from_measure(spec.measure) if old else None
        search = make_search(spec, tmp, runner, rule=rule)
        search.stage.screener.rescreen_floor = rescreen_floor
        doc = search.run()
        ds = [d for d in doc["decisions"] if d["knob"] == "num_workers"]
        kept = [d for d in ds if d["kept"]]
        sessions += len(runner.sessions)
        if effect == 1.0:
            false_wins += any(d["verdict"] == "improved" for d in ds)
        recommended += effect != 1.0 and doc["best"]["settings"]["num_workers"] == winner
        if kept and kept[0]["to"] == winner:
            adopted += 1
            reported.append(kept[0]["speedup"])
            covered += kept[0]["ci"][0] <= effect <= kept[0]["ci"][1]
    mean = f"{statistics.fmean(reported):.4f}" if reported else "—"
    cov = f"{covered / len(reported):.1%}" if reported else "—"
    return adopted / reps, recommended / reps, false_wins / reps, sessions / reps, mean, cov


SCOPE_KNOBS = {"amp": ["off", "bf16"], "channels_last": [False, True], "num_workers": [0, 1], "threads": [1, 2],
               "sync_every": [1, 8], "optimizer_impl": ["default", "foreach"]}


def scope_table(tmp: Path, reps: int, knobs: int, sd: float) -> None:
    """Search-wide false adoption and the price in real wins, by ``measure.error_scope``."""
    names = list(SCOPE_KNOBS)[:knobs]
    print(f"{knobs} knobs ({', '.join(names)}), one candidate each; pair sd {sd}; {reps} searches per row")
    print("| error_scope | min_speedup | truth | searches adopting any change without effect | real +10 % adopted | sessions |")
    print("|---|---|---|---|---|---|")
    for scope, margin, real in [(sc, mg, re) for mg in (0.03, 0.0) for sc in ("knob", "search") for re in (False, True)]:
        if True:
            any_false = adopted = sessions = 0
            for seed in range(reps):
                measure = {"pairs": 6, "max_pairs": 40, "confidence": 0.95, "min_speedup": margin, "error_scope": scope}
                spec = spec_from_dict(tiny_spec_dict(search={k: SCOPE_KNOBS[k] for k in names}, measure=measure), "t.yaml", tmp)
                real_knob = (names[0], SCOPE_KNOBS[names[0]][1])
                runner = FakeRunner({real_knob: 1.10} if real else {}, arm_sd=sd / math.sqrt(2), session_sd=0.1, seed=seed)
                doc = make_search(spec, tmp, runner).run()
                kept = [d for d in doc["decisions"] if d["kept"]]
                any_false += any((d["knob"], d["to"]) != real_knob or not real for d in kept)
                adopted += real and any((d["knob"], d["to"]) == real_knob for d in kept)
                sessions += len(runner.sessions)
            truth = f"{names[0]} +10 %, {knobs - 1} without effect" if real else f"all {knobs} without effect"
            print(f"| {scope} | {margin} | {truth} | {any_false / reps:.1%} | {adopted / reps:.1%} |" if real else
                  f"| {scope} | {margin} | {truth} | {any_false / reps:.1%} | — |", f" {sessions / reps:.1f} |", flush=True)


def skew_table(tmp: Path, reps: int, sd: float) -> None:
    """False ``improved`` when the pair noise is skewed and the mean gain is at (or below) the margin."""
    from tests.fakes import SKEW_MEAN
    from trainopt.decide import sequential

    print(f"knob amp off -> bf16; bf16 arms carry the skewed draw; pair sd {sd} besides it; {reps} searches per row")
    print("| skew | true ratio of mean throughputs | improved needs | false improved | limit |")
    print("|---|---|---|---|---|")
    original = sequential.SequentialRule.__init__
    for shape in ("mixture", "lognormal", "outliers"):
        for mean_ratio in (1.03, 1.0):
            for agrees in (True, False):
                def init(self, *a, _agrees=agrees, **kw):
                    original(self, *a, **{**kw, "mean_agrees": _agrees})
                sequential.SequentialRule.__init__ = init
                wins = 0
                for seed in range(reps):
                    measure = {"pairs": 6, "max_pairs": 40, "confidence": 0.95, "min_speedup": 0.03}
                    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure=measure), "t.yaml", tmp)
                    effect = mean_ratio / SKEW_MEAN[shape]
                    runner = FakeRunner({("amp", "bf16"): effect}, arm_sd=sd / math.sqrt(2), session_sd=0.1, seed=seed,
                                        skewed={("amp", "bf16"): shape})
                    doc = make_search(spec, tmp, runner).run()
                    wins += any(d["verdict"] == "improved" for d in doc["decisions"] if d["knob"] == "amp")
                sequential.SequentialRule.__init__ = original
                print(f"| {shape} | {mean_ratio} | {'rank and mean (default)' if agrees else 'rank interval alone'} | "
                      f"{wins / reps:.1%} ({wins}/{reps}) | 2.5 % |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", choices=["verdicts", "scope", "skew"], default="verdicts")
    ap.add_argument("--knobs", type=int, default=6, help="knobs of the scope table (at most 6)")
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--rule", choices=["sequential", "old", "both"], default="both")
    ap.add_argument("--max-pairs", type=int, nargs="+", default=[20, 14])
    ap.add_argument("--sd", type=float, nargs="+", default=[0.06, 0.10, 0.165], help="pair log-ratio sds")
    ap.add_argument("--min-speedup", type=float, nargs="+", default=[0.03],
                    help="min_speedup of the rows with an effect")
    ap.add_argument("--rescreen-floor", nargs="+", default=[str(RESCREEN_FLOOR)],
                    help="screen again the near misses above this ratio when none cleared the gate; 'off': never")
    ap.add_argument("--projection", nargs="+", default=["0.99"],
                    help="the rule's projection_confidence; 'off': no futility stop by projection")
    ap.add_argument("--effects", type=float, nargs="+", default=[1.0, 1.05, 1.10, 1.25], help="true effects of the rows")
    ap.add_argument("--guard", choices=["on", "off"], default="on",
                    help="the CLI's stability guard in every search (on, as users run it) or none")
    args = ap.parse_args()
    global GUARD
    GUARD = args.guard == "on"
    print(f"stability guard: {args.guard}")
    if args.table != "verdicts":
        tmp = Path(tempfile.mkdtemp())
        given = args.sd != [0.06, 0.10, 0.165]
        if args.table == "scope":
            scope_table(tmp, args.reps, args.knobs, args.sd[0] if given else 0.09)
        for sd in (args.sd if given else [0.02, 0.09]) if args.table == "skew" else []:
            skew_table(tmp, args.reps, sd)
        return
    floors = [None if f == "off" else float(f) for f in args.rescreen_floor]
    olds = {"sequential": (False,), "old": (True,), "both": (False, True)}[args.rule]
    tmp = Path(tempfile.mkdtemp())
    print(f"knob num_workers with candidates 1 and 2 (2 is the true change); pairs 6; {args.reps} searches per row")
    print("| rule | projection | rescreen floor | max_pairs | pair sd | min_speedup | true effect | adopted | recommended | false improved | sessions | mean reported | coverage |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for old, projection in [(o, p) for o in olds for p in args.projection]:
        use_projection(None if projection == "off" else float(projection))
        for max_pairs in args.max_pairs:
            for sd in args.sd:
                for effect in args.effects:
                    for ms in (sorted({0.0, *args.min_speedup}) if effect == 1.0 else args.min_speedup):
                        for floor in floors:
                            a, r, f, s, m, c = row(tmp, args.reps, effect=effect, sd=sd, values=(0, 1, 2), winner=2,
                                                min_speedup=ms, max_pairs=max_pairs, old=old, rescreen_floor=floor)
                            print(f"| {'old interval' if old else 'sequential'} | {projection} | {floor or 'off'} | {max_pairs} | {sd} | "
                                  f"{ms} | {effect} | {a:.1%} | {r:.1%} | {f:.1%} | {s:.1f} | {m} | {c} |", flush=True)


if __name__ == "__main__":
    main()
