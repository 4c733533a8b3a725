"""One-knob-at-a-time search against the exhaustive grid on a small space.

The grid measures every combination of the spec's search values (batch sizes: the
powers of two from the baseline to the maximum) `--reps` times each, in fresh trial
processes, in a shuffled order, and takes each combination's median. The OVAT search runs
on the same spec through `trainopt search`. Reported: the grid's best median, the grid's
median for the settings OVAT chose (so both are judged on the same measurements), their
ratio (target >= 95 %), and trial counts (target OVAT <= 30 % of the grid's).

Usage:
    python benchmarks/search_efficiency.py [--spec benchmarks/configs/efficiency.yaml] [--reps 3]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import load_spec  # noqa: E402
from trainopt.execute.runner import SubprocessRunner  # noqa: E402


def grid_points(spec) -> list[dict]:
    axes = {}
    for knob, values in spec.search.items():
        if knob == "batch_size":
            sizes, b = [], spec.baseline["batch_size"]
            while b <= values.max:
                sizes.append(b)
                b *= 2
            axes[knob] = sizes
        else:
            axes[knob] = list(values)
    names = list(axes)
    return [dict(spec.baseline, **dict(zip(names, combo))) for combo in itertools.product(*axes.values())]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="benchmarks/configs/efficiency.yaml")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spec_path = ROOT / args.spec
    spec = load_spec(spec_path)
    points = grid_points(spec)
    key = lambda s: json.dumps(s, sort_keys=True)  # noqa: E731
    schedule = [p for p in points for _ in range(args.reps)]
    random.Random(args.seed).shuffle(schedule)
    runner = SubprocessRunner()
    grid: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, settings in enumerate(schedule):
            req = TrialRequest(spec.resolved(), str(spec.source_dir()), settings, "measure", str(Path(tmp) / f"{i}.json"))
            r = runner.run(req, Path(tmp) / f"{i}.log", 300)
            grid.setdefault(key(settings), []).append(r.samples_per_s if r.ok else 0.0)
            if (i + 1) % 20 == 0:
                print(f"grid: {i + 1}/{len(schedule)} trials", flush=True)
        out = Path(tmp) / "ovat"
        proc = subprocess.run([sys.executable, "-m", "trainopt", "search", str(spec_path), "--out", str(out), "--quiet"],
                              capture_output=True, text=True, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-2000:]
        doc = json.loads((out / "results.json").read_text())
    medians = {k: statistics.median(v) for k, v in grid.items()}
    best_key = max(medians, key=medians.get)
    chosen = doc["best"]["settings"]
    chosen_key = key(chosen)
    if chosen_key not in medians:
        print("OVAT chose settings outside the grid:", {k: chosen[k] for k in spec.search})
        return
    ratio = medians[chosen_key] / medians[best_key]
    ovat_trials = doc["counts"]["trials_run"]
    knobs = list(spec.search)
    print(f"\nspace: {len(points)} combinations of {', '.join(knobs)}; grid {len(schedule)} trials ({args.reps} per combination)")
    print(f"grid best   : {medians[best_key]:,.0f} samples/s  {dict((k, json.loads(best_key)[k]) for k in knobs)}")
    print(f"OVAT chose  : {medians[chosen_key]:,.0f} samples/s  {dict((k, chosen[k]) for k in knobs)}  (grid median)")
    print(f"OVAT / grid best: {ratio:.1%}; OVAT trials {ovat_trials} = {ovat_trials / len(schedule):.0%} of the grid's "
          f"({ovat_trials / len(points):.0%} of a single-pass grid of {len(points)})")
    baseline_key = key(dict(spec.baseline))
    if baseline_key in medians:
        print(f"baseline    : {medians[baseline_key]:,.0f} samples/s (grid median); OVAT's own speedup claim "
              f"{doc['speedup']:.3f}x {doc['speedup_ci']}")


if __name__ == "__main__":
    main()
