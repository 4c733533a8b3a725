"""Harness fidelity and per-trial overhead of `trainopt measure`.

Fidelity: the same configuration measured by `trainopt measure` (one fresh process per run)
and by the plainest hand-written PyTorch loop (also one fresh process per run), interleaved
A B A B ... in one run of this script, so both see the same machine. The ratio of medians
should be 0.98-1.02.

Overhead: for each trainopt run, the trial process's wall time minus its warm-up and timed
windows, compared with what any PyTorch training script pays before its first step
(interpreter start, `import torch`, first optimizer construction), measured here too.

Both sides get the same, generous warm-up (`--warmup-seconds`, default 4 s): on these CPUs
the step time keeps falling for several seconds (allocator and oneDNN caches), and the
comparison is about the timed loop, not about who discards more of that transient.

Usage:
    python benchmarks/fidelity.py [--runs 8] [--spec configs/resnet.yaml] [--warmup-seconds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The plainest loop: same model, data, loss, optimizer and batch; warm-up then timed steps.
PLAIN = r"""
import json, sys, time, torch
from trainopt.contract.spec import load_spec
from trainopt.trial.workloads import build_workload
spec = load_spec(sys.argv[1]); r = spec.resolved()
torch.manual_seed(r["seed"])
w = build_workload(r, spec.source_dir())
bs = r["baseline"]["batch_size"]
loader = torch.utils.data.DataLoader(w.dataset, batch_size=bs, shuffle=True, drop_last=True)
opt = w.optimizer_factory(w.model.parameters(), "default")
w.model.train()
def batches():
    while True:
        yield from loader
it = batches()
def step():
    x, y = next(it)
    loss = w.loss_fn(w.model(x), y)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return loss.item()
m = r["measure"]
t0 = time.perf_counter(); n = 0
while n < m["warmup_steps"] or time.perf_counter() - t0 < m["warmup_seconds"]:
    step(); n += 1
steps = int(m["windows"] * m["window_seconds"] / ((time.perf_counter() - t0) / n))
t0 = time.perf_counter()
for _ in range(steps):
    step()
dt = time.perf_counter() - t0
print(json.dumps({"samples_per_s": steps * bs / dt}))
"""


def run_trainopt(spec: Path, out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "trainopt", "measure", str(spec), "--json", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    return json.loads(proc.stdout)


def run_plain(spec: Path) -> float:
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(spec)], capture_output=True, text=True, cwd=ROOT, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"]


def startup_cost() -> float:
    """Wall time of a fresh process that imports torch and builds its first optimizer."""
    code = "import torch; torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8)
    ap.add_argument("--spec", default="configs/resnet.yaml")
    ap.add_argument("--warmup-seconds", type=float, default=4.0)
    args = ap.parse_args()
    ours, plain, overheads, starts = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        data = yaml.safe_load((ROOT / args.spec).read_text())
        data.setdefault("measure", {})["warmup_seconds"] = args.warmup_seconds
        data.pop("search", None)
        spec = Path(tmp) / "spec.yaml"
        spec.write_text(yaml.safe_dump(data))
        for i in range(args.runs):
            r = run_trainopt(spec, Path(tmp) / f"m{i}")
            assert r["status"] == "ok", r["error"]
            ours.append(r["samples_per_s"])
            timed = sum(r["window_steps"] * r["settings"]["batch_size"] / w for w in r["windows"])
            # wall_s is the trial process's whole life as the runner saw it, start to exit.
            overheads.append(r["wall_s"] - r["warmup_s"] - timed)
            plain.append(run_plain(spec))
            starts.append(startup_cost())
            print(f"run {i + 1}: trainopt {ours[-1]:8.1f}  plain {plain[-1]:8.1f}  samples/s", flush=True)
    from trainopt.stats.intervals import paired_interval

    ratio = statistics.median(ours) / statistics.median(plain)
    iv = paired_interval(ours, plain, 0.95)
    pair_ratios = sorted(a / b for a, b in zip(ours, plain))
    print(f"\nspec: {args.spec} (warm-up {args.warmup_seconds} s on both sides), {args.runs} interleaved runs each")
    print(f"median trainopt {statistics.median(ours):.1f}  median plain {statistics.median(plain):.1f} samples/s")
    print(f"fidelity ratio (median/median): {ratio:.3f}   per-pair ratios: min {pair_ratios[0]:.3f} "
          f"median {statistics.median(pair_ratios):.3f} max {pair_ratios[-1]:.3f}")
    print(f"paired ratio trainopt/plain (Hodges-Lehmann): {iv.speedup:.3f} [{iv.low:.3f}, {iv.high:.3f}] "
          f"at {iv.coverage:.1%} coverage over {iv.n} pairs")
    extra = statistics.median(overheads) - statistics.median(starts)
    print(f"trial overhead outside warm-up and windows: median {statistics.median(overheads):.2f} s "
          f"(whole trial process); fresh python+torch+optimizer start: median {statistics.median(starts):.2f} s; "
          f"difference {extra:.2f} s")


if __name__ == "__main__":
    main()
