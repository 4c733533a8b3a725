"""How often a finished 2-rank gloo job fails at exit, with and without ``finish_distributed``.

Each launch is ``torchrun --nproc-per-node 2`` of a tiny training script that builds a few
DDP models (as the trial loop and a production script do), trains them for some steps,
and then ends in one of two ways:

- ``destroy``: ``dist.destroy_process_group()`` and a normal interpreter exit;
- ``finish``: ``TrainSettings.finish_distributed()`` (collect DDP's reference cycles,
  then destroy the group).

A launch fails when torchrun exits non-zero after every rank printed that it finished.
The two endings alternate launch by launch, so load on the machine hits both alike.

    python benchmarks/ddp_teardown.py --launches 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = r"""
import sys, torch, torch.distributed as dist
from trainopt.settings.production import TrainSettings

s = TrainSettings(device="cpu", distributed={"nproc_per_node": 2, "backend": "gloo"})
s.init_distributed()
for _ in range(4):
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(8, 8)).sum().backward()
        optimizer.step()
print("finished", file=sys.stderr, flush=True)
del model, optimizer
if sys.argv[1] == "finish":
    s.finish_distributed()
else:
    dist.destroy_process_group()
"""


def launch(script: Path, ending: str, env: dict[str, str]) -> tuple[bool, bool]:
    """One torchrun launch; returns (every rank finished its work, torchrun exited 0)."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2",
         "--max-restarts=0", str(script), ending],
        capture_output=True, text=True, env=env, timeout=300,
    )
    return proc.stderr.count("finished") == 2, proc.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launches", type=int, default=20, help="launches per ending")
    args = parser.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    counts = {e: {"finished": 0, "failed_after": 0} for e in ("destroy", "finish")}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "teardown.py"
        script.write_text(SCRIPT)
        for _ in range(args.launches):
            for ending in ("destroy", "finish"):
                finished, ok = launch(script, ending, env)
                if finished:
                    counts[ending]["finished"] += 1
                    counts[ending]["failed_after"] += not ok
    print(f"{args.launches} launches per ending, {time.monotonic() - t0:.0f} s")
    print("| ending | launches that finished their work | of those, torchrun failed at exit |")
    print("|---|---|---|")
    for ending, c in counts.items():
        print(f"| {ending} | {c['finished']} | {c['failed_after']} |")


if __name__ == "__main__":
    main()
