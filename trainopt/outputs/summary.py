"""The command line's summaries: a measurement, a search and the environment, as text and as JSON.

Pure functions from a ``TrialResult``, a results document or a fingerprint to what is printed,
so the CLI only prints and the wording is testable without running anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from trainopt.decide import bottleneck
from trainopt.decide.bottleneck import LABELS, shares_text
from trainopt.decide.run_costs import advise
from trainopt.outputs.worth import not_tried_lines, worth_lines

__all__ = [
    "fmt_bytes",
    "bottleneck_text",
    "breakdown_line",
    "run_cost_lines",
    "measure_summary",
    "measure_json",
    "rates",
    "search_summary",
    "probe_items_line",
    "final_check_text",
    "headline",
    "env_text",
]


def fmt_bytes(n: int | None) -> str:
    if not n:
        return "n/a"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def bottleneck_text(diagnosis: dict[str, Any]) -> str:
    """``compute-bound (the figure behind it)``; results without a reason give their text."""
    verdict = diagnosis.get("bottleneck")
    if diagnosis.get("reason"):
        return f"{LABELS.get(verdict, verdict)} ({diagnosis['reason']})"
    return str(diagnosis.get("text") or LABELS.get(verdict, verdict))


def breakdown_line(diagnosis: dict[str, Any]) -> str:
    """Where a step's time goes, phase by phase, and the bottleneck that follows."""
    breakdown = diagnosis.get("breakdown") or {}
    phases = shares_text(breakdown) or "not profiled (no breakdown in the result)"
    busy = breakdown.get("device_busy")
    if busy is not None:
        phases += f"; device busy {100 * busy:.0f} %"
    return f"where a step's time goes: {phases} → {bottleneck_text(diagnosis)}"


def _fmt_seconds(seconds: float) -> str:
    # A checkpoint of a small model takes milliseconds; "0.00 s" would hide it.
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def run_cost_lines(advice: dict[str, Any] | None) -> list[str]:
    """One line per periodic cost: its share of the run at the spec's frequency and the frequency within budget."""
    if not advice:
        return []
    budget = f"{100 * advice['budget']:.0f} %"
    lines = []
    for name in ("checkpoint", "evaluation"):
        c = advice.get(name)
        if not c:
            continue
        what = f"evaluation ({c['eval_batches']} batches)" if name == "evaluation" and c.get("eval_batches") else name
        lines.append(
            f"{what}: {_fmt_seconds(c['cost_s'])} every {c['every_steps']:,} steps takes {100 * c['share']:.1f} % of the run; "
            f"every {c['every_steps_for_budget']:,} steps or more keeps it within {budget}"
        )
    return lines


def measure_summary(result, spec_name: str, spec_costs: dict[str, Any] | None = None) -> str:
    s = result.settings
    changed = " ".join(f"{k}={v}" for k, v in s.items() if k in ("batch_size", "amp", "num_workers", "compile"))
    lines = [f"{spec_name}  {changed}", f"status: {result.status}"]
    if result.ok:
        kept = len(result.windows) - result.steady_from
        lines.append(
            f"throughput: {result.samples_per_s:,.1f} samples/s  (window median {result.median:,.1f}, "
            f"IQR {result.iqr:,.1f}; {kept} of {len(result.windows)} windows kept, warm-up cut at window "
            f"{result.steady_from}{'' if result.steady else '; NOT steady: the series did not settle'})"
        )
        lines.append(
            f"step time: {result.step_time_s * 1000:.1f} ms   data wait: {result.data_wait_fraction:.0%}   "
            f"peak memory: {fmt_bytes(result.peak_memory_bytes)}   warm-up: {result.warmup_s:.1f} s"
            + (f"   compile: {result.compile_s:.1f} s" if result.compile_s is not None else "")
        )
        lines.append(f"loss: {result.first_loss:.4g} -> {result.last_loss:.4g}")
        lines.append(breakdown_line(bottleneck.diagnose(result.breakdown, result.data_wait_fraction)))
        lines += run_cost_lines(advise(result.run_costs, spec_costs, result.step_time_s))
        if result.world_size > 1:
            ranks = ", ".join(
                f"rank {r['rank']} {r['samples_per_s']:,.1f} samples/s, {fmt_bytes(r['peak_memory_bytes'])}"
                for r in result.per_rank
                if r.get("samples_per_s") is not None
            )
            lines.append(f"data parallel: {result.world_size} ranks ({result.backend}), figures above for all ranks; {ranks}")
    else:
        lines.append(f"reason: {result.error}")
    if result.log_path:
        lines.append(f"log: {result.log_path}")
    return "\n".join(lines)


def measure_json(result, spec_costs: dict[str, Any] | None) -> dict[str, Any]:
    """What ``measure --json`` prints: the trial result (``breakdown`` among its keys), its
    bottleneck with the figure behind it, and the run-costs advice."""
    diagnosis = bottleneck.diagnose(result.breakdown, result.data_wait_fraction)
    return {
        **result.to_dict(),
        "bottleneck": diagnosis["bottleneck"],
        "bottleneck_reason": diagnosis["reason"],
        "run_costs_advice": advise(result.run_costs, spec_costs, result.step_time_s),
    }


