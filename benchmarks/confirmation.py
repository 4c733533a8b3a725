"""A/A false wins and planted-effect detection of the confirmation rule, on this machine's real noise.

Step 1 (measure): run N interleaved A/A pairs of one configuration, each run a fresh trial
process exactly as the search runs them (order inside each pair randomised). Raw
throughputs go to a JSON file so the analysis can be repeated without re-measuring.

Step 2 (analyse), with the search's own rule (start with `pairs`, add pairs while
`stats.needs_more_pairs`, stop at `max_pairs`, verdict by `stats.verdict`):
  * real confirmations: the measured pairs consumed in order, each confirmation on fresh pairs;
  * resampled confirmations: many confirmations drawing whole measured pairs with replacement
    (pairing kept), for a tighter estimate of the rates;
  * planted effects: the candidate side of the real pairs multiplied by 1.05, 1.10, 1.25, so
    the effect size is known exactly and the noise is the machine's own.

Usage:
    python benchmarks/confirmation.py measure --pairs 60 [--spec configs/resnet.yaml] [--data FILE]
    python benchmarks/confirmation.py analyse [--data FILE] [--resamples 4000]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import load_spec  # noqa: E402
from trainopt.execute.runner import SubprocessRunner  # noqa: E402
from trainopt.stats import intervals as stats  # noqa: E402

DEFAULT_DATA = ROOT / "benchmarks" / "data" / "aa-pairs.json"
# Shorter windows than the demo so 100+ fresh processes fit in a sitting; still >= 10 steps each.
SHORT = {"warmup_seconds": 1.0, "window_seconds": 0.5, "windows": 6}


def measure(args) -> None:
    spec = load_spec(ROOT / args.spec)
    resolved = spec.resolved()
    resolved["measure"].update(SHORT)
    runner = SubprocessRunner()
    rng = random.Random(args.seed)
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = ["a", "b"] if rng.random() < 0.5 else ["b", "a"]
            got = {}
            for who in order:
                req = TrialRequest(resolved, str(spec.source_dir()), dict(spec.baseline), "measure",
                                   str(Path(tmp) / f"{i}{who}.json"))
                r = runner.run(req, Path(tmp) / f"{i}{who}.log", 300)
                assert r.ok, r.error
                got[who] = r.samples_per_s
            pairs.append([got["a"], got["b"]])
            print(f"pair {i + 1}/{args.pairs}: {got['a']:.1f} {got['b']:.1f}", flush=True)
    Path(args.data).parent.mkdir(parents=True, exist_ok=True)
    Path(args.data).write_text(json.dumps({
        "spec": args.spec, "measure": resolved["measure"], "pairs": pairs,
        "measured_at": time.strftime("%Y-%m-%d %H:%M"),
    }, indent=1))
    print(f"saved {len(pairs)} pairs to {args.data}")


def confirm(draw, pairs: int, max_pairs: int, min_speedup: float, confidence: float, method: str):
    """Apply the search's sequential rule to pairs produced by ``draw()``; returns (verdict, n)."""
    cand, inc = [], []
    while True:
        c, b = draw()
        cand.append(c)
        inc.append(b)
        if len(cand) < pairs:
            continue
        iv = stats.paired_interval(cand, inc, confidence, method)
        if not stats.needs_more_pairs(iv, min_speedup, max_pairs):
            return stats.verdict(iv, min_speedup), iv.n


def analyse(args) -> None:
    data = json.loads(Path(args.data).read_text())
    pairs = data["pairs"]
    # The rule under test is the spec defaults unless overridden on the command line.
    from trainopt.contract.spec import MeasureSection

    m = MeasureSection()
    rule = dict(pairs=args.pairs or m.pairs, max_pairs=args.max_pairs or m.max_pairs, min_speedup=m.min_speedup,
                confidence=m.confidence, method=args.method or m.interval)
    runs = [x for p in pairs for x in p]
    logr = sorted(math.log(a / b) for a, b in pairs)
    cv = statistics.stdev(runs) / statistics.mean(runs)
    print(f"data: {len(pairs)} real A/A pairs of {data['spec']} (measure {data['measure']['windows']} x "
          f"{data['measure']['window_seconds']} s windows), measured {data.get('measured_at')}")
    print(f"run-to-run CV {cv:.1%}; pair log-ratio quantiles 5/25/50/75/95 %: "
          + " ".join(f"{logr[int(q * (len(logr) - 1))]:+.3f}" for q in (0.05, 0.25, 0.5, 0.75, 0.95)))
    print(f"rule: pairs {rule['pairs']}, max_pairs {rule['max_pairs']}, min_speedup {rule['min_speedup']}, "
          f"confidence {rule['confidence']}, interval {rule['method']}")
    rng = random.Random(args.seed)
    for effect in (0.0, 0.05, 0.10, 0.25):
        # Real: consume the measured pairs in order, fresh pairs for every confirmation.
        it = iter(pairs)

        def draw_real():
            a, b = next(it)
            return a * (1 + effect), b

        real = []
        try:
            while True:
                real.append(confirm(draw_real, **rule))
        except StopIteration:
            pass

        def draw_boot():
            a, b = pairs[rng.randrange(len(pairs))]
            return a * (1 + effect), b

        boot = [confirm(draw_boot, **rule) for _ in range(args.resamples)]
        label = "A/A false 'improved'" if effect == 0 else f"planted +{effect:.0%} detected"
        for name, res in (("real", real), ("resampled", boot)):
            if not res:
                continue
            rate = sum(v == "improved" for v, _ in res) / len(res)
            mean_n = statistics.mean(n for _, n in res)
            print(f"{label:26s} {name:9s}: {rate:6.1%} of {len(res):5d} confirmations, mean pairs {mean_n:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("measure")
    a.add_argument("--pairs", type=int, default=60)
    a.add_argument("--spec", default="configs/resnet.yaml")
    a.add_argument("--data", default=str(DEFAULT_DATA))
    a.add_argument("--seed", type=int, default=1)
    b = sub.add_parser("analyse")
    b.add_argument("--data", default=str(DEFAULT_DATA))
    b.add_argument("--resamples", type=int, default=4000)
    b.add_argument("--seed", type=int, default=2)
    b.add_argument("--pairs", type=int, help="starting pairs (default: the spec default)")
    b.add_argument("--max-pairs", type=int, help="pair budget (default: the spec default)")
    b.add_argument("--method", choices=["hodges-lehmann", "t"], help="interval (default: the spec default)")
    args = ap.parse_args()
    measure(args) if args.cmd == "measure" else analyse(args)


if __name__ == "__main__":
    main()
