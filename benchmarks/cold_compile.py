"""Is a process slower right after a cold compile than after one from the warm cache?

Sessions of two live arms, ``compile: off`` and ``compile: default`` (the demo model at
batch 256), alternating: a *cold* session whose compile arm compiles with an empty
compiler cache (a fresh ``TORCHINDUCTOR_CACHE_DIR``), then a *warm* session that compiles
from the cache the cold one filled. If the compiled arm runs slower after a cold compile,
a screen that pays the cold compile inside it under-rates compile against every later
confirmation pair (which compiles warm).

Printed per session: the compile time, both arms' window throughputs and their ratio.

Usage (a quiet machine; each cold session takes about a minute on 2 cores):
    python benchmarks/cold_compile.py [--repeats 3] [--rounds 6] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import apply_overrides, spec_from_dict  # noqa: E402
from trainopt.execute.session_runners import InterleavedSessionRunner  # noqa: E402


def _requests(args, out: Path, tag: str) -> tuple[list[TrialRequest], list[Path]]:
    data = yaml.safe_load((ROOT / args.spec).read_text())
    data.pop("search", None)
    data["device"] = "cpu"
    spec = spec_from_dict(data, source_dir=ROOT / "configs")
    reqs = []
    for i, compile_ in enumerate(["off", "default"]):
        settings = apply_overrides(spec, {"batch_size": args.batch_size, "compile": compile_})
        reqs.append(TrialRequest(spec=spec.resolved(), source_dir=str(ROOT / "configs"), settings=settings, mode="measure",
                                 result_path=str(out / f"{tag}-{i}.result.json"), trial_id=f"{tag}-{i}"))
    return reqs, [out / "logs" / f"{tag}-{i}.log" for i in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="configs/resnet.yaml")
    ap.add_argument("--repeats", type=int, default=3, help="cold/warm session pairs")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp(prefix="cold-compile-"))
    ratios: dict[str, list[float]] = {"cold": [], "warm": []}
    for k in range(args.repeats):
        cache = out / f"cache{k}"
        for kind in ("cold", "warm"):
            reqs, logs = _requests(args, out, f"{kind}{k}")
            with InterleavedSessionRunner(rounds=args.rounds, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)}) as runner:
                result = runner.run_session(reqs, logs, timeout_s=600, seed=k)
            off, comp = result.arms
            if not (off.ok and comp.ok):
                print(f"{kind} {k}: failed: {off.error or ''} {comp.error or ''}")
                continue
            ratio = comp.samples_per_s / off.samples_per_s
            ratios[kind].append(math.log(ratio))
            print(f"{kind} {k}: compile {comp.compile_s:.1f} s; off {[round(w) for w in off.windows]}; "
                  f"default {[round(w) for w in comp.windows]}; ratio {ratio:.3f}", flush=True)
    for kind, logs in ratios.items():
        if logs:
            print(f"{kind}: geometric mean ratio {math.exp(statistics.fmean(logs)):.3f} over {len(logs)} sessions "
                  f"(log sd {statistics.stdev(logs) if len(logs) > 1 else float('nan'):.3f})")


if __name__ == "__main__":
    main()
