"""The training check's false alarms and detection, with real training runs judged by the real rule.

For each seed (the spec's ``seed``: initial weights, data and the reference's data order), one
reference, its twin in another data order, and one run per change, each in its own trial
process (mode ``train``, exactly as a search runs them); every change is judged by
``trainopt.decide.training_check.judge``, the function the search decides with.

Changes:
  harmless   num_workers 0 -> 1, channels_last on, optimizer_impl foreach and fused: these
             must come out ``same`` (false alarms are the rest); and the harshest harmless
             change, ``another order``: the same settings in a third data order, as a change
             that decorrelates training completely (nondeterministic kernels, a long run)
             would look, with nothing else different;
  planted    bf16 autocast on the shifted-input CNN (``tests/fixtures/numerics.py``): it must
             come out ``worse``.

Workloads:
  cnn        the planted fixture's CNN on its pattern images (SGD 0.05, momentum 0.9, batch 16);
             the harmless changes run with ``shift: 0``, the planted one with ``shift: 1024``;
  demo       configs/resnet.yaml's ResNet-18 at batch 128 (harmless changes only).

Writes one JSON line per check to --out and prints the rates.

Usage:
    python benchmarks/training_check.py [--seeds 20] [--steps 40] [--workloads cnn,demo] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import spec_from_dict  # noqa: E402
from trainopt.decide.training_check import judge  # noqa: E402
from trainopt.execute.runner import SubprocessRunner  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "numerics.py"
HARMLESS = {"num_workers=1": {"num_workers": 1}, "channels_last": {"channels_last": True},
            "foreach": {"optimizer_impl": "foreach"}, "fused": {"optimizer_impl": "fused"}}


def cnn_spec(seed: int, shift: float) -> dict:
    return {
        "name": "check-cnn", "device": "cpu", "seed": seed,
        "model": {"name": f"{FIXTURE}:ShiftedCNN", "args": {"shift": shift}},
        "data": {"name": f"{FIXTURE}:Patterns", "args": {"size": 512, "seed": seed}},
        "loss": "cross_entropy", "optimizer": {"name": "sgd", "args": {"lr": 0.05, "momentum": 0.9}},
        "baseline": {"batch_size": 16, "threads": 1},
    }


def demo_spec(seed: int) -> dict:
    data = yaml.safe_load((ROOT / "configs" / "resnet.yaml").read_text())
    data["seed"] = seed
    data["baseline"] = {**data["baseline"], "batch_size": 128, "threads": 1}
    return data


def train(spec_data: dict, settings: dict, order_seed: int, steps: int, work: Path, name: str) -> list:
    spec = spec_from_dict(spec_data, "bench.yaml", ROOT)
    request = TrialRequest(spec=spec.resolved(), source_dir=str(ROOT), settings={**spec.baseline, **settings}, mode="train",
                           result_path=str(work / f"{name}.result.json"), training={"steps": steps, "order_seed": order_seed})
    result = SubprocessRunner().run(request, work / f"{name}.log", 900)
    if not result.ok:
        raise SystemExit(f"{name}: {result.status}: {result.error} (log {work / name}.log)")
    return result.training["losses"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--workloads", default="cnn")
    p.add_argument("--out", default=None, help="JSON lines file (default: a temporary file)")
    p.add_argument("--changes", default=None, help="only these changes, comma-separated (default: all)")
    args = p.parse_args()
    wanted = set(args.changes.split(",")) if args.changes else set()
    work = Path(tempfile.mkdtemp(prefix="training-check-"))
    out = Path(args.out) if args.out else work / "checks.jsonl"
    counts: dict[tuple[str, str], dict[str, int]] = {}
    t0 = time.time()
    with out.open("w") as sink:
        for workload in args.workloads.split(","):
            for seed in range(args.seeds):
                base = cnn_spec(seed, 0.0) if workload == "cnn" else demo_spec(seed)
                ref = train(base, {}, seed, args.steps, work, f"{workload}-{seed}-ref")
                twin = train(base, {}, seed + 1, args.steps, work, f"{workload}-{seed}-twin")
                changes = [(name, base, s, "same") for name, s in HARMLESS.items()]
                changes.append(("another order", base, {}, "same"))
                if workload == "cnn" and (not wanted or "bf16 (planted)" in wanted):
                    shifted = cnn_spec(seed, 1024.0)
                    changes.append(("bf16 (planted)", shifted, {"amp": "bf16"}, "worse"))
                    # The shifted network's own reference: exact in float32, so it trains as the plain one.
                    sref = train(shifted, {}, seed, args.steps, work, f"{workload}-{seed}-sref")
                    stwin = train(shifted, {}, seed + 1, args.steps, work, f"{workload}-{seed}-stwin")
                for name, spec_data, settings, expected in changes:
                    if wanted and name not in wanted:
                        continue
                    r, t = (sref, stwin) if spec_data is not base else (ref, twin)
                    order = seed + 2 if name == "another order" else seed
                    cand = train(spec_data, settings, order, args.steps, work, f"{workload}-{seed}-{name.split()[0]}")
                    v = judge(r, t, cand, args.steps)
                    row = {"workload": workload, "seed": seed, "change": name, "expected": expected, **v.to_dict()}
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
                    c = counts.setdefault((workload, name), {})
                    c[v.verdict] = c.get(v.verdict, 0) + 1
                print(f"{workload} seed {seed}: done ({time.time() - t0:.0f} s)", file=sys.stderr)
    print(f"command: python benchmarks/training_check.py --seeds {args.seeds} --steps {args.steps} --workloads {args.workloads}"
          + (f" --changes '{args.changes}'" if args.changes else ""))
    print(f"{'workload':8} {'change':16} {'checks':>6}  verdicts")
    for (workload, name), c in counts.items():
        n = sum(c.values())
        print(f"{workload:8} {name:16} {n:6d}  " + ", ".join(f"{k} {v} ({v / n:.0%})" for k, v in sorted(c.items())))
    print(f"rows: {out}; {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
