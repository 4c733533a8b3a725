"""The environment fingerprint: what machine and software a figure was measured on.

A speedup found on one machine may not hold on another, so every result and every
``best.yaml`` carries this fingerprint, and the settings API warns when it differs.
The parts read without torch live here; ``trainopt.trial.environment`` adds torch's and the device's.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["cpu_info", "parse_cpuinfo", "differences", "COMPARED_KEYS"]

# Flags that change which kernels are fast: bf16/amx decide whether bf16 autocast pays off on CPU.
_INTERESTING_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_bf16", "amx_tile", "amx_int8", "fma")

# Keys whose difference means a measured verdict may not carry over.
COMPARED_KEYS = ("device_name", "device_type", "torch", "cpu_model", "cuda")


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The CPU model name and the speed-relevant flags from /proc/cpuinfo text."""
    model, flags = None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return {"cpu_model": model or platform.processor() or platform.machine(), "cpu_flags": sorted(f for f in _INTERESTING_FLAGS if f in flags)}


def cpu_info() -> dict[str, Any]:
    """CPU model and flags of this machine (empty flags where /proc/cpuinfo is absent)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    info = parse_cpuinfo(text)
    info["cpu_count"] = os.cpu_count()
    try:
        info["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        info["cpu_affinity"] = info["cpu_count"]
    return info


def differences(
    measured: Mapping[str, Any],
    here: Mapping[str, Any],
    keys: Sequence[str] = COMPARED_KEYS,
    line: str = "{key}: measured on {a!r}, running on {b!r}",
) -> list[str]:
    """Human lines for each compared key that differs between two fingerprints.

    Args:
        measured: The fingerprint a figure was measured on.
        here: The fingerprint to compare it with.
        keys: The keys compared, in the order the lines name them.
        line: Each line's format, given ``key`` and the two values ``a`` and ``b``.
    """
    out = []
    for key in keys:
        a, b = measured.get(key), here.get(key)
        if a != b:
            out.append(line.format(key=key, a=a, b=b))
    return out