def rates(doc: dict[str, Any]) -> tuple[float | None, float | None]:
    """The baseline's and the recommended settings' samples/s, as the summary compares them."""
    base = doc.get("baseline") or {}
    best = doc.get("best") or {}
    final = doc.get("final") or {}
    b = final.get("baseline_samples_per_s") or base.get("samples_per_s")
    a = best.get("samples_per_s")
    kept_first = next((d for d in doc["decisions"] if d["kept"]), None)
    if best.get("source") == "first-kept-change" and kept_first and kept_first.get("before_samples_per_s"):
        # Both figures from the sessions that measured that change, side by side.
        b = kept_first["before_samples_per_s"]
    if best.get("source") == "baseline":
        # The baseline stays: one figure, the baseline's own (the one-shot baseline trial and
        # the final check's baseline arms are two measurements of the same settings).
        a = b
    return b, a


def search_summary(doc: dict[str, Any]) -> str:
    best = doc.get("best") or {}
    final = doc.get("final") or {}
    lines = [f"search {doc['name']}: {'complete' if doc['complete'] else 'INCOMPLETE'}"]
    if doc.get("diagnosis"):
        lines.append(f"bottleneck of the baseline: {bottleneck_text(doc['diagnosis'])}")
    if doc.get("final_diagnosis"):
        lines.append(f"bottleneck of the recommended settings: {bottleneck_text(doc['final_diagnosis'])}")
    elif doc.get("final_diagnosis_error"):
        lines.append(f"bottleneck of the recommended settings: unknown: {doc['final_diagnosis_error']}")
    b, a = rates(doc)
    if b and best.get("source") == "baseline":
        lines.append(f"throughput: {b:,.1f} samples/s (the baseline stays); speedup 1.000x")
    elif b and a:
        ci = doc.get("speedup_ci")
        pairs = best.get("n_pairs", final.get("n_pairs"))
        ci_text = f" [{ci[0]:.3f}, {ci[1]:.3f}] ({pairs} pairs)" if ci else ""
        lines.append(f"throughput: {b:,.1f} -> {a:,.1f} samples/s; speedup {doc.get('speedup') or 1:.3f}x{ci_text}")
    final_text = final_check_text(doc)
    if final_text:
        lines.append(f"final check: {final_text}")
    if best.get("source"):
        lines.append(f"recommended (best.yaml): {best['source']}: {best.get('reason')}")
    lines += training_lines(doc.get("training_check"))
    kept = [d for d in doc["decisions"] if d["kept"]]
    dropped = {d["knob"] for d in (doc.get("training_check") or {}).get("dropped", [])}
    if kept:
        lines.append("kept: " + ", ".join(f"{d['knob']} {d['from']} -> {d['to']} ({d['speedup']:.3f}x"
                                          + ("; left out: trains differently" if d["knob"] in dropped else "") + ")"
                                          for d in kept)
                     + " (each the typical pair's speedup: where a few pairs run much slower, the mean gain is lower)")
    else:
        lines.append("kept: nothing (no change was confirmed as faster)")
    lines += [f"run cost: {line}" for line in run_cost_lines(doc.get("run_costs"))]
    lines += worth_lines(doc.get("worth"))
    lines += [f"budget: {line}" for line in not_tried_lines(doc.get("time_budget"))]
    hint = (doc.get("batch_size") or {}).get("lr_hint")
    if hint:
        lines.append(f"note: {hint}")
    line = probe_items_line((doc.get("batch_size") or {}).get("probe_items"))
    if line:
        lines.append(line)
    c = doc.get("counts", {})
    lines.append(f"trials: {c.get('trials_run', 0)} run, {c.get('trials_reused', 0)} reused from the store")
    sessions = doc.get("sessions") or {}
    if sessions.get("sequential"):
        lines.append(f"note: {sessions['sequential']} session(s) measured one arm at a time: " + "; ".join(sessions.get("notes") or []))
    for warning in doc.get("warnings") or []:
        lines.append(f"WARNING: {warning}")
    return "\n".join(lines)


def final_check_text(doc: dict[str, Any]) -> str | None:
    """The final check in one sentence, without the figures the speedup line already gives.

    When the recommended settings are the final check's, the overall speedup, its interval
    and its pairs are the final check's own: then only its verdict and the contradiction test
    are new. Otherwise (a fallback) its figures are news and stay.
    """
    final = doc.get("final") or {}
    verdict = final.get("verdict")
    if not verdict or verdict == "unchanged":
        return None
    if (doc.get("best") or {}).get("source") == "final-check" and final.get("claim_text"):
        return f"{verdict} over {final.get('n_pairs')} fresh pairs (the speedup above); {final['claim_text']}"
    return f"{verdict}: {final.get('reason')}"


