"""Replay finished searches through today's ETA: how close would it have been?

The ETA is a count of remaining trial processes (``plan.search_remaining``) times the
recent cost of one (``ConsoleProgress``). This script takes the output folders of finished
searches, feeds their trials in the order they ran to a ``ConsoleProgress`` and calls
``plan.search_remaining`` at the points where ``Search`` calls it (after the baseline, after
each knob's screen with the number it selected, after each knob), so a change to either
is judged on searches that really ran, without running them again. It prints, per search,
how many progress lines with more than a minute left had an ETA within 25 % of the time
that actually remained, and the median error. It also judges the prices alone: at each
line, the trials that really followed, each priced as the progress prices it at that line,
against the time they really took (the error left once the amount of work is known).

Each search is replayed twice: with the kinds of trial priced at the fixed prior weights
(``plan.prior_cost``, fitted to the CPU demo) and with the prices learned from the
search's own trials as they finish (``plan.ArmCosts``, what ``trainopt search`` does).
With ``--gpu`` every search is also replayed re-timed as on a GPU-like machine, where
start-up and compilation dominate differently: the same trials in the same order, each
process costing ``--startup`` seconds (20) to start, ``--compile`` seconds (60) to compile
when compiled (twice that for the cold-compile trial, from an empty cache), and its timed
windows as the spec sets them (steps take milliseconds, so a window lasts its
``window_seconds``), with a seeded 10 % scatter per process; a session's arms are
started one after another.

Usage:
    python benchmarks/eta_replay.py OUT_DIR [OUT_DIR ...] [--gpu] [--verbose]
"""

from __future__ import annotations

import argparse
import io
import json
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainopt.contract.spec import load_spec  # noqa: E402
from trainopt.decide import plan  # noqa: E402
from trainopt.decide.sequential import SequentialRule, holdout_pairs, typical_pairs  # noqa: E402
from trainopt.search.progress import ConsoleProgress  # noqa: E402


def _gpu_wall(t: dict, measure, startup: float, compile_s: float, rng: random.Random) -> float:
    """One trial process re-timed as on a GPU-like machine (see the module's docstring)."""
    compiled = (t["settings"] or {}).get("compile", "off") != "off"
    timed = measure.warmup_seconds + measure.windows * measure.window_seconds
    if t["role"] in ("baseline", "diagnosis"):
        timed += measure.window_seconds  # the profiled window
    if t["role"] == "probe":
        timed = measure.warmup_seconds
    wall = startup + timed + (compile_s * (2.0 if t["role"] == "cold-compile" else 1.0) if compiled else 0.0)
    return wall * rng.lognormvariate(0.0, 0.1)


def _events(out: Path, doc: dict, gpu: dict | None = None, measure=None) -> list[dict]:
    """The search's trials in the order they finished, with time, cost and wall share.

    With ``gpu`` (``startup``, ``compile``) each process is re-timed by ``_gpu_wall`` and a
    session's wall is the sum of its arms'.
    """
    trials = sorted((t for t in doc["trials"] if t.get("log")), key=lambda t: t["id"])
    sessions: dict[str, list[dict]] = {}
    for t in trials:
        if t.get("session"):
            sessions.setdefault(t["session"]["id"], []).append(t)
    rng = random.Random(0)
    sim = {t["id"]: _gpu_wall(t, measure, gpu["startup"], gpu["compile"], rng) for t in trials} if gpu else {}
    events, clock = [], 0.0
    for t in trials:
        cost = plan.arm_cost(t["settings"], t["role"])
        if t.get("session"):
            arms = sessions[t["session"]["id"]]
            if gpu:
                span_s = sum(sim[a["id"]] for a in arms)
                if t is arms[0]:
                    clock += span_s
            else:
                result = json.loads((out / "trials" / (Path(t["log"]).stem + ".result.json")).read_text())
                span = result["env"].get("session_span") or [0.0, t.get("wall_s") or 0.0]
                span_s = span[1] - span[0]
                clock = t["session"]["finished_s"]
            # As the broker does: the arms share the session's time by their prior weights.
            weight = sum(plan.arm_cost(a["settings"], a["role"]) for a in arms)
            wall = span_s * cost / weight
        else:
            wall = sim[t["id"]] if gpu else (t.get("wall_s") or 0.0)
            clock += wall
        events.append({"trial": t, "cost": cost, "wall": wall, "t": clock})
    return events


