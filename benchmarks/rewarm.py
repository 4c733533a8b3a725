"""What the untimed re-warm step before each window buys, and what it costs.

Inside an interleaved session an arm is resumed after the other arms ran; before its timed
window it runs ``rewarm_steps`` untimed steps, so the window does not pay for reloading
what the others evicted. This measures that reload directly: every window reply carries
the time of its re-warm step (``rewarm_s``: a step taken cold, plus one loss read) next to
the window's own steps (warm). The cold step's excess over a warm step is the most a
window without re-warm could be slowed by; the share of the window it would take is what
skipping the re-warm would bias an arm by, if the other arm kept it.

It also runs A/A sessions with and without the re-warm, alternating, and prints the
across-session log-ratio sd and the wall time of each design.

Usage (figures need a quiet machine; ``--sessions 2 --rounds 3`` only checks the script):
    python benchmarks/rewarm.py [--spec configs/resnet.yaml] [--batch 32 256] [--sessions 6] [--rounds 6] [--amp bf16]
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
from trainopt.execute.arm_handles import ArmHandle  # noqa: E402
from trainopt.execute.session_runners import InterleavedSessionRunner  # noqa: E402
from trainopt.trial.arm import REWARM_SHARE  # noqa: E402

# Every window reply, as the orchestrator received it: (arm index, reply); and each arm's
# warm-up report (it says whether the arm re-warms at all: long steps skip it).
REPLIES: list[tuple[int, dict]] = []
READY: dict[int, dict] = {}
_ask = ArmHandle.ask


def _recording_ask(self, message, timeout_s, what):
    reply = _ask(self, message, timeout_s, what)
    if reply is not None and reply.get("kind") == "window":
        REPLIES.append((self.index, reply))
    if reply is not None and reply.get("kind") == "ready":
        READY[self.index] = reply
    return reply


ArmHandle.ask = _recording_ask


def _requests(args, batch: int, out: Path, tag: str) -> tuple[list[TrialRequest], list[Path]]:
    data = yaml.safe_load((ROOT / args.spec).read_text())
    data.pop("search", None)
    data["device"] = "cpu"
    data.setdefault("measure", {}).update(windows=args.rounds)
    data.setdefault("baseline", {}).update(batch_size=batch, amp=args.amp)
    spec = spec_from_dict(data, source_dir=ROOT / "configs")
    settings = apply_overrides(spec, {})
    reqs = [TrialRequest(spec=spec.resolved(), source_dir=str(ROOT / "configs"), settings=settings, mode="measure",
                         result_path=str(out / f"{tag}-{i}.result.json"), trial_id=f"{tag}-{i}") for i in range(2)]
    return reqs, [out / "logs" / f"{tag}-{i}.log" for i in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="configs/resnet.yaml")
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--sessions", type=int, default=6, help="A/A sessions per design and batch size")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--amp", default="off", help="the arms' amp setting (bf16 where the CPU has bf16 units)")
    args = ap.parse_args()
    print(f"command: python benchmarks/rewarm.py --spec {args.spec} --batch {' '.join(map(str, args.batch))} "
          f"--sessions {args.sessions} --rounds {args.rounds} --amp {args.amp}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        # Always re-warm (whatever the step) against never: the shipped rule sits between.
        runners = {1: InterleavedSessionRunner(rewarm_steps=1, rewarm_share=math.inf),
                   0: InterleavedSessionRunner(rewarm_steps=0)}
        for batch in args.batch:
            cold_excess, warm_steps, windows = [], [], []
            ratios: dict[int, list[float]] = {1: [], 0: []}
            walls: dict[int, list[float]] = {1: [], 0: []}
            for s in range(args.sessions):
                # Alternate which design goes first, so drifts hit both alike.
                for design in ((1, 0) if s % 2 == 0 else (0, 1)):
                    REPLIES.clear()
                    READY.clear()
                    reqs, logs = _requests(args, batch, out, f"b{batch}-s{s}-r{design}")
                    t0 = time.perf_counter()
                    res = runners[design].run_session(reqs, logs, 300.0, seed=1000 * batch + 10 * s + design)
                    walls[design].append(time.perf_counter() - t0)
                    ratio = res.ratio(1, 0)
                    if ratio:
                        ratios[design].append(math.log(ratio))
                    if design == 1:
                        for arm, reply in REPLIES:
                            warm = reply["elapsed_s"] / reply["steps"]
                            if READY.get(arm, {}).get("rewarm_steps"):
                                cold_excess.append(reply["rewarm_s"] - warm)
                                warm_steps.append(warm)
                                windows.append(reply["elapsed_s"])
            print(f"\nbatch {batch}: {len(cold_excess)} re-warmed windows (as shipped, arms re-warm only while "
                  f"a step is at most {REWARM_SHARE:g} x the window)")
            if cold_excess:
                excess = statistics.median(cold_excess)
                print(f"  warm step {statistics.median(warm_steps) * 1e3:.1f} ms; cold step (re-warm, with a loss read) "
                      f"exceeds it by median {excess * 1e3:+.1f} ms (quartiles "
                      f"{statistics.quantiles(cold_excess, n=4)[0] * 1e3:+.1f} / "
                      f"{statistics.quantiles(cold_excess, n=4)[2] * 1e3:+.1f} ms)")
                print(f"  that is {excess / statistics.median(windows):+.2%} of a timed window "
                      f"({statistics.median(windows) * 1e3:.0f} ms), {excess / statistics.median(warm_steps):+.2%} "
                      f"of a one-step window")
            for design in (1, 0):
                r = ratios[design]
                sd = statistics.stdev(r) if len(r) > 1 else float("nan")
                print(f"  {'always re-warm' if design else 'never re-warm '}: A/A log-ratio mean {statistics.fmean(r):+.4f} sd {sd:.4f} "
                      f"over {len(r)} sessions; session wall median {statistics.median(walls[design]):.2f} s")
        for runner in runners.values():
            runner.close()


if __name__ == "__main__":
    main()