def training_lines(check: dict[str, Any] | None) -> list[str]:
    """The training check in the summary: its verdict, what it left out, the fp16 scaler's skips."""
    if not check:
        return []
    lines = [f"training check: {check['verdict']}: {check.get('reason')}"]
    for d in check.get("dropped") or []:
        lines.append(f"left out of best.yaml (faster, but trains differently): {d['reason']}")
    last = (check.get("rounds") or [None])[-1]
    skipped = (last or {}).get("recommended", {}).get("scaler_skipped")
    if skipped:
        lines.append(f"training check: the fp16 GradScaler skipped {skipped} of {check.get('steps')} steps "
                     "(inf/NaN gradients)")
    return lines


def probe_items_line(items: dict[str, Any] | None) -> str | None:
    """What the batch-size probes were made of, or None when no probe said."""
    if not items:
        return None
    whole = "the whole data set" if items.get("sampled") == items.get("dataset_len") else (
        f"a sample of {items.get('sampled')} of {items.get('dataset_len')} items")
    unit = items.get("unit", "elements")
    return (
        f"batch-size probes: each probe batch held the largest items in {whole}: "
        f"{items.get('largest')} {unit} down to {items.get('in_batch')} {unit} per item "
        f"(the median item has {items.get('median', 0):g})"
    )


def headline(doc: dict[str, Any], out: Path, storage: dict[str, str] | None = None) -> dict[str, Any]:
    """What ``search --json`` prints: the results document's headline as one JSON-ready dict.

    Args:
        doc: The results document.
        out: The output folder.
        storage: The trial store (``url`` with its password masked, ``study``), when not the default.
    """
    best = doc.get("best") or {}
    b, a = rates(doc)

    def bottleneck(diagnosis: dict[str, Any] | None) -> dict[str, Any] | None:
        return {"verdict": diagnosis.get("bottleneck"), "reason": diagnosis.get("reason")} if diagnosis else None

    report = out / "report.html"
    return {
        "name": doc["name"],
        "complete": doc["complete"],
        "baseline_samples_per_s": b,
        "best_samples_per_s": a,
        "speedup": doc.get("speedup"),
        "speedup_ci": doc.get("speedup_ci"),
        "n_pairs": best.get("n_pairs", (doc.get("final") or {}).get("n_pairs")),
        "recommended": {"source": best.get("source"), "reason": best.get("reason"), "settings": best.get("settings")},
        "kept": [{"knob": d["knob"], "from": d["from"], "to": d["to"], "speedup": d.get("speedup"), "ci": d.get("ci")}
                 for d in doc["decisions"] if d["kept"]],
        "bottleneck": {"baseline": bottleneck(doc.get("diagnosis")), "recommended": bottleneck(doc.get("final_diagnosis"))},
        "warnings": list(doc.get("warnings") or []),
        "out": str(out),
        "results": str(out / "results.json"),
        "report": str(report) if report.exists() else None,
        "storage": storage,
    }


def _cpu_ranges(cpus: Sequence[int]) -> str:
    """``0-3,6`` for [0, 1, 2, 3, 6]."""
    parts, run = [], []
    for cpu in sorted(cpus):
        if run and cpu != run[-1] + 1:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(cpu)
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


def env_text(env: dict[str, Any]) -> str:
    lines = []
    for key, value in env.items():
        if key == "cpu_set" and isinstance(value, list):
            value = f"{_cpu_ranges(value)} ({len(value)} CPUs)"
        elif isinstance(value, list):
            value = ", ".join(str(v) for v in value) or "(none)"
        elif value is None:
            value = "n/a"
        lines.append(f"{key}: {value}")
    return "\n".join(lines)


def verify_summary(doc: dict[str, Any]) -> str:
    """``trainopt verify``'s lines: today's speedup beside the recorded one, the training check, what changed here."""
    speed = doc.get("speed") or {}
    rec = doc.get("recorded") or {}
    changed = ", ".join(f"{k}={v}" for k, v in (doc.get("changed") or {}).items()) or "nothing (the baseline itself)"
    lines = [f"verify {doc.get('name')}: {'holds' if doc.get('ok') else 'FAILS'}", f"settings: changes {changed}"]
    ci = speed.get("ci")
    if doc.get("same_settings_as_baseline"):
        speed = {**speed, "reason": "nothing to compare: these are the spec's baseline settings"}
    now = (f"{speed['speedup']:.3f}x [{ci[0]:.3f}, {ci[1]:.3f}] over {speed.get('n_pairs')} fresh pairs"
           if speed.get("speedup") is not None and ci else str(speed.get("reason") or "not measured"))
    then = f"{rec['speedup']:.3f}x" if rec.get("speedup") is not None else "none recorded"
    if rec.get("speedup_ci"):
        then += f" [{rec['speedup_ci'][0]:.3f}, {rec['speedup_ci'][1]:.3f}]"
    lines.append(f"speedup now: {now} ({speed.get('verdict')}); recorded: {then}"
                 + (f" on {rec['measured_at']}" if rec.get("measured_at") else ""))
    lines.append("speed: the win holds" if doc.get("speed_holds") else f"speed: the win does not hold: {speed.get('reason')}")
    lines += training_lines(doc.get("training_check"))
    diffs = doc.get("env_differences") or []
    lines.append("environment: as recorded" if not diffs else "environment differs from the recording: " + "; ".join(diffs))
    return "\n".join(lines)
