"""The report's second batch pass: why it ran, its probes and what it kept, as display-ready data."""

from __future__ import annotations

from typing import Any

from trainopt.outputs.report.formats import fmt_bytes, fmt_percent
from trainopt.outputs.report.rows import format_value

__all__ = ["second_pass_context"]


def second_pass_context(info: dict[str, Any]) -> dict[str, Any] | None:
    """The batch section's second pass (``batch_size.second_pass`` of the results), or None when none ran."""
    second = info.get("second_pass") if isinstance(info, dict) else None
    if not isinstance(second, dict):
        return None
    freed = second.get("freed_by") or {}
    ratio = freed.get("ratio")
    peaks = ""
    if isinstance(ratio, (int, float)):
        peaks = (f"; its peak memory against its incumbent's: {fmt_bytes(freed.get('after_peak_memory_bytes'))} "
                 f"against {fmt_bytes(freed.get('before_peak_memory_bytes'))} ({fmt_percent(ratio)})")
    return {
        "why": (f"batch size {freed.get('edge')} ran out of memory in the first pass and fits after "
                f"{freed.get('knob')} {format_value(freed.get('from'))} → {format_value(freed.get('to'))}{peaks}"),
        "start": second.get("start"),
        "max_fitting": second.get("max_fitting"),
        "safe_max": second.get("safe_max"),
        "adopted": second.get("adopted"),
        "probes": [{"size": p.get("size"), "fits": bool(p.get("fits")), "status": p.get("status") or "",
                    "memory": fmt_bytes(p.get("peak_memory_bytes"))} for p in second.get("probes") or []],
    }
