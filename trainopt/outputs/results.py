"""The results document of a search and the files written from it.

``results.json`` (schema below, versioned) is the single source every other output is
made from: ``trials.csv``, ``best.yaml``, and the reports. Every file is written
atomically, so a crash or a full disk never leaves a half-written one.

Schema (``schema_version`` 1)::

    kind: "trainopt-results"; schema_version: 1; trainopt_version; name; spec_fingerprint
    complete: bool               # false while running or after an interruption
    missing: [knob, ...]         # knobs not decided yet (partial results)
    started_at, updated_at: ISO 8601; elapsed_s
    diagnosis: {bottleneck: input|compute|unknown, data_wait_fraction, text}
    search_order: [knob, ...]
    baseline: {settings, samples_per_s, step_time_s, data_wait_fraction, peak_memory_bytes}
    best: {settings, samples_per_s, source, reason, n_pairs}
                                 # the recommended settings: source is final-check,
                                 # first-kept-change or baseline (see trainopt/decide/recommendation.py)
    speedup, speedup_ci: [low, high] | null   # of best against the baseline (null while partial
                                 # and nothing is confirmed)
    final: {verdict, reason, n_pairs, speedup, ci, samples_per_s, baseline_samples_per_s,
            reused_pairs?, unstable?}
                                 # the final check of the final settings, whatever its verdict;
                                 # reused_pairs: how many of its pairs are the only kept
                                 # change's held-out pairs (the same comparison)
    decisions: [{knob, stage, from, to, verdict, reason, speedup, ci, n_pairs, screen_speedup,
                 before_samples_per_s, after_samples_per_s, before_peak_memory_bytes,
                 after_peak_memory_bytes, kept, extra}]
    trials: [{id, key, stage, knob, role, tag, mode, settings, status, samples_per_s,
              peak_memory_bytes, step_time_s, data_wait_fraction, windows, steady_from,
              steady, compile_s, warmup_s, wall_s, error, log}]
    batch_size: {start, limit, max_fitting, safe_max, margin, probes: [{size, fits, status,
                 peak_memory_bytes}], lr_hint}
    env: fingerprint of the machine (from the baseline trial)
    measure: the measurement settings used; counts: {trials_run, trials_reused}
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml

from trainopt.atomic import write_json_atomic, write_text_atomic
from trainopt.decide.recommendation import recommend
from trainopt.errors import UserError
from trainopt.search.state import SearchState, TrialRecord
from trainopt.version import __version__

__all__ = [
    "RESULTS_SCHEMA_VERSION",
    "ResultsError",
    "build_results",
    "write_outputs",
    "read_results",
    "best_document",
]

RESULTS_SCHEMA_VERSION = 1


class ResultsError(UserError):
    """A results file that cannot be read (missing, corrupt or another schema version)."""


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def _trial_row(t: TrialRecord, out_dir: Path) -> dict[str, Any]:
    r = t.result
    log = r.log_path
    if log:
        try:
            log = os.path.relpath(log, out_dir)
        except ValueError:
            pass
    return {
        "id": t.id,
        "key": t.key,
        "stage": t.stage,
        "knob": t.knob,
        "role": t.role,
        "tag": t.tag,
        "mode": t.mode,
        "settings": r.settings,
        "status": r.status,
        "samples_per_s": r.samples_per_s,
        "peak_memory_bytes": r.peak_memory_bytes,
        "step_time_s": r.step_time_s,
        "data_wait_fraction": r.data_wait_fraction,
        "windows": r.windows,
        "steady_from": r.steady_from,
        "steady": r.steady,
        "compile_s": r.compile_s,
        "warmup_s": r.warmup_s,
        "wall_s": r.wall_s,
        "error": r.error,
        "log": log,
        "session": r.session,
        "slot": r.env.get("slot"),
        "node": r.env.get("node"),
        "device": r.env.get("device"),
    }


def build_results(state: SearchState, complete: bool) -> dict[str, Any]:
    """The results document for a search's state (partial or complete)."""
    base = state.baseline
    final = state.final or {}
    rec = recommend(
        base.settings if base else state.baseline_settings, base.samples_per_s if base else None, state.decisions, final
    )
    missing = [k for k in (state.order or state.planned_knobs) if k not in state.done_knobs]
    if not complete and not final:
        missing.append("final check")
    decisions = []
    for d in state.decisions:
        row = d.to_dict()
        row["from"] = row.pop("from_value")
        row["to"] = row.pop("to_value")
        decisions.append(row)
    return {
        "kind": "trainopt-results",
        "schema_version": RESULTS_SCHEMA_VERSION,
        "trainopt_version": __version__,
        "name": state.name,
        "spec_fingerprint": state.spec_fingerprint,
        "complete": complete,
        "missing": [] if complete else missing,
        "started_at": dt.datetime.fromtimestamp(state.started).astimezone().isoformat(timespec="seconds"),
        "updated_at": _now(),
        "elapsed_s": time.time() - state.started,
        "diagnosis": state.diagnosis,
        "search_order": state.order,
        "baseline": None
        if base is None
        else {
            "settings": base.settings,
            "status": base.status,
            "samples_per_s": base.samples_per_s,
            "step_time_s": base.step_time_s,
            "data_wait_fraction": base.data_wait_fraction,
            "peak_memory_bytes": base.peak_memory_bytes,
            "error": base.error,
        },
        "best": {
            "settings": rec.settings,
            "samples_per_s": rec.samples_per_s,
            "source": rec.source,
            "reason": rec.reason,
            "n_pairs": rec.n_pairs,
        },
        "speedup": rec.speedup,
        "speedup_ci": rec.ci,
        "final": {k: v for k, v in final.items() if k != "settings"},
        "decisions": decisions,
        "trials": [_trial_row(t, state.out_dir) for t in state.trials],
        "batch_size": state.batch_info,
        "env": base.env if base else {},
        "measure": state.measure,
        "counts": {"trials_run": state.ran, "trials_reused": state.reused},
        "sessions": _sessions_summary(state),
        "stability": state.guard.to_dict() if state.guard is not None else None,
        "warnings": list(state.warnings),
    }


