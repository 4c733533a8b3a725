"""A/A noise, start-up cost and fidelity of interleaved measurement sessions.

A/A noise: sessions of two arms with the SAME settings, each session fresh. The log of
the two arms' throughput ratio should be 0; its standard deviation across sessions is the
noise a confirmation pair carries. Measured for the old design (one fresh trial process
per arm, one after the other: ``SequentialSessionRunner(SubprocessRunner())``) and for the
interleaved one (live arms alternating windows: ``InterleavedSessionRunner``), alternating
the two designs so both see the same machine. For the interleaved sessions it also prints
the noise the windows inside one session predict (sd of the per-round log-ratios / sqrt of
rounds): when the across-session sd is much larger, each arm process carries a persistent
offset of its own, which no number of windows averages away.

Start-up cost per arm: a fresh ``python`` that imports torch, dynamo and trainopt's
trial-side modules (what every one-shot trial pays before building its model), against an
arm forked from the launcher (spawn until the arm's first message).

Fidelity: an arm's throughput inside an interleaved session (median over sessions) against
the plainest hand-written loop of the same model in a fresh process (``PLAIN`` from
``benchmarks/fidelity.py``, same thread count), runs alternating.

Knobs for the noise hunt (each changes only the interleaved arms): ``--omp-wait-policy``,
``--omp-proc-bind``, ``--pin`` (CPU list), ``--no-aslr``, ``--rewarm-steps``.

Usage (the figures need a quiet machine; ``--pairs 2 --rounds 3`` only checks the script):
    python benchmarks/sessions.py [--spec configs/resnet.yaml] [--pairs 10] [--threads 1]
        [--window-seconds 0.5] [--rounds 12] [--seq-window-seconds 0.5] [--seq-windows 6]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fidelity import PLAIN  # noqa: E402
from trainopt.contract.protocol import TrialRequest  # noqa: E402
from trainopt.contract.spec import apply_overrides, spec_from_dict  # noqa: E402
from trainopt.execute.runner import SubprocessRunner  # noqa: E402
from trainopt.execute.session_runners import (  # noqa: E402
    InterleavedSessionRunner,
    SequentialSessionRunner,
)

FRESH_IMPORT = "import torch, torch._dynamo, trainopt.trial.measure, trainopt.trial.workloads, trainopt.trial.worker"


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else float("nan")


def _spec_data(args, window_seconds: float, windows: int) -> dict:
    data = yaml.safe_load((ROOT / args.spec).read_text())
    data.pop("search", None)
    m = data.setdefault("measure", {})
    m.update(window_seconds=window_seconds, windows=windows, warmup_seconds=args.warmup_seconds)
    data["device"] = args.device
    data.setdefault("baseline", {})["threads"] = args.threads
    return data


def _requests(data: dict, out: Path, tag: str) -> tuple[list[TrialRequest], list[Path]]:
    spec = spec_from_dict(data, source_dir=(ROOT / "configs"))
    settings = apply_overrides(spec, {})
    reqs = [TrialRequest(spec=spec.resolved(), source_dir=str(ROOT / "configs"), settings=settings, mode="measure",
                         result_path=str(out / f"{tag}-{i}.result.json"), trial_id=f"{tag}-{i}") for i in range(2)]
    return reqs, [out / "logs" / f"{tag}-{i}.log" for i in range(2)]


def _within_session_sd(result) -> float:
    """Noise of one session's log-ratio as its own windows predict it (round-paired)."""
    a, b = result.arms[0].windows, result.arms[1].windows
    start = max(result.arms[0].steady_from, result.arms[1].steady_from)
    logs = [math.log(y / x) for x, y in zip(a[start:], b[start:])]
    return _sd(logs) / math.sqrt(len(logs)) if len(logs) > 1 else float("nan")


def fresh_import_cost(env: dict) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", FRESH_IMPORT], check=True, capture_output=True, env=env, cwd=ROOT)
    return time.perf_counter() - t0


