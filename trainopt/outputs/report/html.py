"""``report.html``: one self-contained page (figures inlined, no external files or URLs).

Every figure is inlined as a base64 data URI and the CSS and the table-sorting script
are inline, so the file can be mailed, attached to a ticket or opened offline. All
text from the results (names, settings values, error messages, paths) goes through
Jinja2 autoescaping; numbers are formatted here, in Python, so the template only
places strings.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from pathlib import Path
from typing import Any

from trainopt.contract.protocol import FAILED_STATUSES
from trainopt.outputs.report.formats import (
    fmt_bytes,
    fmt_duration,
    fmt_interval,
    fmt_percent,
    fmt_rate,
    fmt_speedup,
    fmt_steps,
    number,
    sentence,
    sort_value,
)
from trainopt.outputs.report.batch_pass import second_pass_context
from trainopt.outputs.report.rows import format_value, speedup_rows
from trainopt.outputs.report.training import training_section
from trainopt.outputs.summary import final_check_text
from trainopt.outputs.worth import not_tried_lines, worth_cards

__all__ = [
    "render_html",
    "report_context",
]

_TEMPLATE = "report.html.j2"

VERDICT_TEXT = {
    "improved": "kept",
    "regressed": "slower",
    "equivalent": "no measurable difference",
    "inconclusive": "inconclusive",
    "screened-out": "screened out",
    "not_applicable": "not applicable",
    "oom": "out of memory",
    "timeout": "timed out",
    "crashed": "crashed",
    "nonfinite": "NaN/inf loss",
    "error": "error",
}

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


# ---- pieces of the page ---------------------------------------------------------------


def _image(path: Path | None) -> str | None:
    if path is None:
        return None
    data = Path(path).read_bytes()
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _log_link(log: Any) -> dict[str, str] | None:
    """A relative link to a trial log; anything that could leave the folder is text only."""
    if not log or not isinstance(log, str):
        return None
    href = None
    if not _SCHEME.match(log) and not log.startswith(("/", "\\")):
        href = urllib.parse.quote(log.replace("\\", "/"), safe="/._-")
    return {"text": log, "href": href}


def _failed_trial(doc: dict[str, Any], d: dict[str, Any]) -> dict[str, Any] | None:
    """The trial whose failure a decision records (the last failed run of that value)."""
    knob, to = d.get("knob"), d.get("to")
    found = None
    for t in doc.get("trials") or []:
        if t.get("knob") != knob or t.get("status") == "ok":
            continue
        if (t.get("settings") or {}).get(knob) == to:
            found = t
    return found


def _table_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        out.append(
            {
                "rank": r["rank"],
                "stage": r["stage"],
                "knob": r["knob"],
                "change": f"{r['from']} → {r['to']}",
                "verdict": r["verdict"],
                "verdict_text": VERDICT_TEXT.get(r["verdict"], r["verdict"]),
                "kept": r["kept"],
                "failed": r["verdict"] in FAILED_STATUSES,
                "speedup": fmt_speedup(r["speedup"]) if r["speedup"] is not None else "",
                "speedup_sort": sort_value(r["speedup"]),
                "interval": fmt_interval([r["ci_low"], r["ci_high"]]),
                "interval_sort": sort_value(r["ci_low"]),
                "pairs": r["pairs"] or "",
                "pairs_sort": str(r["pairs"]),
                "screen": fmt_speedup(r["screen_speedup"]) if r["screen_speedup"] is not None else "",
                "screen_sort": sort_value(r["screen_speedup"]),
                "after": fmt_rate(r["after_samples_per_s"], unit=False) if r["after_samples_per_s"] is not None else "",
                "after_sort": sort_value(r["after_samples_per_s"]),
                "memory": fmt_bytes(r["after_peak_memory_bytes"]) if r["after_peak_memory_bytes"] is not None else "",
                "memory_sort": sort_value(r["after_peak_memory_bytes"]),
                "cumulative": fmt_speedup(r["cumulative_speedup"]) if r["cumulative_speedup"] is not None else "",
                "cumulative_sort": sort_value(r["cumulative_speedup"]),
                "reason": r["reason"],
            }
        )
    return out


def _knob_sections(doc: dict[str, Any]) -> list[dict[str, Any]]:
    decisions = doc.get("decisions") or []
    order = [k for k in (doc.get("search_order") or []) if any(d.get("knob") == k for d in decisions)]
    order += [k for k in dict.fromkeys(d.get("knob") for d in decisions) if k not in order]
    sections = []
    for knob in order:
        mine = [d for d in decisions if d.get("knob") == knob]
        ref = next((d for d in mine if number(d.get("before_samples_per_s")) is not None), None)
        candidates = []
        for d in mine:
            speedup = number(d.get("speedup"))
            if speedup is not None:
                measured = f"{fmt_speedup(speedup)} {fmt_interval(d.get('ci'))} over {d.get('n_pairs') or 0} pairs"
            elif number(d.get("screen_speedup")) is not None:
                measured = f"{fmt_speedup(d.get('screen_speedup'))} (one screening run)"
            else:
                measured = ""
            failed = d.get("verdict") in FAILED_STATUSES
            trial = _failed_trial(doc, d) if failed else None
            extra = d.get("extra") or {}
            value = format_value(d.get("to"))
            if knob == "batch_size" and "grad_accum" in extra:
                value += f" (grad_accum {format_value(extra['grad_accum'])})"
            candidates.append(
                {
                    "value": value,
                    "verdict": d.get("verdict") or "",
                    "verdict_text": VERDICT_TEXT.get(d.get("verdict"), d.get("verdict") or ""),
                    "kept": bool(d.get("kept")),
                    "failed": failed,
                    "throughput": fmt_rate(d.get("after_samples_per_s")),
                    "measured": measured,
                    "memory": fmt_bytes(d.get("after_peak_memory_bytes")),
                    "reason": d.get("reason") or "",
                    "unstable": str(extra["unstable"]) if extra.get("unstable") else "",
                    "log": _log_link(trial.get("log")) if trial else None,
                }
            )
        sections.append(
            {
                "knob": knob,
                "stage": mine[0].get("stage") or "",
                "from": format_value(mine[0].get("from")),
                "incumbent_rate": fmt_rate(ref.get("before_samples_per_s")) if ref else "—",
                "incumbent_memory": fmt_bytes(ref.get("before_peak_memory_bytes")) if ref else "—",
                "candidates": candidates,
            }
        )
    return sections


def _batch_section(doc: dict[str, Any], image: str | None) -> dict[str, Any] | None:
    info = doc.get("batch_size") or {}
    if not info and image is None:
        return None
    probes = [
        {
            "size": p.get("size"),
            "fits": bool(p.get("fits")),
            "status": p.get("status") or "",
            "memory": fmt_bytes(p.get("peak_memory_bytes")),
        }
        for p in info.get("probes") or []
    ]
    failing = sorted(p["size"] for p in probes if not p["fits"] and isinstance(p["size"], int))
    second = second_pass_context(info)
    return {
        "image": image,
        "probes": probes,
        "start": info.get("start"),
        "limit": info.get("limit"),
        "max_fitting": info.get("max_fitting"),
        "safe_max": info.get("safe_max"),
        "margin": fmt_percent(info.get("margin")) if info.get("margin") is not None else None,
        "oom_at": failing[0] if failing else None,
        "lr_hint": info.get("lr_hint"),
        "second": second,
    }


def _compile_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for d in doc.get("decisions") or []:
        extra = d.get("extra") or {}
        if d.get("knob") != "compile" or "compile_s" not in extra:
            continue
        rows.append(
            {
                "mode": format_value(d.get("to")),
                "compile_s": fmt_duration(extra.get("compile_s")),
                "break_even": fmt_steps(extra.get("break_even_steps")),
                "run_length": fmt_steps(extra.get("run_length_steps")) if extra.get("run_length_steps") is not None else "—",
                "verdict": d.get("verdict") or "",
                "verdict_text": VERDICT_TEXT.get(d.get("verdict"), d.get("verdict") or ""),
                "pays_off": number(extra.get("break_even_steps")) is not None
                and number(extra.get("run_length_steps")) is not None
                and extra["break_even_steps"] <= extra["run_length_steps"],
            }
        )
    return rows


ROLE_TEXT = {"screen": "screen", "confirm": "confirmation", "holdout": "hold-out", "final": "final check"}


def _stability_section(doc: dict[str, Any], image: str | None) -> dict[str, Any] | None:
    """The stability panel, or None for results without a ``stability`` section."""
    info = doc.get("stability")
    if not isinstance(info, dict):
        return None
    points = [p for p in info.get("points") or [] if isinstance(p, dict)]
    noise = info.get("noise_by_stage") if isinstance(info.get("noise_by_stage"), dict) else {}
    stages = list(dict.fromkeys([str(p.get("stage")) for p in points if p.get("stage") is not None] + [str(k) for k in noise]))
    rows = []
    for stage in stages:
        mine = [p for p in points if str(p.get("stage")) == stage]
        rows.append(
            {
                "stage": stage,
                "noise": fmt_percent(noise.get(stage)),
                "sessions": sum(1 for p in mine if not p.get("retry")),
                "retries": sum(1 for p in mine if p.get("retry")),
                "unstable": sum(1 for p in mine if p.get("stable") is False),
            }
        )
    unstable = [
        {
            "time": fmt_duration(p.get("t_s")),
            "stage": str(p.get("stage") or ""),
            "knob": str(p.get("knob") or ""),
            "role": ROLE_TEXT.get(p.get("role"), str(p.get("role") or "")),
            "attempt": (p.get("retry") or 0) + 1 if isinstance(p.get("retry"), int) else "",
            "rate": fmt_rate(p.get("samples_per_s")),
            "marked": bool(p.get("final")),
            "reason": str(p.get("reason") or ""),
        }
        for p in points
        if p.get("stable") is False
    ]
    periods = [
        f"{fmt_duration(a)} – {fmt_duration(b)}"
        for a, b in (x for x in info.get("unstable_periods") or [] if isinstance(x, (list, tuple)) and len(x) == 2)
    ]
    from trainopt.decide import machine as machine_check

    verdicts = info.get("unstable_verdicts", 0)
    probe = doc.get("machine") if isinstance(doc.get("machine"), dict) else {}
    before = probe.get("before") if isinstance(probe.get("before"), dict) else {}
    during = [p for p in probe.get("during") or [] if isinstance(p, dict)]
    machine_lines = []
    if before:
        machine_lines.append(f"Before the search: {'busy: ' + str(before.get('reason')) if before.get('busy') else 'quiet'}"
                             + (f" (waited {fmt_duration(before.get('waited_s'))})" if number(before.get("waited_s")) else "") + ".")
    if during:
        busy = [p for p in during if p.get("busy")]
        worst = max(busy, key=lambda p: number(p.get("others")) or 0) if busy else None
        machine_lines.append(f"During the search: busy in {len(busy)} of {len(during)} samples"
                             + (f" (at worst {worst.get('reason')})" if worst else "") + ".")
    notes = (doc.get("sessions") or {}).get("notes") or []
    return {
        "label": machine_check.noise_label({k: v for k, v in noise.items() if number(v) is not None}, verdicts if isinstance(verdicts, int) else 0),
        "machine": machine_lines,
        "cut_notes": [str(n) for n in notes if "measured no further windows" in str(n) or "early cut did not act" in str(n)
                      or "other processes held the cores" in str(n)],
        "image": image,
        "sessions": sum(1 for p in points if not p.get("retry")),
        "retries": info.get("retries", 0),
        "unstable_verdicts": info.get("unstable_verdicts", 0),
        "max_retries": info.get("max_retries"),
        "settle": fmt_duration(info.get("settle_s")) if number(info.get("settle_s")) is not None else None,
        "noise_rows": rows,
        "periods": periods,
        "unstable": unstable,
    }


# What each phase of a profiled step holds (``trainopt.stats.phases.PHASES``), for the panel's table.
PHASE_TEXT = {
    "data_wait": "waiting in next() on the DataLoader",
    "to_device": "copying the batch to the device",
    "forward": "the model and the loss",
    "backward": "gradients (and their all-reduce under data parallelism)",
    "optimizer": "the update and resetting gradients",
    "loss_read": "reading the loss on the host (waits for the device)",
    "other": "everything between the phases",
}


def _breakdown_section(doc: dict[str, Any], image: str | None) -> dict[str, Any]:
    """The "Where a step's time goes" panel: each profiled configuration's phases and verdict, and the run costs."""
    from trainopt.decide.bottleneck import LABELS
    from trainopt.outputs.report.plots import breakdown_configs
    from trainopt.stats.phases import PHASES

    configs = []
    for label, key in (("Baseline", "diagnosis"), ("Recommended settings", "final_diagnosis")):
        diagnosis = doc.get(key)
        if not isinstance(diagnosis, dict) or not diagnosis.get("bottleneck"):
            continue
        breakdown = diagnosis.get("breakdown") if isinstance(diagnosis.get("breakdown"), dict) else {}
        verdict = str(diagnosis.get("bottleneck"))
        busy = number(breakdown.get("device_busy"))
        configs.append({
            "label": label,
            # Results without a reason carry the verdict in words only.
            "verdict": (f"{LABELS.get(verdict, verdict)} ({diagnosis['reason']})" if diagnosis.get("reason")
                        else str(diagnosis.get("text") or LABELS.get(verdict, verdict))),
            "device_busy": fmt_percent(busy) if busy is not None else None,
            "device": "GPU" if breakdown.get("device_type") == "cuda" else str(breakdown.get("device_type") or "device"),
            "steps": breakdown.get("steps") if isinstance(breakdown.get("steps"), int) else None,
            "profiled": isinstance(breakdown.get("shares"), dict),
        })
    profiled = breakdown_configs(doc)
    names = list(PHASES)
    for _, diagnosis in profiled:
        names += [p for p in diagnosis["breakdown"]["shares"] if p not in names]
    phases = [
        {
            "phase": phase,
            "meaning": PHASE_TEXT.get(phase, ""),
            "shares": [fmt_percent((d["breakdown"]["shares"]).get(phase)) for _, d in profiled],
        }
        for phase in names
    ] if profiled else []
    costs = doc.get("run_costs") if isinstance(doc.get("run_costs"), dict) else {}
    run_costs = []
    for name, what in (("checkpoint", "checkpoint save"), ("evaluation", "evaluation pass")):
        c = costs.get(name)
        if not isinstance(c, dict):
            continue
        if name == "evaluation" and isinstance(c.get("eval_batches"), int):
            what += f" ({c['eval_batches']} batches)"
        run_costs.append({
            "what": what,
            # A checkpoint of a small model takes milliseconds, which "0.0 s" would hide.
            "cost": (f"{1000 * c['cost_s']:.1f} ms" if number(c.get("cost_s")) is not None and c["cost_s"] < 1
                     else fmt_duration(c.get("cost_s"))),
            "every": fmt_steps(c.get("every_steps")),
            "share": fmt_percent(c.get("share")),
            "within": bool(c.get("within_budget")),
            "for_budget": fmt_steps(c.get("every_steps_for_budget")),
        })
    final_error = doc.get("final_diagnosis_error")
    return {
        "image": image,
        "configs": configs,
        "columns": [label for label, _ in profiled],
        "phases": phases,
        "profiled": bool(profiled),
        "final_error": str(final_error) if final_error else "",
        "run_costs": run_costs,
        "budget": f"{100 * costs['budget']:.0f}%" if number(costs.get("budget")) is not None else None,
    }


