"""What importing the compiler in the arm launcher saves a compiled arm, and what it leaves unchanged.

A compiled arm is forked from the launcher and compiles its model in its warm-up. The
launcher imports ``trainopt.contract.boundary.COMPILER_PRELOAD`` on the first request for a compiled arm, so
every later compiled arm starts with the compiler imported. This runs sessions of a plain
and a compiled arm of the same spec (compile off against default), alternating between a
launcher that imports the compiler and one that does not, and prints, per design, the
session's wall time, the compiled arm's warm-up (its compile included) and both arms'
throughput (the compiled arm's speedup must not depend on where the import happened).

Usage (figures need a quiet machine; ``--sessions 2`` only checks the script):
    python benchmarks/compile_start.py [--spec configs/resnet.yaml] [--batch 256] [--sessions 6]
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

from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import apply_overrides, spec_from_dict  # noqa: E402
from trainopt.execute import session_runners as session_mod  # noqa: E402
from trainopt.execute.session_runners import InterleavedSessionRunner  # noqa: E402

_preload = session_mod.arm_preload
DESIGN = {"value": "import"}


def _arm_preload(request):
    return _preload(request) if DESIGN["value"] == "import" else ()


session_mod.arm_preload = _arm_preload


def _requests(args, out: Path, tag: str) -> tuple[list[TrialRequest], list[Path]]:
    data = yaml.safe_load((ROOT / args.spec).read_text())
    data.pop("search", None)
    data["device"] = "cpu"
    data.setdefault("baseline", {}).update(batch_size=args.batch)
    spec = spec_from_dict(data, source_dir=ROOT / "configs")
    reqs = [TrialRequest(spec=spec.resolved(), source_dir=str(ROOT / "configs"),
                         settings=apply_overrides(spec, {"compile": value}), mode="measure",
                         result_path=str(out / f"{tag}-{i}.result.json"), trial_id=f"{tag}-{i}")
            for i, value in enumerate(("off", "default"))]
    return reqs, [out / "logs" / f"{tag}-{i}.log" for i in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="configs/resnet.yaml")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--sessions", type=int, default=6, help="sessions per design")
    args = ap.parse_args()
    print(f"command: python benchmarks/compile_start.py --spec {args.spec} --batch {args.batch} --sessions {args.sessions}")
    rows: dict[str, list[dict]] = {"import": [], "no-import": []}
    runners = {d: InterleavedSessionRunner() for d in rows}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        for s in range(args.sessions):
            for design in (("import", "no-import") if s % 2 == 0 else ("no-import", "import")):
                DESIGN["value"] = design
                reqs, logs = _requests(args, out, f"{design}-{s}")
                t0 = time.perf_counter()
                result = runners[design].run_session(reqs, logs, timeout_s=600, seed=s)
                wall = time.perf_counter() - t0
                plain, compiled = result.arms
                if result.mode != "interleaved" or plain.status != "ok" or compiled.status != "ok":
                    print(f"  {design} session {s}: {result.mode} {plain.status} {compiled.status} {result.note}")
                    continue
                row = {"wall": wall, "warmup": compiled.warmup_s, "compile": compiled.compile_s or 0.0,
                       "ratio": compiled.samples_per_s / plain.samples_per_s}
                rows[design].append(row)
                print(f"  {design:9} session {s}: wall {wall:5.2f} s, compiled arm warm-up {row['warmup']:5.2f} s "
                      f"(compile {row['compile']:5.2f} s), compiled/plain {row['ratio']:.3f}")
        for runner in runners.values():
            runner.close()
    print()
    print("| launcher | sessions | median session wall | median compiled warm-up | median compile | "
          "compiled/plain (geometric mean) |")
    print("|---|---|---|---|---|---|")
    for design, rs in rows.items():
        if not rs:
            continue
        gm = math.exp(statistics.fmean(math.log(r["ratio"]) for r in rs))
        print(f"| {design} | {len(rs)} | {statistics.median(r['wall'] for r in rs):.2f} s | "
              f"{statistics.median(r['warmup'] for r in rs):.2f} s | {statistics.median(r['compile'] for r in rs):.2f} s "
              f"| {gm:.3f} |")


if __name__ == "__main__":
    main()
