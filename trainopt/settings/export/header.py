"""The comment header every export starts with: where the settings were measured and how much faster they were."""

from __future__ import annotations

import re
from typing import Any

from trainopt.contract import distributed as dist_mod
from trainopt.settings.production import TrainSettings

__all__ = ["header"]


def _one_line(value: Any) -> str:
    # Header text comes from the file; a newline in it must not end the comment and
    # turn the rest into code in the pasted snippet.
    return re.sub(r"\s+", " ", str(value)).strip()


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def header(s: TrainSettings, source: str) -> list[str]:
    """The header's comment lines.

    Args:
        s: The settings.
        source: Named as where the settings came from.
    """
    p = s.provenance
    env = p.get("env") if isinstance(p.get("env"), dict) else {}
    lines = [f"# trainopt settings from {_one_line(source)}"]
    if not p:
        lines.append("# measured on: unknown (the file has no provenance section)")
    else:
        where = str(env.get("device_name") or "unknown device")
        if env.get("device_type"):
            where += f" ({env['device_type']})"
        if env.get("torch"):
            where += f", torch {env['torch']}"
        lines.append(f"# measured on: {_one_line(where)}")
        if p.get("search") or p.get("measured_at"):
            lines.append(f"# search: {_one_line(p.get('search') or '?')}, finished {_one_line(p.get('measured_at') or '?')}")
        speedup = _number(p.get("speedup"))
        if speedup is not None:
            text = f"# speedup: {speedup:.2f}x over the baseline"
            ci = p.get("speedup_ci")
            if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_number(c) is not None for c in ci):
                text += f" (interval {float(ci[0]):.2f}x to {float(ci[1]):.2f}x)"
            if p.get("verdict"):
                text += f", verdict: {_one_line(p['verdict'])}"
            lines.append(text)
        if p.get("complete") is False:
            lines.append("# note: the search did not finish; these are the best settings confirmed so far")
    if s.lr_scale_hint:
        lines.append(f"# learning rate: {_one_line(s.lr_scale_hint)}")
    lines.append(f"# device: {s.device}")
    if s.distributed:
        n = s.distributed["nproc_per_node"]
        lines.append(
            f"# data parallel: {n} processes on one node, batch_size per process "
            f"(effective batch {dist_mod.effective_batch(s.settings, n)} = batch_size x grad_accum x {n})"
        )
        lines.append(f"# launch: {s.launch_command()}")
    return lines