def plain_loop(spec_path: Path, env: dict) -> float:
    proc = subprocess.run([sys.executable, "-c", PLAIN, str(spec_path)], capture_output=True, text=True, cwd=ROOT,
                          env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])["samples_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="configs/resnet.yaml")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--pairs", type=int, default=10, help="fresh A/A sessions per design")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of every arm and of the plain loop")
    ap.add_argument("--window-seconds", type=float, default=0.5, help="interleaved window length")
    ap.add_argument("--rounds", type=int, default=12, help="interleaved rounds (windows per arm)")
    ap.add_argument("--seq-window-seconds", type=float, default=0.5, help="window length of the sequential trials")
    ap.add_argument("--seq-windows", type=int, default=6, help="windows of each sequential trial")
    ap.add_argument("--warmup-seconds", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--startup-runs", type=int, default=5)
    ap.add_argument("--fidelity-runs", type=int, default=4)
    ap.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], default=None)
    ap.add_argument("--omp-proc-bind", default=None, help="e.g. close, spread, true")
    ap.add_argument("--pin", default=None, help="comma-separated CPUs every arm is pinned to, e.g. 0 or 0,1")
    ap.add_argument("--no-aslr", action="store_true", help="launcher (and so every arm) without ASLR")
    ap.add_argument("--rewarm-steps", type=int, default=1)
    ap.add_argument("--relocate", choices=["off", "on", "both"], default="off",
                    help="move weights and optimizer state to fresh memory before every window; "
                         "both: alternate sessions with and without, in the same run")
    ap.add_argument("--skip", action="append", default=[], choices=["sequential", "interleaved", "startup", "fidelity"])
    ap.add_argument("--json", default=None, help="also write every figure here")
    args = ap.parse_args()

    env = {}
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    if args.omp_proc_bind:
        env["OMP_PROC_BIND"] = args.omp_proc_bind
    cpus = [int(c) for c in args.pin.split(",")] if args.pin else None
    child_env = dict(os.environ, PYTHONPATH=str(ROOT))
    report: dict = {"args": vars(args)}
    seq = SequentialSessionRunner(SubprocessRunner())
    with tempfile.TemporaryDirectory() as tmp, InterleavedSessionRunner(
        window_seconds=args.window_seconds, rounds=args.rounds, rewarm_steps=args.rewarm_steps, env=env, cpus=cpus,
        aslr=not args.no_aslr,
    ) as inter:
        out = Path(tmp)
        seq_data = _spec_data(args, args.seq_window_seconds, args.seq_windows)
        int_data = _spec_data(args, args.window_seconds, args.rounds)
        seq_logs, int_logs, within, int_arms, modes = [], [], [], [], set()
        by_variant: dict[bool, list[float]] = {}
        within_by: dict[bool, list[float]] = {}
        t_launch = time.perf_counter()
        inter._get_fork_server()
        report["launcher_start_s"] = time.perf_counter() - t_launch
        for p in range(args.pairs):
            if "sequential" not in args.skip:
                reqs, logs = _requests(seq_data, out, f"seq{p}")
                r = seq.run_session(reqs, logs, args.timeout, seed=p)
                ratio = r.ratio(1, 0)
                if ratio:
                    seq_logs.append(math.log(ratio))
                print(f"pair {p + 1}: sequential  log-ratio {seq_logs[-1] if ratio else float('nan'):+.4f}  "
                      f"({r.wall_s:.1f} s)", flush=True)
            variants = {"off": [False], "on": [True], "both": [False, True] if p % 2 == 0 else [True, False]}
            for relocate in variants[args.relocate] if "interleaved" not in args.skip else []:
                inter.relocate = relocate
                reqs, logs = _requests(int_data, out, f"int{p}{'r' if relocate else ''}")
                r = inter.run_session(reqs, logs, args.timeout, seed=p)
                modes.add(r.mode)
                ratio = r.ratio(1, 0)
                if ratio:
                    by_variant.setdefault(relocate, []).append(math.log(ratio))
                    within_by.setdefault(relocate, []).append(_within_session_sd(r))
                    int_logs.append(math.log(ratio))
                    within.append(_within_session_sd(r))
                    int_arms += [a.samples_per_s for a in r.arms]
                else:
                    print("  failed arms:", [(a.status, a.error) for a in r.arms])
                print(f"pair {p + 1}: interleaved{' relocating' if relocate else ''} log-ratio "
                      f"{int_logs[-1] if ratio else float('nan'):+.4f}  "
                      f"({r.wall_s:.1f} s, {r.mode}{', ' + r.note if r.note else ''})", flush=True)
        report.update(sequential_log_ratios=seq_logs, interleaved_log_ratios=int_logs, within_session_sd=within,
                      interleaved_modes=sorted(modes),
                      by_relocate={str(k): v for k, v in by_variant.items()},
                      within_by_relocate={str(k): v for k, v in within_by.items()})

        starts_fresh, starts_fork = [], list(inter.startup_s)
        if "startup" not in args.skip:
            for _ in range(args.startup_runs):
                starts_fresh.append(fresh_import_cost(child_env))
            report.update(startup_fresh_s=starts_fresh, startup_fork_s=starts_fork)

        fid_arm, fid_plain = [], []
        if "fidelity" not in args.skip:
            spec_path = out / "fidelity.yaml"
            spec_path.write_text(yaml.safe_dump(int_data))
            plain_env = dict(child_env, OMP_NUM_THREADS=str(args.threads), **env)
            for k in range(args.fidelity_runs):
                reqs, logs = _requests(int_data, out, f"fid{k}")
                r = inter.run_session(reqs, logs, args.timeout, seed=1000 + k)
                fid_arm += [a.samples_per_s for a in r.arms if a.ok]
                fid_plain.append(plain_loop(spec_path, plain_env))
                print(f"fidelity run {k + 1}: arm {statistics.median([a.samples_per_s for a in r.arms if a.ok]):.1f}"
                      f"  plain {fid_plain[-1]:.1f} samples/s", flush=True)
            report.update(fidelity_arm=fid_arm, fidelity_plain=fid_plain)

    print(f"\nspec {args.spec}, {args.threads} thread(s); variant: {env or 'inherited environment'}"
          f"{', pinned to ' + args.pin if args.pin else ''}{', ASLR off' if args.no_aslr else ''}, "
          f"re-warm steps {args.rewarm_steps}")
    if seq_logs:
        print(f"A/A log-ratio sd, sequential fresh processes ({args.seq_windows} x {args.seq_window_seconds} s windows): "
              f"{_sd(seq_logs):.4f} over {len(seq_logs)} pairs (mean {statistics.mean(seq_logs):+.4f})")
    if int_logs:
        print(f"A/A log-ratio sd, interleaved live arms ({args.rounds} rounds x {args.window_seconds} s windows): "
              f"{_sd(int_logs):.4f} over {len(int_logs)} pairs (mean {statistics.mean(int_logs):+.4f}); "
              f"windows inside a session predict {statistics.median(within):.4f}; modes {sorted(modes)}")
    if len(by_variant) > 1:
        for relocate, logs in sorted(by_variant.items()):
            print(f"  {'relocating before every window' if relocate else 'fixed memory'}: sd {_sd(logs):.4f} over "
                  f"{len(logs)} pairs (mean {statistics.mean(logs):+.4f}); windows inside predict "
                  f"{statistics.median(within_by[relocate]):.4f}")
    if starts_fresh:
        print(f"start-up per arm: fresh python + imports median {statistics.median(starts_fresh):.3f} s; "
              f"forked from the launcher median {statistics.median(starts_fork):.4f} s "
              f"(launcher itself, once: {report['launcher_start_s']:.2f} s)")
    if fid_arm and fid_plain:
        ratio = statistics.median(fid_arm) / statistics.median(fid_plain)
        print(f"fidelity: interleaved arm median {statistics.median(fid_arm):.1f} / plain loop median "
              f"{statistics.median(fid_plain):.1f} samples/s = {ratio:.3f}")
        report["fidelity_ratio"] = ratio
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