def _env_rows(env: Any) -> list[tuple[str, str]]:
    if not isinstance(env, dict):
        return []
    rows = []
    for key, value in env.items():
        if isinstance(value, (list, tuple)):
            text = ", ".join(str(v) for v in value) or "—"
        elif value is None:
            text = "—"
        else:
            text = format_value(value)
        rows.append((str(key), text))
    return rows


def _device(env: dict[str, Any]) -> str:
    name = env.get("device_name") or env.get("cpu_model")
    if not name:
        return "unknown"
    kind = env.get("device_type")
    text = f"{name} ({kind})" if kind else str(name)
    host = env.get("hostname")
    return f"{text} on {host}" if host else text


def _snippet_spec(out_dir: Path, env: dict[str, Any]) -> dict[str, Any]:
    """What the snippet needs of the resolved spec: the device and the training code's form.

    The device is the resolved spec's, else what the baseline ran on; the data, loss, step and
    optimizer fields let the snippet write the loop the trials ran (``loss: model``, ``step:``,
    a collate) and the optimizer they built (the baseline's own record comes first).
    """
    import yaml

    try:
        spec = yaml.safe_load((Path(out_dir) / "spec.resolved.yaml").read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        spec = None
    spec = spec if isinstance(spec, dict) else {}
    kind = env.get("device_type")
    device = spec["device"] if isinstance(spec.get("device"), str) else (kind if kind in ("cpu", "cuda") else "auto")
    return {**{k: spec[k] for k in ("data", "loss", "step", "optimizer") if k in spec}, "device": device}


def _settings_texts(doc: dict[str, Any], out_dir: Path) -> tuple[str | None, str | None, str | None]:
    """(YAML, PyTorch snippet, why there is no snippet) for the winning settings."""
    import yaml

    from trainopt.errors import UserError
    from trainopt.outputs.results import best_document
    from trainopt.settings.export import render_settings
    from trainopt.settings.production import settings_from_dict

    settings = (doc.get("best") or {}).get("settings")
    if not isinstance(settings, dict) or not settings:
        return None, None, "no settings recorded"
    text = yaml.safe_dump(settings, sort_keys=False)
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    try:
        best = best_document(doc, _snippet_spec(out_dir, env))
        snippet = render_settings(settings_from_dict(best, source="results.json"), "torch", source="results.json")
    except (UserError, KeyError, TypeError, ValueError) as exc:
        # The YAML is still worth showing when the snippet cannot be made from it.
        return text, None, str(exc)
    return text, snippet, None


# How the report names where the recommended settings come from (results.json best.source).
SOURCE_TEXTS = {
    "final-check": "the final settings, every kept change, which the final check does not contradict",
    "first-kept-change": "the baseline plus the first kept change only",
    "baseline": "the baseline settings",
}


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    final = doc.get("final") or {}
    baseline = doc.get("baseline") or {}
    best = doc.get("best") or {}
    env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
    kept = [d for d in doc.get("decisions") or [] if d.get("kept")]
    base_rate = number(final.get("baseline_samples_per_s")) or number(baseline.get("samples_per_s"))
    best_rate = number(best.get("samples_per_s"))
    speedup = number(doc.get("speedup"))
    estimate = None
    if speedup is None and kept:
        product = 1.0
        for d in kept:
            product *= number(d.get("speedup")) or 1.0
        estimate = product
    counts = doc.get("counts") or {}
    source = best.get("source")
    return {
        "baseline_rate": fmt_rate(base_rate, unit=False),
        "baseline_note": "median of the final check's baseline runs" if final.get("n_pairs") else "",
        "best_rate": fmt_rate(best_rate, unit=False),
        "speedup": fmt_speedup(speedup) if speedup is not None else None,
        "gain": (("+" if speedup >= 1 else "") + fmt_percent(speedup - 1.0)) if speedup is not None else None,
        "interval": fmt_interval(doc.get("speedup_ci")),
        "pairs": best.get("n_pairs", final.get("n_pairs")) or 0,
        # The verdict shown next to the speedup is the final check's only when the speedup is its.
        "verdict": (final.get("verdict") or "") if source in (None, "final-check") else "",
        "source": source or "",
        "source_text": SOURCE_TEXTS.get(source, ""),
        # Each fact once: for the final check's settings the source text says it all, and the
        # final check's own figures are on the line below.
        "source_reason": "" if source == "final-check" else sentence(best.get("reason")),
        "final_reason": sentence(final_check_text(doc)),
        "estimate": fmt_speedup(estimate) if estimate is not None else None,
        "elapsed": fmt_duration(doc.get("elapsed_s")),
        "trials_run": counts.get("trials_run", 0),
        "trials_reused": counts.get("trials_reused", 0),
        "device": _device(env),
        "kept": [
            {"knob": str(d.get("knob")), "change": f"{format_value(d.get('from'))} → {format_value(d.get('to'))}", "speedup": fmt_speedup(d.get("speedup"))}
            for d in kept
        ],
        "started_at": doc.get("started_at") or "",
        "updated_at": doc.get("updated_at") or "",
    }


def _baseline_failure(doc: dict[str, Any]) -> dict[str, Any] | None:
    baseline = doc.get("baseline")
    status = (baseline or {}).get("status")
    if baseline is not None and status in (None, "ok"):
        return None
    trial = next((t for t in doc.get("trials") or [] if t.get("role") == "baseline"), None)
    if baseline is None and trial is None:
        if doc.get("complete"):
            return None
        return {"status": "not measured yet", "error": "", "log": None}
    return {
        "status": status or (trial or {}).get("status") or "unknown",
        "error": (baseline or {}).get("error") or (trial or {}).get("error") or "",
        "log": _log_link((trial or {}).get("log")),
    }


def _placement_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Where the trials ran: one row per slot, node and device, with its trial and session counts."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for t in doc.get("trials") or []:
        if t.get("status") == "not_applicable":
            continue
        slot = "" if t.get("slot") is None else str(t.get("slot"))
        key = (slot, str(t.get("node") or ""), str(t.get("device") or ""))
        g = groups.setdefault(key, {"slot": key[0] or "—", "node": key[1] or "—", "device": key[2] or "—",
                                    "trials": 0, "sessions": set(), "modes": set()})
        g["trials"] += 1
        session = t.get("session") or {}
        if session.get("id"):
            g["sessions"].add(session["id"])
            g["modes"].add(str(session.get("mode") or ""))
    return [{**g, "sessions": len(g["sessions"]), "modes": ", ".join(sorted(m for m in g["modes"] if m)) or "—"}
            for g in groups.values()]


def report_context(doc: dict[str, Any], images: dict[str, Path | None], out_dir: Path) -> dict[str, Any]:
    """Everything the template shows, as display-ready strings and flags.

    Args:
        doc: The results document.
        images: Plot file name (``speedups.png`` ...) -> PNG path, or None if not drawn.
        out_dir: The output folder (links to trial logs are relative to it).
    """
    inline = {name: _image(path) for name, path in images.items()}
    settings_yaml, snippet, snippet_problem = _settings_texts(doc, out_dir)
    diagnosis = doc.get("diagnosis") if isinstance(doc.get("diagnosis"), dict) else {}
    return {
        "name": str(doc.get("name") or "search"),
        "version": doc.get("trainopt_version") or "",
        "complete": bool(doc.get("complete")),
        "missing": [str(m) for m in doc.get("missing") or []],
        "baseline_failure": _baseline_failure(doc),
        "summary": _summary(doc),
        "worth_cards": worth_cards(doc.get("worth") if isinstance(doc.get("worth"), dict) else None),
        "not_tried": not_tried_lines(doc.get("time_budget") if isinstance(doc.get("time_budget"), dict) else None),
        "diagnosis": diagnosis.get("text") or "",
        "bottleneck": diagnosis.get("bottleneck") or "",
        "data_wait": fmt_percent(diagnosis.get("data_wait_fraction")) if diagnosis.get("data_wait_fraction") is not None else None,
        "breakdown": _breakdown_section(doc, inline.get("breakdown.png")),
        "rows": _table_rows(speedup_rows(doc)),
        "speedups_img": inline.get("speedups.png"),
        "waterfall_img": inline.get("waterfall.png"),
        "windows_img": inline.get("windows.png"),
        "stability": _stability_section(doc, inline.get("stability.png")),
        "training": training_section(doc, inline.get("training.png")),
        "warnings": [str(w) for w in doc.get("warnings") or [] if w],
        "error_rates": str((doc.get("error_rates") or {}).get("text") or ""),
        "knobs": _knob_sections(doc),
        "batch": _batch_section(doc, inline.get("batch_size.png")),
        "compile": _compile_rows(doc),
        "env": _env_rows(doc.get("env")),
        "placement": _placement_rows(doc),
        "settings_yaml": settings_yaml,
        "snippet": snippet,
        "snippet_problem": snippet_problem,
    }


def render_html(doc: dict[str, Any], images: dict[str, Path | None], out_dir: Path) -> str:
    """The report page as a string (see ``report_context`` for the arguments)."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("trainopt.outputs.report", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    return env.get_template(_TEMPLATE).render(**report_context(doc, images, out_dir))