def replay(out: Path, verbose: bool = False, learn: bool = True, gpu: dict | None = None) -> dict:
    """Replay one finished search; return its ETA errors.

    Args:
        out: The search's output folder.
        verbose: Print a sample of the replayed lines.
        learn: Price the kinds of trial as learned from the search (else the fixed priors).
        gpu: Re-time it as on a GPU-like machine (``startup``, ``compile`` seconds).
    """
    doc = json.loads((out / "results.json").read_text())
    spec = load_spec(out / "spec.resolved.yaml")
    m = spec.measure
    hold = holdout_pairs(m.confidence, m.interval)
    counts = dict(
        confirm_pairs=typical_pairs(SequentialRule.from_measure(m, family=2), m.max_pairs), holdout_pairs=hold,
        final_pairs=max(m.pairs, hold), batch_candidates=spec.batch_search.max_candidates,
    )
    capped = doc["baseline"].get("env", {}).get("device_type") == "cuda" if isinstance(doc.get("baseline"), dict) else False
    counts["batch_probes"] = plan.typical_batch_probes(int(spec.baseline.get("batch_size") or 1), spec.batch_search.max,
                                                       capped or spec.limits.memory_gb is not None)
    order = doc["search_order"]
    events = _events(out, doc, gpu, m)
    ran = {e["trial"]["knob"] for e in events}
    skip = [k for k in order if k not in ran]
    selected = {k: max([d.get("extra", {}).get("confirmed_with", 0) for d in doc["decisions"] if d["knob"] == k] or [0])
                for k in order}
    kept = [d for d in doc["decisions"] if d.get("kept")]
    progress = ConsoleProgress(quiet=True, stream=io.StringIO(), learn=learn)
    incumbent = dict(spec.baseline)
    end = events[-1]["t"] if gpu else doc["elapsed_s"]
    points = []
    priced: list[tuple[float, float]] = []

    seen: set[tuple[str, str]] = set()

    def update(done: int, sel: int | None = None, confirming=None) -> None:
        kept_now = [d for d in kept if d["knob"] in order[:done]]
        # The first kept change's held-out pairs are owed until some held-out session ran
        # (searches recorded before they were deferred ran them right after the verdict).
        pending = len(kept_now) == 1 and (kept_now[0]["knob"], "holdout") not in seen
        # As Search does: knobs the baseline's loader wait bounds below the margin confirm nothing.
        wait = (doc.get("baseline") or {}).get("data_wait_fraction")
        env = doc.get("env") or {}
        bounded = [k for k in order[done:] if ((b := plan.loader_gain_bound(k, incumbent, wait)) is not None
                   and b < 1.0 + m.min_speedup) or plan.expected_to_confirm_nothing(
                       k, env.get("device_type"), env.get("cpu_flags"), spec.search[k])]
        progress.set_remaining(plan.search_remaining(
            order, done, spec.search, skip=[k for k in skip if order.index(k) >= done], incumbent=incumbent,
            baseline=spec.baseline, selected=sel, reusable=hold if kept_now and not pending else 0, pending=pending,
            screen_only=bounded, confirming=confirming, costs=progress.costs(), **counts))

    # Confirmation pairs finished per candidate, and which of the knob's candidates it is.
    pairs_done: dict[str, int] = {}
    order_in_knob: dict[str, list[str]] = {}

    index = -1
    for i, e in enumerate(events):
        seen.add((e["trial"]["knob"], e["trial"]["role"]))
        t = e["trial"]
        knob, role = t["knob"], t["role"]
        if knob in order and order.index(knob) != index:
            while index < order.index(knob):
                index += 1
                if index > 0:
                    incumbent.update({d["knob"]: d["to"] for d in kept if d["knob"] == order[index - 1]})
                    update(index)
        if role == "confirm" and not any(x["trial"]["knob"] == knob and x["trial"]["role"] == "confirm" for x in events[:i]):
            update(index, selected[knob])
        session = t.get("session")
        if not session:
            progress.trial_started(knob=knob, role=role)
        result = SimpleNamespace(status=t["status"], samples_per_s=t["samples_per_s"], error=t["error"], wall_s=t["wall_s"],
                                 settings=t["settings"], session=session and {"id": session["id"], "arm": session["arm"],
                                                                              "arms": session["arms"]})
        progress.trial_finished(result, wall_s=e["wall"], cost=e["cost"])
        nxt_t = events[i + 1]["trial"] if i + 1 < len(events) else None
        if role == "confirm" and (t.get("session") or {}).get("arm") == 1:
            # Where Search is told: the rule went on past a look (the next pair follows).
            key = json.dumps(t["settings"], sort_keys=True)
            order_in_knob.setdefault(knob, [])
            if key not in order_in_knob[knob]:
                order_in_knob[knob].append(key)
            n = pairs_done[key] = pairs_done.get(key, 0) + 1
            rule = SequentialRule.from_measure(m, family=max(1, selected[knob]))
            looks = [look.n for look in rule.looks]
            going_on = nxt_t is not None and nxt_t["role"] == "confirm" and nxt_t["knob"] == knob
            if n in looks and going_on and n < m.max_pairs:
                update(index, selected[knob], confirming=(order_in_knob[knob].index(key), n, rule.next_look(n), looks))
        if knob == "baseline":
            update(0)
        nxt = events[i + 1]["trial"] if i + 1 < len(events) else None
        if knob in order and role in ("screen", "probe") and (nxt is None or nxt["knob"] != knob) and selected[knob] == 0:
            update(index, 0)
        eta = progress._eta()
        points.append((e["t"], eta, end - e["t"], f"{knob} {role}"))
        # The prices alone: the trials that really followed, each at the price the progress
        # holds now (learned, or the priors), against the time they really took.
        unit = progress.model.unit()
        if unit is not None:
            costs = progress.costs()
            priced.append((unit * sum(plan.arm_cost(x["trial"]["settings"], x["trial"]["role"], costs)
                                      for x in events[i + 1:]), end - e["t"]))
    errs = [eta / left - 1 for _, eta, left, _ in points if eta is not None and left > 60]
    good = sum(abs(x) <= 0.25 for x in errs)
    price_errs = [p / left - 1 for p, left in priced if left > 60]
    if verbose:
        step = max(1, len(points) // 20)
        for t, eta, left, what in points[::step]:
            print(f"   {t:6.0f} s  ETA {eta or 0:5.0f}  left {left:5.0f}  {what}")
    return {"wall": end, "lines": len(errs), "within": good, "median": statistics.median(errs) if errs else None,
            "abs": statistics.median(abs(x) for x in errs) if errs else None,
            "priced_within": sum(abs(x) <= 0.25 for x in price_errs), "priced_lines": len(price_errs),
            "priced_median": statistics.median(price_errs) if price_errs else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outs", nargs="+", type=Path)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--gpu", action="store_true", help="also replay each search re-timed as on a GPU-like machine")
    ap.add_argument("--startup", type=float, default=20.0, help="GPU-like: seconds to start a trial process")
    ap.add_argument("--compile", type=float, default=60.0, help="GPU-like: seconds a compiled process compiles")
    args = ap.parse_args()
    timings = [("as measured", None)]
    if args.gpu:
        timings.append((f"GPU-like (start-up {args.startup:g} s, compile {args.compile:g} s)",
                        {"startup": args.startup, "compile": args.compile}))
    for name, gpu in timings:
        print(f"== {name}")
        for learn in (False, True):
            label = "learned prices" if learn else "fixed weights "
            total = within = priced_total = priced_within = 0
            abs_errs = []
            for out in args.outs:
                r = replay(out, args.verbose, learn=learn, gpu=gpu)
                total += r["lines"]
                within += r["within"]
                if r["abs"] is not None:
                    abs_errs.append(r["abs"])
                median = f"{r['median']:+.0%}" if r["median"] is not None else "-"
                absolute = f"{r['abs']:.0%}" if r["abs"] is not None else "-"
                print(f"  {label} {out}: wall {r['wall']:.0f} s; lines with >60 s left {r['lines']}; within ±25 % "
                      f"{r['within']}; median error {median}; median |error| {absolute}")
                pm = f"{r['priced_median']:+.0%}" if r["priced_median"] is not None else "-"
                print(f"  {label} {'':{len(str(out))}}  the prices alone (the work that followed known): within ±25 % "
                      f"{r['priced_within']} of {r['priced_lines']}; median error {pm}")
                priced_total += r["priced_lines"]
                priced_within += r["priced_within"]
            share = f" ({within / total:.0%})" if total else ""
            worst = f"; median of the searches' median |error| {statistics.median(abs_errs):.0%}" if abs_errs else ""
            print(f"  {label} all: {within} of {total} lines within ±25 %{share}{worst}; the prices alone: "
                  f"{priced_within} of {priced_total}")


if __name__ == "__main__":
    main()
