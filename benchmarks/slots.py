"""Wall time of the same search with one slot and with two (``--parallel 1`` / ``--parallel 2``).

The workload is the planted input-bound one of the integration tests (slow storage that
two loader workers hide: an unambiguous win), with the baseline at one thread so that a
slot of one core fits every arm. Both searches run here, one after the other, into fresh
output folders; with several repetitions the order alternates (1 then 2, then 2 then 1, ...)
so both see the same machine. Prints every run's wall time, the medians, their ratio, and
both runs' verdicts, which must agree.

Usage (the figures need a quiet machine):
    python benchmarks/slots.py [--reps 1] [--pairs 6] [--max-pairs 12] [--confidence 0.9]
        [--window-seconds 0.2] [--windows 4] [--latency-ms 1.0] [--workers 0 1 2] [--keep DIR] [--more-knobs] [--many-knobs]

It also times what the orchestrator spends storing one arm in the default SQLite store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def spec_data(args) -> dict:
    """The planted input-bound search: num_workers 0 against 2 on a slow dataset.

    With ``--more-knobs`` it also tries ``prefetch_factor`` 4 and ``sync_every`` 8 after it:
    a longer search with the same serial parts (baseline, start-up, final check).
    ``--many-knobs`` adds ``persistent_workers`` and ``optimizer_impl`` foreach to those.
    """
    extra = {}
    if args.more_knobs or args.many_knobs:
        extra.update({"prefetch_factor": [None, 4], "sync_every": [1, 8]})
    if args.many_knobs:
        extra.update({"persistent_workers": [False, True], "optimizer_impl": ["default", "foreach"]})
    return {
        "name": "slots-bench",
        "device": "cpu",
        "model": {"name": "mlp", "args": {"hidden": 32, "layers": 1}},
        "data": {"name": "synthetic-tabular", "args": {"size": 512, "features": 16, "latency_ms": args.latency_ms}},
        "loss": "cross_entropy",
        "optimizer": {"name": "sgd", "args": {"lr": 0.05}},
        "baseline": {"batch_size": 16, "threads": 1},
        "search": {"num_workers": args.workers, **extra},
        "measure": {
            "warmup_steps": 3,
            "warmup_seconds": 0.2,
            "window_seconds": args.window_seconds,
            "windows": args.windows,
            "trial_timeout_s": 300,
            "pairs": args.pairs,
            "max_pairs": args.max_pairs,
            "confidence": args.confidence,
        },
    }


def verdicts(doc: dict) -> dict:
    """What a user acts on: each knob's verdict, the final check's, the recommended settings."""
    return {
        "decisions": [(d["knob"], d["verdict"], d["kept"]) for d in doc["decisions"]],
        "final": doc["final"].get("verdict"),
        "speedup": round(doc["speedup"], 3) if doc.get("speedup") else None,
        "best": doc["best"]["settings"],
    }


def run_search(spec: Path, out: Path, parallel: int) -> tuple[float, dict]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [sys.executable, "-m", "trainopt", "search", str(spec), "--out", str(out), "--quiet",
           "--parallel", str(parallel)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"--parallel {parallel} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    doc = json.loads((out / "results.json").read_text())
    sessions = {t["session"]["id"] for t in doc["trials"] if t["session"]}
    info = {"verdicts": verdicts(doc), "trials": len(doc["trials"]), "sessions": len(sessions),
            "slots": sorted({t["slot"] for t in doc["trials"] if t["slot"] is not None}),
            "time_by_role": time_by_role(out, doc)}
    return wall, info


def time_by_role(out: Path, doc: dict) -> dict[str, list[float]]:
    """Role -> each session's wall time on its slot (from ``env["session_span"]``), plus the
    lone trials (baseline, probes) by their own wall time."""
    seen: dict[str, tuple[str, float]] = {}
    lone: dict[str, list[float]] = {}
    for t in doc["trials"]:
        if t["session"]:
            env = json.loads((out / "trials" / (Path(t["log"]).stem + ".result.json")).read_text())["env"]
            start, end = env["session_span"]
            seen[t["session"]["id"]] = (t["role"], end - start)
        elif t["wall_s"]:
            lone.setdefault(t["role"], []).append(t["wall_s"])
    by_role: dict[str, list[float]] = dict(lone)
    for role, seconds in seen.values():
        by_role.setdefault(role, []).append(seconds)
    return by_role


# Sessions counted as running alone whatever the slots: lone trials, a knob's screen, the
# final check and the held-out sessions (both exclusive: held-out sessions may become the
# final check). The rest (the
# confirmation pairs up to each look) are handed to the executor as batches. A screen with
# several candidates is split over the slots, so counting it as alone makes the printed
# ceiling a lower guide for such searches.
ALONE = ("baseline", "probe", "screen", "holdout", "final")


def amdahl(wall: float, by_role: dict[str, list[float]], slots: int) -> tuple[float, float, float]:
    """(seconds that must stay serial, seconds in batches, best wall-time ratio ``slots`` allow)."""
    alone = sum(sum(v) for r, v in by_role.items() if r in ALONE)
    batched = sum(sum(v) for r, v in by_role.items() if r not in ALONE)
    return alone, batched, wall / (wall - batched + batched / slots)


def store_cost(root: Path, arms: int = 200) -> float:
    """Seconds the orchestrator spends storing one arm (open + finish) in the default SQLite store."""
    from trainopt.contract.protocol import TrialResult
    from trainopt.search.store import TrialStore, default_storage_url

    folder = root / "store-cost"
    folder.mkdir(parents=True, exist_ok=True)
    store = TrialStore(default_storage_url(folder), "store-cost", "fingerprint")
    result = TrialResult(status="ok", settings={"batch_size": 16, "num_workers": 2}, samples_per_s=1234.5,
                         windows=[1234.5] * 12, env={"slot": 1, "node": "n", "device": "cpu:1", "cpu_set": [1]},
                         session={"id": "confirm/k/abc/pair3", "arm": 0, "arms": 2, "mode": "interleaved"})
    t0 = time.perf_counter()
    for i in range(arms):
        key = f"confirm/num_workers/abc/pair{i}/arm0/0123456789abcdef"
        meta = {"stage": "input", "knob": "num_workers", "role": "confirm", "tag": f"pair{i}", "mode": "measure"}
        store.finish(store.begin(key, meta), key, meta, result)
    return (time.perf_counter() - t0) / arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--max-pairs", type=int, default=12)
    ap.add_argument("--confidence", type=float, default=0.9)
    ap.add_argument("--window-seconds", type=float, default=0.2)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--latency-ms", type=float, default=1.0)
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="the num_workers levels searched")
    ap.add_argument("--keep", type=Path, default=None, help="keep the output folders here")
    ap.add_argument("--more-knobs", action="store_true", help="also search prefetch_factor and sync_every")
    ap.add_argument("--many-knobs", action="store_true",
                    help="also search prefetch_factor, sync_every, persistent_workers and optimizer_impl")
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs at least two cores")
    root = args.keep or Path(tempfile.mkdtemp(prefix="trainopt-slots-"))
    root.mkdir(parents=True, exist_ok=True)
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(spec_data(args), sort_keys=False))
    walls: dict[int, list[float]] = {1: [], 2: []}
    infos: dict[int, list[dict]] = {1: [], 2: []}
    for rep in range(args.reps):
        for n in ((1, 2) if rep % 2 == 0 else (2, 1)):
            wall, info = run_search(spec, root / f"rep{rep}-parallel{n}", n)
            walls[n].append(wall)
            infos[n].append(info)
            print(f"rep {rep} --parallel {n}: {wall:7.1f} s  ({info['sessions']} sessions, {info['trials']} trials, "
                  f"slots {info['slots']})", flush=True)
    one, two = statistics.median(walls[1]), statistics.median(walls[2])
    print(f"\n--parallel 1: median {one:.1f} s  {['%.1f' % w for w in walls[1]]}")
    print(f"--parallel 2: median {two:.1f} s  {['%.1f' % w for w in walls[2]]}")
    print(f"speed-up (parallel 1 / parallel 2): {one / two:.2f}x")
    for rep, (wall, info) in enumerate(zip(walls[1], infos[1])):
        alone, batched, bound = amdahl(wall, info["time_by_role"], 2)
        counts = {r: len(v) for r, v in info["time_by_role"].items()}
        print(f"--parallel 1 rep {rep}: {alone:.1f} s in trials/sessions that run alone, {batched:.1f} s in batched "
              f"sessions, {wall - alone - batched:.1f} s elsewhere (start-up, orchestrator); sessions by role {counts}; "
              f"best ratio two slots allow: {bound:.2f}x")
    for n in (1, 2):
        for rep, info in enumerate(infos[n]):
            print(f"verdicts --parallel {n} rep {rep}: {json.dumps(info['verdicts'])}")
    same = all(i["verdicts"]["decisions"] == infos[1][0]["verdicts"]["decisions"]
               and i["verdicts"]["final"] == infos[1][0]["verdicts"]["final"]
               and i["verdicts"]["best"] == infos[1][0]["verdicts"]["best"] for n in (1, 2) for i in infos[n])
    print(f"same verdicts in every run: {same}")
    print(f"store cost per arm (SQLite, open + finish): {1000 * store_cost(root):.1f} ms")
    print(f"outputs: {root}")


if __name__ == "__main__":
    main()
