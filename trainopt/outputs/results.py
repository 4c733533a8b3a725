"""The files written from a search's results document, and reading it back.

``results.json`` holds the document (``search.document``, where its versioned schema is
given) and is the single source every other output is made from: ``trials.csv``,
``best.yaml``, and the reports. Every file is written atomically, so a crash or a full
disk never leaves a half-written one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from trainopt.atomic import write_json_atomic, write_text_atomic
from trainopt.errors import UserError
from trainopt.outputs.worth import worth_provenance
from trainopt.search.document import RESULTS_SCHEMA_VERSION
from trainopt.version import __version__

__all__ = [
    "RESULTS_SCHEMA_VERSION",
    "ResultsError",
    "write_outputs",
    "read_results",
    "best_document",
]

class ResultsError(UserError):
    """A results file that cannot be read (missing, corrupt or another schema version)."""


def _recommended_changes(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The kept decisions whose changes are in the recommended settings."""
    kept = [d for d in doc["decisions"] if d["kept"]]
    source = (doc.get("best") or {}).get("source")
    if source == "first-kept-change":
        return kept[:1]
    if source == "baseline":
        return []
    return kept  # final-check, or a results file written before ``source`` existed


def _code_section(spec_resolved: dict[str, Any]) -> dict[str, Any] | None:
    """best.yaml's ``code:``: the spec's collate, loss and step, when it uses any beyond pairs and a named loss."""
    collate = (spec_resolved.get("data") or {}).get("collate")
    loss = spec_resolved.get("loss", "cross_entropy")
    step = spec_resolved.get("step")
    if collate is None and step is None and loss != "model":
        return None
    return {"collate": collate, "loss": loss, "step": step}


def best_document(doc: dict[str, Any], spec_resolved: dict[str, Any]) -> dict[str, Any]:
    """The ``best.yaml`` content: the recommended settings plus where and how they were measured.

    A ``code:`` section names the training code the settings were measured with (the spec's
    ``data.collate``, ``loss`` and ``step``) when the spec uses ``data.collate``, ``loss: model``
    or ``step``, so ``load_settings`` can hand the loader its ``collate_fn`` and the export can
    write the loop the trials ran.
    """
    code = _code_section(spec_resolved)
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
        # Only for specs with their own collate, loss: model or step, likewise.
        **({"code": code} if code else {}),
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
            # The production run's hours (and cost) at the baseline and at these settings.
            "worth": worth_provenance(doc.get("worth")),
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
