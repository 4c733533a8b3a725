"""The report's training check: the loss curves of the last round, and the panel that explains them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainopt.knobs.catalog import format_value
from trainopt.outputs.report.plots import _figure, _legend, _save, _style

__all__ = ["training_curves", "training_section"]

# What each run is, in the legend and the panel's table.
_RUNS = (
    ("reference", "reference (baseline at the recommended batch)", "#1f77b4", "-"),
    ("twin", "reference, another data order", "#7f7f7f", "--"),
    ("recommended", "recommended settings", "#d62728", "-"),
)


def _last_round(doc: dict[str, Any]) -> dict[str, Any] | None:
    check = doc.get("training_check") or {}
    rounds = check.get("rounds") or []
    return rounds[-1] if rounds else None


def _first_round(doc: dict[str, Any]) -> dict[str, Any] | None:
    rounds = (doc.get("training_check") or {}).get("rounds") or []
    return rounds[0] if rounds else None


def training_curves(doc: dict[str, Any], path: Path) -> Path | None:
    """The loss at every step of the first round's runs (where a failure shows), or None without a check.

    The first round is drawn: it holds the settings the search found, so a change that was
    left out shows here with its curve; later rounds checked the settings without it.
    """
    first = _first_round(doc)
    if first is None:
        return None
    fig = _figure(7.0, 3.4)
    ax = fig.add_subplot(1, 1, 1)
    handles = []
    for key, label, color, style in _RUNS:
        losses = (first.get(key) or {}).get("losses") or []
        xs = [i + 1 for i, v in enumerate(losses) if v is not None]
        ys = [v for v in losses if v is not None]
        if xs:
            (line,) = ax.plot(xs, ys, style, color=color, linewidth=1.4, label=label)
            handles.append(line)
    tail = first.get("tail_steps")
    steps = (doc.get("training_check") or {}).get("steps")
    if tail and steps:
        ax.axvspan(steps - tail + 0.5, steps + 0.5, color="#f2f2f2", zorder=0)
    ax.set_xlabel("optimizer step (shaded: the steps judged)")
    ax.set_ylabel("training loss")
    values = [v for key, *_ in _RUNS for v in ((first.get(key) or {}).get("losses") or []) if v is not None]
    if values and min(values) > 0 and max(values) / min(values) > 50:
        ax.set_yscale("log")
    _style(ax)
    _legend(fig, handles)
    return _save(fig, path)


def _fmt(v: Any) -> str:
    return "—" if v is None else f"{v:.4g}"


def training_section(doc: dict[str, Any], image: str | None) -> dict[str, Any] | None:
    """Display-ready facts of the training check, or None when the results have none."""
    check = doc.get("training_check")
    if not check:
        return None
    rounds = []
    for r in check.get("rounds") or []:
        changed = {k: v for k, v in (r.get("settings") or {}).items() if (r.get("reference") or {}).get("settings", {}).get(k) != v}
        rounds.append({
            "changes": ", ".join(f"{k}={format_value(v)}" for k, v in changed.items()) or "—",
            "verdict": str(r.get("verdict") or ""),
            "reference": _fmt(r.get("reference_tail")),
            "twin": _fmt(r.get("twin_tail")),
            "candidate": _fmt(r.get("candidate_tail")),
            "tolerance": _fmt(r.get("tolerance")),
            "skipped": (r.get("recommended") or {}).get("scaler_skipped"),
            "alone": [{"change": f"{a['knob']}={format_value(a['value'])}", "verdict": a.get("verdict"),
                       "candidate": _fmt(a.get("candidate_tail"))} for a in r.get("alone") or []],
        })
    batch = check.get("batch_change") or {}
    return {
        "verdict": str(check.get("verdict") or ""),
        "reason": str(check.get("reason") or ""),
        "steps": check.get("steps"),
        "tail": check.get("tail_steps"),
        "rounds": rounds,
        "dropped": [str(d.get("reason") or "") for d in check.get("dropped") or []],
        "batch": ", ".join(f"{k} {format_value(a)} → {format_value(b)}" for k, (a, b) in (batch.get("changed") or {}).items()),
        "lr_hint": batch.get("lr_hint") or "",
        "image": image,
        "good": check.get("verdict") in ("same", "not_needed"),
    }
