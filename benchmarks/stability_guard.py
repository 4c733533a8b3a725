"""False alarms and detection of the stability guard, by simulation (no quiet machine needed).

Drives ``trainopt.decide.stability.StabilityGuard`` with the real ``observe`` over simulated
searches (``tests.loaded.drive_guard``: a screen then pair sessions per incumbent, a new
incumbent every six sessions, unstable sessions re-run after ``settle_s``):

* ordinary machines: ``tests.fakes.FakeRunner`` sessions (shared session draw sd 0.1,
  per-arm draw sd 0.05, eight windows scattered by ``window_sd``), normal and heavy tails;
* a CPU hog that comes and goes: ``tests.loaded.LoadedMachine`` with the hog taking
  ``1 - slow`` of the arms' speed for ``on`` seconds in every ``on + off``;
* GPU-like machines (1-2 % noise everywhere, four windows) and the demo's CPU (three
  windows scattered by 5 %, per-arm offsets of 7 %), quiet, and with every arm's speed
  stepping to ``step`` times after 100 s (``LoadedMachine`` with a step load): the share
  of sessions flagged, and whether the step was flagged within ``--step-window`` sessions.

It prints, per row, the share of sessions whose first attempt was judged unstable (a
needless re-run on an ordinary machine, a catch under the hog) with a one-sided 95 %
Clopper-Pearson upper bound, and the share whose verdict stayed marked after the retries.

Usage:
    python benchmarks/stability_guard.py [--sessions 3000] [--hog-sessions 400] [--step-runs 50]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scipy.stats import beta  # noqa: E402

from tests.fakes import FakeRunner  # noqa: E402
from tests.loaded import LoadedMachine, drive_guard, hog  # noqa: E402
from trainopt.decide.stability import StabilityGuard  # noqa: E402


def upper(k: int, n: int) -> float:
    return 1.0 if k == n else float(beta.ppf(0.95, k + 1, n - k))


def row(name: str, first: int, marked: int, n: int) -> str:
    return f"| {name} | {n} | {first / n:.2%} (≤ {upper(first, n):.2%}) | {marked / n:.2%} (≤ {upper(marked, n):.2%}) |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=3000)
    parser.add_argument("--hog-sessions", type=int, default=400)
    parser.add_argument("--step-runs", type=int, default=50)
    parser.add_argument("--step-sessions", type=int, default=40)
    parser.add_argument("--step-window", type=int, default=6)
    args = parser.parse_args()
    print("| machine | sessions | first attempt unstable (95 % upper) | verdict marked (95 % upper) |")
    print("|---|---|---|---|")
    for window_sd in (0.05, 0.1, 0.15, 0.2):
        for tail in ("normal", "t3", "contaminated"):
            runner = FakeRunner(session_sd=0.1, arm_sd=0.05, window_sd=window_sd, windows=8, tail=tail, seed=11)
            first, marked = drive_guard(StabilityGuard(), runner, args.sessions)
            print(row(f"ordinary, window sd {window_sd:.2f}, {tail}", first, marked, args.sessions))
    for on, off in ((5.0, 7.0), (3.0, 6.0), (2.0, 8.0)):
        for slow in (0.5, 0.33):
            machine = LoadedMachine(load=hog(on, off, slow, phase=2.0), seed=3)
            first, marked = drive_guard(StabilityGuard(), machine, args.hog_sessions)
            print(row(f"hog {on:g} s on / {off:g} s off at {slow:g}x speed", first, marked, args.hog_sessions))
    first, marked = drive_guard(StabilityGuard(), LoadedMachine(seed=3), args.hog_sessions)
    print(row("same sessions, no hog", first, marked, args.hog_sessions))
    print()
    print("| machine | speed after 100 s | runs | sessions flagged, first attempt (95 % upper) | "
          "runs whose step was flagged within the next sessions |")
    print("|---|---|---|---|---|")
    machines = {"GPU-like, 1 %": dict(session_sd=0.01, arm_sd=0.01, window_sd=0.01, rounds=4),
                "GPU-like, 2 %": dict(session_sd=0.02, arm_sd=0.02, window_sd=0.02, rounds=4),
                "demo CPU, 5 % windows, 3 windows": dict(session_sd=0.05, arm_sd=0.07, window_sd=0.05, rounds=3)}
    for name, kw in machines.items():
        for step in (1.0, 0.75, 1.25):
            first_total = sessions_total = caught = 0
            for seed in range(args.step_runs):
                machine = LoadedMachine(load=lambda t, s=step: s if t >= 100.0 else 1.0, seed=seed, **kw)
                guard = StabilityGuard()
                first, _ = drive_guard(guard, machine, args.step_sessions)
                first_total += first
                sessions_total += args.step_sessions
                after = [p for p in guard.points if p["t_s"] >= 100.0 and p["retry"] == 0][:args.step_window]
                caught += any(not p["stable"] for p in after)
            print(f"| {name} | {step:g}x | {args.step_runs} | {first_total / sessions_total:.2%} "
                  f"(≤ {upper(first_total, sessions_total):.2%}) | {caught}/{args.step_runs if step != 1.0 else '-'} |")


if __name__ == "__main__":
    main()
