"""The ranked speedup table: one row per decision, kept changes first.

Pure functions over the results document (no plotting, no HTML), so the CSV, the HTML
table and any script reading ``results.json`` all rank decisions the same way.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trainopt.knobs.catalog import format_value

__all__ = [
    "COLUMNS",
    "FLOAT_COLUMNS",
    "VERDICT_ORDER",
    "format_value",
    "speedup_rows",
    "write_speedups_csv",
    "read_speedups_csv",
]

COLUMNS = (
    "rank",
    "stage",
    "knob",
    "from",
    "to",
    "verdict",
    "kept",
    "speedup",
    "ci_low",
    "ci_high",
    "pairs",
    "screen_speedup",
    "before_samples_per_s",
    "after_samples_per_s",
    "before_peak_memory_bytes",
    "after_peak_memory_bytes",
    "cumulative_speedup",
    "reason",
)

# Written as floats even when every value happens to be whole (peak memory), so a reader
# gets the same dtype whatever the search found.
FLOAT_COLUMNS = (
    "speedup",
    "ci_low",
    "ci_high",
    "screen_speedup",
    "before_samples_per_s",
    "after_samples_per_s",
    "before_peak_memory_bytes",
    "after_peak_memory_bytes",
    "cumulative_speedup",
)

# After the kept changes: the closest misses first, then what could not be measured.
VERDICT_ORDER = ("improved", "regressed", "equivalent", "inconclusive", "screened-out", "oom", "timeout", "crashed", "nonfinite", "error", "not_applicable")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _ci(decision: dict[str, Any]) -> tuple[float | None, float | None]:
    ci = decision.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2:
        return _number(ci[0]), _number(ci[1])
    return None, None


def _sort_key(index: int, decision: dict[str, Any]) -> tuple:
    verdict = decision.get("verdict") or ""
    group = VERDICT_ORDER.index(verdict) if verdict in VERDICT_ORDER else len(VERDICT_ORDER)
    if decision.get("kept"):
        group = -1
    best = _number(decision.get("speedup"))
    if best is None:
        best = _number(decision.get("screen_speedup"))
    # Fastest first inside a group; ties keep the order the search made them in.
    return (group, -(best if best is not None else -math.inf), index)


def speedup_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per decision, ranked: kept changes by confirmed speedup, then the rest.

    The rest follow ``VERDICT_ORDER`` (regressed, equivalent, inconclusive, screened-out,
    failures, not applicable), each with the reason the search gave.
    ``cumulative_speedup`` is the product of the kept speedups up to and including the
    row, and None on rows that were not kept.

    Args:
        doc: A results document (see ``trainopt.outputs.results``).

    Returns:
        Dicts with the keys in ``COLUMNS``; numbers are floats or None, ``from``/``to``
        are strings as written in ``best.yaml``.
    """
    decisions = [d for d in (doc.get("decisions") or []) if isinstance(d, dict)]
    ranked = sorted(enumerate(decisions), key=lambda pair: _sort_key(*pair))
    rows = []
    cumulative = 1.0
    for rank, (_, d) in enumerate(ranked, start=1):
        low, high = _ci(d)
        speedup = _number(d.get("speedup"))
        kept = bool(d.get("kept"))
        cum = None
        if kept:
            cumulative *= speedup if speedup is not None else 1.0
            cum = cumulative
        rows.append(
            {
                "rank": rank,
                "stage": str(d.get("stage") or "") + (" (second pass)" if (d.get("extra") or {}).get("batch_pass") == 2 else ""),
                "knob": str(d.get("knob") or ""),
                "from": format_value(d.get("from")),
                "to": format_value(d.get("to")),
                "verdict": str(d.get("verdict") or ""),
                "kept": kept,
                "speedup": speedup,
                "ci_low": low,
                "ci_high": high,
                "pairs": int(d.get("n_pairs") or 0),
                "screen_speedup": _number(d.get("screen_speedup")),
                "before_samples_per_s": _number(d.get("before_samples_per_s")),
                "after_samples_per_s": _number(d.get("after_samples_per_s")),
                "before_peak_memory_bytes": _number(d.get("before_peak_memory_bytes")),
                "after_peak_memory_bytes": _number(d.get("after_peak_memory_bytes")),
                "cumulative_speedup": cum,
                "reason": str(d.get("reason") or ""),
            }
        )
    return rows


def write_speedups_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Write the ranked rows as CSV (atomically) and return the path.

    Float columns are always written as floats and ``from``/``to`` as text, so
    ``pandas.read_csv`` gives float, bool and string columns. A file whose ``from`` or
    ``to`` values all look like numbers (one batch-size knob only) reads back as numbers
    with a plain ``read_csv``; ``read_speedups_csv`` keeps them as text.
    """
    import pandas as pd

    from trainopt.atomic import write_text_atomic

    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    for name in FLOAT_COLUMNS:
        frame[name] = frame[name].astype("float64")
    frame["rank"] = frame["rank"].astype("int64")
    frame["pairs"] = frame["pairs"].astype("int64")
    frame["kept"] = frame["kept"].astype("bool")
    path = Path(path)
    write_text_atomic(path, frame.to_csv(index=False))
    return path


def read_speedups_csv(path: Path):
    """Read ``speedups.csv`` into a DataFrame with the dtypes it was written with."""
    import pandas as pd

    dtypes = {name: "float64" for name in FLOAT_COLUMNS}
    dtypes.update({"from": str, "to": str, "stage": str, "knob": str, "verdict": str, "reason": str})
    # keep_default_na off for text: a knob value "null" or "None" must stay that text.
    frame = pd.read_csv(path, dtype=dtypes, keep_default_na=False, na_values={n: [""] for n in FLOAT_COLUMNS})
    return frame
