"""Where a step's time goes: the profiled window's cost to the throughput figures, and the planted cases.

1. **The timed windows are unchanged by the profiled window.** Fresh trial processes of the
   same spec with ``diagnose`` on and off, interleaved in pairs whose order alternates
   (on-off, off-on, ...): the ratio of ``samples_per_s`` (on / off) per pair, its median, and
   the Hodges-Lehmann interval on the log-ratios (``trainopt.stats.intervals.paired_interval``).
   The profiled window runs after the timed ones, so the ratio should be 1 within the
   machine's run-to-run noise; the extra wall time a diagnosed trial pays is printed too.
2. **Planted bottlenecks** (``tests/fixtures/planted_phases.py``), each in a diagnosed trial
   process: a data set that sleeps per item (input), a wide MLP with in-memory data
   (compute), a loss whose host read sleeps (sync): each phase's share and the verdict of
   ``trainopt.decide.bottleneck.diagnose``.

Usage:
    python benchmarks/breakdown.py [--pairs 8]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import FIXTURES, tiny_spec_dict  # noqa: E402
from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import load_spec  # noqa: E402
from trainopt.decide.bottleneck import diagnose  # noqa: E402
from trainopt.execute.runner import SubprocessRunner  # noqa: E402
from trainopt.stats.intervals import paired_interval  # noqa: E402
from trainopt.stats.phases import PHASES  # noqa: E402

PLANTED = str(FIXTURES / "planted_phases.py")

# Heavier than the test suite's tiny spec, so that a timed window holds enough steps to be
# stable: an MLP of two 256-wide layers, batch 64, one thread.
AB_SPEC = tiny_spec_dict(
    model={"name": "mlp", "args": {"hidden": 256, "layers": 2}},
    data={"name": "synthetic-tabular", "args": {"size": 4096, "features": 64}},
    baseline={"batch_size": 64, "threads": 1},
    measure={"warmup_seconds": 1.0, "window_seconds": 0.25, "windows": 6},
)

CASES = {
    "input": tiny_spec_dict(
        model={"name": f"{PLANTED}:small_model", "args": {}},
        data={"name": f"{PLANTED}:slow_data", "args": {"delay_s": 0.002}},
        baseline={"batch_size": 16, "threads": 1, "num_workers": 0},
        measure={"breakdown_steps": 20},
    ),
    "compute": tiny_spec_dict(
        model={"name": "mlp", "args": {"hidden": 1024, "layers": 2}},
        data={"name": "synthetic-tabular", "args": {"size": 2048, "features": 256}},
        baseline={"batch_size": 128, "threads": 1},
        measure={"breakdown_steps": 20},
    ),
    "sync": tiny_spec_dict(
        model={"name": f"{PLANTED}:small_model", "args": {}},
        data={"name": f"{PLANTED}:fast_data", "args": {}},
        loss=f"{PLANTED}:slow_read_loss",
        baseline={"batch_size": 16, "threads": 1, "sync_every": 1},
        measure={"breakdown_steps": 20},
    ),
}


class Trials:
    """Fresh trial processes of specs written into one scratch folder."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.count = 0
        self.runner = SubprocessRunner()
        self._loaded: dict[str, object] = {}

    def run(self, name: str, spec: dict, diagnose: bool):
        if name not in self._loaded:
            path = self.folder / f"{name}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            self._loaded[name] = load_spec(path)
        loaded = self._loaded[name]
        self.count += 1
        trial = self.folder / f"{name}-{self.count}"
        trial.mkdir()
        request = TrialRequest(spec=loaded.resolved(), source_dir=str(loaded.source_dir()),
                               settings=dict(loaded.baseline), mode="measure",
                               result_path=str(trial / "result.json"), trial_id=f"{name}-{self.count}",
                               diagnose=diagnose)
        result = self.runner.run(request, trial / "trial.log", 240)
        if not result.ok:
            raise SystemExit(f"{name}: trial {result.status}: {result.error}; log {trial / 'trial.log'}")
        return result


def ab(trials: Trials, pairs: int) -> None:
    print(f"## The profiled window against the timed windows ({pairs} pairs, order alternating)\n")
    print("| pair | order | on samples/s | off samples/s | on / off | on trial s | off trial s | profiled window s |")
    print("|---|---|---|---|---|---|---|---|")
    on, off, extra = [], [], []
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {flag: trials.run("ab", AB_SPEC, flag) for flag in order}
        a, b = got[True], got[False]
        on.append(a.samples_per_s)
        off.append(b.samples_per_s)
        extra.append(a.wall_s - b.wall_s)
        print(f"| {i + 1} | {'on-off' if order[0] else 'off-on'} | {a.samples_per_s:.0f} | {b.samples_per_s:.0f} | "
              f"{a.samples_per_s / b.samples_per_s:.3f} | {a.wall_s:.2f} | {b.wall_s:.2f} | {a.breakdown['wall_s']:.2f} |",
              flush=True)
    ratios = [x / y for x, y in zip(on, off)]
    interval = paired_interval(on, off, 0.95, "hodges-lehmann")
    print()
    print(f"- median ratio on / off: **{statistics.median(ratios):.3f}** (min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(f"- Hodges-Lehmann estimate {interval.speedup:.3f}, {interval.coverage:.1%} interval "
          f"[{interval.low:.3f}, {interval.high:.3f}]")
    sd = statistics.stdev(math.log(r) for r in ratios)
    print(f"- sd of the pair log-ratios: {sd:.3f}")
    print(f"- a diagnosed trial's extra wall time: median {statistics.median(extra):.2f} s "
          f"(profiled window of one timed window's steps, with its phase timing)\n")


def planted(trials: Trials) -> None:
    print("## Planted bottlenecks, one diagnosed trial process each\n")
    print("| case | " + " | ".join(PHASES) + " | verdict | reason |")
    print("|---|" + "---|" * len(PHASES) + "---|---|")
    for name, spec in CASES.items():
        result = trials.run(name, spec, True)
        shares = result.breakdown["shares"]
        verdict = diagnose(result.breakdown, result.data_wait_fraction)
        cells = " | ".join(f"{100 * shares[p]:.1f} %" for p in PHASES)
        print(f"| {name} | {cells} | {verdict['bottleneck']} | {verdict['reason']} |", flush=True)
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--skip-ab", action="store_true")
    ap.add_argument("--skip-planted", action="store_true")
    args = ap.parse_args()
    print(f"command: python benchmarks/breakdown.py --pairs {args.pairs}"
          + (" --skip-ab" if args.skip_ab else "") + (" --skip-planted" if args.skip_planted else "") + "\n")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        trials = Trials(Path(tmp))
        if not args.skip_ab:
            ab(trials, args.pairs)
        if not args.skip_planted:
            planted(trials)
    print(f"total {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
