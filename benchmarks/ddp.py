"""Data-parallel trials: fidelity against a plain torchrun script, and scaling 2 ranks vs 1.

Fidelity: the same configuration measured by `trainopt measure` as a DDP trial (torchrun,
2 ranks) and by the plainest hand-written DDP script launched with torchrun the same way
(`DistributedDataParallel`, `DistributedSampler`, warm-up, then timed steps between two
barriers), interleaved A B A B ... so both see the same machine. The ratio of medians
should be 0.98-1.02.

Scaling: `trainopt measure` of the same spec with 1 rank and with N ranks (each rank the
same `threads`), interleaved; efficiency = throughput(N) / (N x throughput(1)). On a CPU
with as many cores as ranks x threads that is the cost of the gradient all-reduce and of
ranks sharing memory bandwidth; on GPUs, of the all-reduce.

Usage:
    python benchmarks/ddp.py [--runs 6] [--spec benchmarks/configs/ddp.yaml] [--nproc 2]
    python benchmarks/ddp.py --runs 1 --smoke     # seconds-long windows, to check it runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainopt.contract import distributed  # noqa: E402

# The plainest DDP loop over the same workload: one process per rank under torchrun.
PLAIN = r"""
import gc, json, os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from trainopt.contract.spec import load_spec
from trainopt.trial.workloads import build_workload
spec = load_spec(sys.argv[1]); r = spec.resolved()
cuda = torch.cuda.is_available() and r["device"] != "cpu"
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
if r["baseline"].get("threads"):
    torch.set_num_threads(r["baseline"]["threads"])
torch.manual_seed(r["seed"])
w = build_workload(r, spec.source_dir())
bs = r["baseline"]["batch_size"]
sampler = torch.utils.data.DistributedSampler(w.dataset, shuffle=True, drop_last=True, seed=r["seed"])
loader = torch.utils.data.DataLoader(w.dataset, batch_size=bs, sampler=sampler, drop_last=True)
model = DistributedDataParallel(w.model.to(device), device_ids=[device.index] if cuda else None)
opt = w.optimizer_factory(model.parameters(), "default")
model.train()
def batches():
    epoch = 0
    while True:
        sampler.set_epoch(epoch); epoch += 1
        yield from loader
it = batches()
def step():
    x, y = next(it)
    x, y = x.to(device), y.to(device)
    loss = w.loss_fn(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    return loss.item()
def sync():
    if cuda: torch.cuda.synchronize(device)
m = r["measure"]
# Warm-up of an agreed length: time a few steps, take the slowest rank's pace.
t0 = time.perf_counter()
for _ in range(max(2, m["warmup_steps"])):
    step()
sync()
pace = torch.tensor([(time.perf_counter() - t0) / max(2, m["warmup_steps"])], dtype=torch.float64, device=device)
dist.all_reduce(pace, op=dist.ReduceOp.MAX)
for _ in range(int(m["warmup_seconds"] / pace.item())):
    step()
steps = max(1, int(m["windows"] * m["window_seconds"] / pace.item()))
sync(); dist.barrier()
t0 = time.perf_counter()
for _ in range(steps):
    step()
sync(); dist.barrier()
dt = time.perf_counter() - t0
if rank == 0:
    print(json.dumps({"samples_per_s": world * steps * bs / dt}))
del model, opt
gc.collect()  # DDP before the group: gloo can abort a finished rank at exit otherwise
dist.destroy_process_group()
"""


def run_trainopt(spec: Path, out: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "trainopt", "measure", str(spec), "--json", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )
    result = json.loads(proc.stdout)
    if result["status"] != "ok":
        raise SystemExit(f"trainopt measure failed: {result['status']}: {result['error']}")
    return result


def run_plain(script: Path, spec: Path, nproc: int, threads: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *distributed.torchrun_args(nproc), str(script), str(spec)],
        capture_output=True, text=True, cwd=ROOT, env=env, check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"]


def summary(name: str, values: list[float]) -> str:
    return f"{name}: median {statistics.median(values):.1f} samples/s  runs: {' '.join(f'{v:.1f}' for v in values)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--spec", default="benchmarks/configs/ddp.yaml")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="tiny warm-up and windows: checks that it runs, measures nothing")
    args = ap.parse_args()
    data = yaml.safe_load((ROOT / args.spec).read_text())
    data.pop("search", None)
    data["distributed"] = {**(data.get("distributed") or {}), "nproc_per_node": args.nproc}
    if args.smoke:
        data["measure"] = {**data.get("measure", {}), "warmup_steps": 2, "warmup_seconds": 0.2, "window_seconds": 0.1, "windows": 3}
    threads = data.get("baseline", {}).get("threads") or 1
    data.setdefault("baseline", {})["threads"] = threads
    ours, plain, single = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        spec = tmp / "spec.yaml"
        spec.write_text(yaml.safe_dump(data))
        one = tmp / "one.yaml"
        one.write_text(yaml.safe_dump({**data, "distributed": {**data["distributed"], "nproc_per_node": 1}}))
        script = tmp / "plain_ddp.py"
        script.write_text(PLAIN)
        for i in range(args.runs):
            r = run_trainopt(spec, tmp / f"m{i}")
            assert r["world_size"] == args.nproc
            ours.append(r["samples_per_s"])
            plain.append(run_plain(script, spec, args.nproc, threads))
            single.append(run_trainopt(one, tmp / f"s{i}")["samples_per_s"])
            print(f"run {i + 1}: trainopt {ours[-1]:9.1f}  plain torchrun {plain[-1]:9.1f}  "
                  f"trainopt 1 rank {single[-1]:9.1f}  samples/s", flush=True)
    print(f"\nspec: {args.spec}, {args.nproc} ranks x {threads} thread(s), {args.runs} interleaved runs each"
          + ("  [SMOKE: tiny windows, figures mean nothing]" if args.smoke else ""))
    print(summary(f"trainopt DDP trial ({args.nproc} ranks)", ours))
    print(summary(f"plain torchrun script ({args.nproc} ranks)", plain))
    print(summary("trainopt DDP trial (1 rank)", single))
    ratio = statistics.median(ours) / statistics.median(plain)
    pair = sorted(a / b for a, b in zip(ours, plain))
    print(f"fidelity ratio (median/median): {ratio:.3f}   per-pair ratios: min {pair[0]:.3f} "
          f"median {statistics.median(pair):.3f} max {pair[-1]:.3f}")
    eff = statistics.median(ours) / (args.nproc * statistics.median(single))
    per = sorted(a / (args.nproc * b) for a, b in zip(ours, single))
    print(f"scaling efficiency {args.nproc} ranks vs 1: {eff:.3f}   per-run: min {per[0]:.3f} "
          f"median {statistics.median(per):.3f} max {per[-1]:.3f}")


if __name__ == "__main__":
    main()
