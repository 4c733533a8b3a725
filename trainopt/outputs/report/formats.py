"""How the report writes numbers: rates, speedups, intervals, shares, bytes and durations.

Numbers are formatted here, in Python, so the page, its table's sort keys and the tests agree;
a missing or non-finite value reads as a dash.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["number", "fmt_rate", "fmt_speedup", "fmt_interval", "fmt_percent", "fmt_bytes", "fmt_duration", "fmt_steps", "sort_value", "sentence"]


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def sentence(text: Any) -> str:
    """``text`` as a sentence: its first letter a capital, nothing else changed (empty stays empty)."""
    text = str(text or "").strip()
    return text[:1].upper() + text[1:]


def fmt_rate(value: Any, unit: bool = True) -> str:
    """Throughput with thousands separators: ``12,956 samples/s``; ``—`` when unknown."""
    v = number(value)
    if v is None:
        return "—"
    text = f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.3g}"
    return f"{text} samples/s" if unit else text


def fmt_speedup(value: Any) -> str:
    """A speedup factor: ``1.234×``."""
    v = number(value)
    return "—" if v is None else f"{v:.3f}×"


def fmt_interval(ci: Any) -> str:
    """A speedup interval: ``[1.112×, 3.116×]``; empty when there is none."""
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(number(c) is not None for c in ci):
        return f"[{fmt_speedup(ci[0])}, {fmt_speedup(ci[1])}]"
    return ""


def fmt_percent(value: Any) -> str:
    """A fraction as a percentage: ``43%`` (one decimal below 10%)."""
    v = number(value)
    if v is None:
        return "—"
    return f"{v * 100:.1f}%" if abs(v) < 0.1 else f"{v * 100:.0f}%"


def fmt_bytes(value: Any) -> str:
    """Bytes as MiB or GiB: ``366.3 MiB``, ``12.40 GiB``."""
    v = number(value)
    if v is None:
        return "—"
    if abs(v) >= 1024**3:
        return f"{v / 1024**3:,.2f} GiB"
    return f"{v / 1024**2:,.1f} MiB"


def fmt_duration(value: Any) -> str:
    """Seconds as ``12.3 s``, ``2 m 10 s`` or ``1 h 05 m``."""
    v = number(value)
    if v is None:
        return "—"
    if v < 60:
        return f"{v:.1f} s"
    if v < 3600:
        m, s = divmod(int(round(v)), 60)
        return f"{m} m {s:02d} s"
    h, rest = divmod(int(round(v)), 3600)
    return f"{h} h {rest // 60:02d} m"


def fmt_steps(value: Any) -> str:
    v = number(value)
    return "never" if v is None else f"{v:,.0f} steps"


def sort_value(value: Any) -> str:
    # The sorting script reads data-sort; an empty value sorts last whichever the direction.
    v = number(value)
    return "" if v is None else repr(v)
