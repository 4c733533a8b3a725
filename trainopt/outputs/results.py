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
    """The kept decisions whose changes are in the recommended settings (not those the training check left out)."""
    dropped = {d["knob"] for d in (doc.get("training_check") or {}).get("dropped", [])}
    kept = [d for d in doc["decisions"] if d["kept"] and d["knob"] not in dropped]
    source = (doc.get("best") or {}).get("source")
    if source == "first-kept-change":
        return kept[:1]
    if source == "baseline":
        return []
    return kept  # final-check, or a results file without ``source``


def _spec_optimizer(spec_resolved: dict[str, Any]) -> dict[str, Any] | None:
    """The spec's optimizer as best.yaml records it, when no trial recorded the one it built."""
    from trainopt.contract.spec import BUILTIN_OPTIMIZER_CLASSES

    section = spec_resolved.get("optimizer")
    if not isinstance(section, dict) or not section.get("name"):
        return None
    name = section["name"]
    args = {k: v for k, v in (section.get("args") or {}).items() if k not in ("foreach", "fused")}
    return {"source": "spec", "name": name, "class": BUILTIN_OPTIMIZER_CLASSES.get(name), "args": args}


def _code_section(spec_resolved: dict[str, Any], workload: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """best.yaml's ``code:``: the training code the settings were measured with.

    The spec's collate, loss (none beside a ``step`` or a LightningModule's
    ``training_step``, which compute it) and step; from the baseline trial's record
    (``workload``, see ``trainopt.trial.workload_record``) the loss form, the optimizer it
    built and a LightningModule's own loader batch size; without that record, the spec's
    optimizer. None when there is nothing beyond pairs, a named loss and no optimizer.
    """
    collate = (spec_resolved.get("data") or {}).get("collate")
    loss = spec_resolved.get("loss", "cross_entropy")
    step = spec_resolved.get("step")
    record = workload if isinstance(workload, dict) else {}
    form = record.get("form")
    optimizer = record.get("optimizer") or _spec_optimizer(spec_resolved)
    if collate is None and step is None and loss != "model" and optimizer is None and form in (None, "pair"):
        return None
    code: dict[str, Any] = {"collate": collate}
    if step is None and form != "lightning":
        code["loss"] = loss
    code["step"] = step
    if form is not None:
        code["form"] = form
    if optimizer is not None:
        code["optimizer"] = optimizer
    if record.get("data_batch_size") is not None:
        code["data_batch_size"] = record["data_batch_size"]
    return code


def _training_provenance(check: dict[str, Any] | None) -> dict[str, Any] | None:
    """best.yaml's account of the training check: its verdict, and what it left out and why."""
    if not check:
        return None
    return {"verdict": check.get("verdict"), "reason": check.get("reason"), "steps": check.get("steps"),
            "left_out": [{"knob": d["knob"], "value": d["value"], "reason": d["reason"]} for d in check.get("dropped") or []]}


def best_document(doc: dict[str, Any], spec_resolved: dict[str, Any]) -> dict[str, Any]:
    """The ``best.yaml`` content: the recommended settings plus where and how they were measured.

    A ``code:`` section names the training code the settings were measured with (the spec's
    ``data.collate``, ``loss`` and ``step``, the loss form and the optimizer the baseline trial
    built), so ``load_settings`` can hand the loader its ``collate_fn`` and the export can
    write the loop and the optimizer the trials ran.
    """
    code = _code_section(spec_resolved, (doc.get("baseline") or {}).get("workload"))
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
        # Only when there is code to name (see _code_section).
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
            "training_check": _training_provenance(doc.get("training_check")),
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
