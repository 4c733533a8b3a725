"""A real search with a CPU busy loop started beside it: does it warn, report the noise, and adopt nothing?

Writes the MLP starter spec with two knobs that should not help: ``sync_every`` (1 -> 8: a
CPU has no device to synchronise with, so an A/A change) and ``threads`` (2 -> 1: on a busy
2-core machine fewer threads can win only because the loop takes a core). Then, for each
case, starts ``nice -n 19`` busy loops (``--loops``, default 1) before or during the search
(``--start before|during``, ``--after-s`` seconds in), runs ``trainopt search`` in a fresh
output folder, and prints: whether the busy-machine warning came before the first trial,
what ``results.json`` records (``machine``: before and during; the stability noise per stage),
the report's stability label, the kept changes, and the warnings.

It measures real timings, so run it on an otherwise quiet machine; a loaded one (other jobs
besides the planted loop) is busy before the planted loop starts.

Usage:
    python benchmarks/busy_machine.py [--start before|during|none] [--loops 1] [--after-s 30]
        [--out runs/busy-machine] [--smoke] [--parallel N]

``--parallel N`` runs the search's sessions in N slots (with slots of one core, the spec has
one thread and ``sync_every`` alone). ``--smoke`` stops the search as soon as the warning (or the first trial) shows and checks only
that part (a few seconds; nothing is measured).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOOP = "while True: pass"


def write_spec(folder: Path, parallel: int | None = None) -> Path:
    """The MLP starter with the A/A knobs; with slots of one core each, one thread and ``sync_every`` only."""
    subprocess.run([sys.executable, "-m", "trainopt", "init", "--model", "mlp", str(folder / "spec.yaml")], check=True,
                   capture_output=True, cwd=folder)
    import yaml

    spec = yaml.safe_load((folder / "spec.yaml").read_text())
    spec["name"] = "busy-machine"
    spec["baseline"]["threads"] = 2
    spec["search"] = {"sync_every": [1, 8], "threads": [2, 1]}
    if parallel and parallel > 1:
        # A slot of one core cannot run two threads (the search refuses it): sync_every alone.
        spec["baseline"]["threads"] = 1
        spec["search"] = {"sync_every": [1, 8]}
    (folder / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return folder / "spec.yaml"


def start_loops(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", LOOP], start_new_session=True) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", choices=["before", "during", "none"], default="before")
    ap.add_argument("--loops", type=int, default=1)
    ap.add_argument("--after-s", type=float, default=30.0, help="with --start during: seconds after the search starts")
    ap.add_argument("--out", default=None)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--parallel", type=int, default=None, help="run the search's sessions in N slots (--parallel N)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp())
    spec = write_spec(work, args.parallel)
    out = Path(args.out) if args.out else work / "out"
    loops: list[subprocess.Popen] = []
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    try:
        if args.start == "before":
            loops = start_loops(args.loops)
            time.sleep(2.0)
        t0 = time.monotonic()
        extra = ["--parallel", str(args.parallel)] if args.parallel else []
        search = subprocess.Popen([sys.executable, "-m", "trainopt", "search", str(spec), "--out", str(out), "--fresh", *extra],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=work,
                                  start_new_session=True)
        warned_before_first_trial = None
        stderr_lines = []
        for line in search.stderr:
            stderr_lines.append(line.rstrip())
            if "machine is busy" in line and warned_before_first_trial is None:
                warned_before_first_trial = True
            if warned_before_first_trial is None and re.search(r"baseline|trial", line):
                warned_before_first_trial = False
            if args.smoke and warned_before_first_trial is not None:
                os.killpg(search.pid, signal.SIGTERM)
                break
            if args.start == "during" and not loops and time.monotonic() - t0 >= args.after_s:
                loops = start_loops(args.loops)
        search.wait()
        print(f"busy loops: {args.loops} ({args.start}); warning before the first trial: {warned_before_first_trial}")
        if args.smoke:
            print("\n".join(stderr_lines[:5]))
            return
        doc = json.loads((out / "results.json").read_text())
        machine = doc.get("machine") or {}
        before = machine.get("before") or {}
        print(f"results.json machine.before: busy={before.get('busy')} others={before.get('others')} top={before.get('top')}")
        print(f"results.json machine.during: {machine.get('busy_samples')} busy of {machine.get('samples')} samples, "
              f"max others {machine.get('max_others')}")
        stability = doc.get("stability") or {}
        print(f"window noise by stage: {stability.get('noise_by_stage')}")
        report = (out / "report.html").read_text() if (out / "report.html").exists() else ""
        label = re.search(r'<div class="label">Stability</div>\s*<div class="value"><span class="\w+">([^<]*)</span>', report)
        print(f"report stability label: {label.group(1) if label else '(none)'}")
        kept = [f"{d['knob']} {d['from']} -> {d['to']}" for d in doc["decisions"] if d["kept"]]
        print(f"kept: {kept or 'nothing'}")
        for w in doc.get("warnings") or []:
            print(f"WARNING: {w}")
    finally:
        stop(loops)


if __name__ == "__main__":
    main()
