"""Loader workers bounded by the loader wait, simulated through ``Search``.

A search of one knob, ``num_workers: [0, 2]``, runs ``--reps`` times through
``tests.fakes.simulated_search`` (the real decision code with the CLI's stability guard, fake
processes) with and without the bound (``plan.loader_gain_bound`` replaced by one that never
applies), for each (true factor, loader wait) row. It prints how often the candidate was
called ``improved`` (a false win when the true factor is 1), how often it was kept, and the
confirmation sessions a search spent.

Usage:
    python benchmarks/loader_bound.py [--reps 300] [--sd 0.10]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.conftest import tiny_spec_dict  # noqa: E402
from tests.fakes import FakeRunner, simulated_search  # noqa: E402
from trainopt.contract.spec import spec_from_dict  # noqa: E402
from trainopt.decide import plan  # noqa: E402

ROWS = [(1.0, 0.01), (1.0, 0.05), (1.10, 0.12), (1.25, 0.25)]


def row(tmp: Path, reps: int, factor: float, wait: float, sd: float, bound: bool) -> str:
    improved = kept = sessions = 0
    for seed in range(reps):
        measure = {"pairs": 6, "max_pairs": 14, "confidence": 0.95, "min_speedup": 0.03}
        spec = spec_from_dict(tiny_spec_dict(search={"num_workers": [0, 2]}, measure=measure), "t.yaml", tmp)
        runner = FakeRunner({("num_workers", 2): factor}, arm_sd=sd / math.sqrt(2), session_sd=0.1, seed=seed, wait=wait)
        with mock.patch.object(plan, "loader_gain_bound", plan.loader_gain_bound if bound else (lambda *a: None)):
            doc = simulated_search(spec, tmp, runner).run()
        (d,) = [x for x in doc["decisions"] if x["knob"] == "num_workers"]
        improved += d["verdict"] == "improved"
        kept += bool(d["kept"])
        sessions += len({t["session"]["id"] for t in doc["trials"] if t["role"] == "confirm" and t.get("session")})
    return (f"| {factor} | {wait:.0%} | {'on' if bound else 'off'} | {reps} | {improved / reps:.1%} | {kept / reps:.1%} | "
            f"{sessions / reps:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--sd", type=float, default=0.10, help="pair log-ratio sd")
    args = ap.parse_args()
    print(f"command: python benchmarks/loader_bound.py --reps {args.reps} --sd {args.sd}")
    print("| true factor | loader wait | bound | searches | improved | kept | confirmation sessions per search |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for factor, wait in ROWS:
            for bound in (False, True):
                print(row(Path(tmp), args.reps, factor, wait, args.sd, bound), flush=True)


if __name__ == "__main__":
    main()