def _sessions_summary(state: SearchState) -> dict[str, Any]:
    """How the sessions were measured: how many live-interleaved, how many fell back, and why."""
    seen: dict[str, dict[str, Any]] = {}
    for t in state.trials:
        info = t.result.session
        if info:
            seen.setdefault(info["id"], info)
    notes = sorted({i["note"] for i in seen.values() if i.get("note")})
    return {
        "interleaved": sum(1 for i in seen.values() if i.get("mode") == "interleaved"),
        "sequential": sum(1 for i in seen.values() if i.get("mode") == "sequential"),
        "notes": notes,
    }


def _recommended_changes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The kept decisions whose changes are in the recommended settings."""
    kept = [d for d in doc["decisions"] if d["kept"]]
    source = (doc.get("best") or {}).get("source")
    if source == "first-kept-change":
        return kept[:1]
    if source == "baseline":
        return []
    return kept  # final-check, or a results file written before ``source`` existed


def best_document(doc: dict[str, Any], spec_resolved: dict[str, Any]) -> dict[str, Any]:
    """The ``best.yaml`` content: the recommended settings plus where and how they were measured."""
    final = doc.get("final") or {}
    best = doc["best"]
    baseline = doc.get("baseline") or {}
    changes = _recommended_changes(doc)
    batch_changed = (baseline.get("settings") or {}).get("batch_size") not in (None, best["settings"].get("batch_size"))
    return {
        "schema_version": 1,
        "kind": "trainopt-settings",
        "device": spec_resolved.get("device", "auto"),
        "settings": best["settings"],
        # Only for data-parallel searches, so single-process best.yaml files stay as they were.
        **({"distributed": spec_resolved["distributed"]} if spec_resolved.get("distributed") else {}),
        "provenance": {
            "search": doc["name"],
            "measured_at": doc["updated_at"],
            "trainopt_version": doc["trainopt_version"],
            "complete": doc["complete"],
            "settings_source": best.get("source"),
            "settings_reason": best.get("reason"),
            "samples_per_s": best.get("samples_per_s"),
            "baseline_samples_per_s": final.get("baseline_samples_per_s") or baseline.get("samples_per_s"),
            "speedup": doc.get("speedup"),
            "speedup_ci": doc.get("speedup_ci"),
            "verdict": final.get("verdict"),
            "kept": [
                {"knob": d["knob"], "from": d["from"], "to": d["to"], "speedup": d["speedup"], "ci": d["ci"], "n_pairs": d["n_pairs"]}
                for d in changes
            ],
            "lr_hint": (doc.get("batch_size") or {}).get("lr_hint") if batch_changed else None,
            "env": doc.get("env", {}),
        },
    }


def write_outputs(out_dir: Path, doc: dict[str, Any], spec_resolved: dict[str, Any]) -> None:
    """Write results.json, trials.csv, best.yaml and spec.resolved.yaml into ``out_dir``."""
    import pandas as pd

    out_dir = Path(out_dir)
    write_json_atomic(out_dir / "results.json", doc)
    rows = []
    for t in doc["trials"]:
        row = {k: v for k, v in t.items() if k not in ("settings", "windows")}
        row.update({f"set_{k}": v for k, v in t["settings"].items()})
        row["n_windows"] = len(t["windows"])
        rows.append(row)
    frame = pd.DataFrame(rows)
    write_text_atomic(out_dir / "trials.csv", frame.to_csv(index=False))
    write_text_atomic(
        out_dir / "best.yaml",
        "# Winning settings found by `trainopt search`; load with trainopt.load_settings().\n"
        + yaml.safe_dump(best_document(doc, spec_resolved), sort_keys=False),
    )
    write_text_atomic(out_dir / "spec.resolved.yaml", yaml.safe_dump(spec_resolved, sort_keys=False))


def read_results(path: Path) -> dict[str, Any]:
    """Read ``results.json`` from a file or an output folder, checking its schema version.

    Raises:
        ResultsError: Missing, unreadable, not a results file, or another schema version.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path}: no results here; run `trainopt search SPEC --out {path.parent}` first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: cannot read results ({exc})") from None
    if not isinstance(doc, dict) or doc.get("kind") != "trainopt-results":
        raise ResultsError(f"{path}: not a trainopt results file")
    version = doc.get("schema_version")
    if version != RESULTS_SCHEMA_VERSION:
        raise ResultsError(
            f"{path}: results schema version {version!r}; this trainopt {__version__} reads version "
            f"{RESULTS_SCHEMA_VERSION}. Re-run the search with --fresh, or use the trainopt that wrote it"
        )
    return doc
