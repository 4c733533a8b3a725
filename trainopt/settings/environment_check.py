"""Whether settings were measured on this machine and software: the fingerprint comparison and its warning.

A search records the measuring machine's fingerprint in ``provenance.env``; a speedup
measured on another GPU or another torch may not carry over, so ``load_settings`` compares
that fingerprint with this machine's and warns once when they differ.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

from trainopt.settings.record import SettingsError

__all__ = ["TrainSettingsWarning", "environment_differences", "warn_if_measured_elsewhere"]


class TrainSettingsWarning(UserWarning):
    """The settings were measured on another machine or software; the speedup may not carry over."""


def environment_differences(provenance: Mapping[str, Any], device_of: Callable[[], Any]) -> list[str]:
    """Lines for each fingerprint key that differs between the measurement and here.

    Only keys the provenance records are compared, so a hand-written file without a
    fingerprint never differs. Imports torch.

    Args:
        provenance: The settings' provenance; its ``env`` is the measuring machine's fingerprint.
        device_of: Returns the torch.device the settings train on here. It is called only
            when there is a fingerprint to compare, so a file without one needs no device.
    """
    from trainopt.contract.fingerprint import COMPARED_KEYS, differences
    from trainopt.trial.environment import environment

    measured = provenance.get("env") or {}
    if not measured:
        return []
    try:
        device = device_of()
    except SettingsError:
        # The device is unavailable here; a CPU fingerprint shows that as a difference.
        device = None
    here = environment(device)
    keys = [k for k in COMPARED_KEYS if k in measured]
    return differences({k: measured[k] for k in keys}, {k: here.get(k) for k in keys})


def warn_if_measured_elsewhere(path: Path, provenance: Mapping[str, Any], device_of: Callable[[], Any]) -> None:
    """Emit one ``TrainSettingsWarning`` when the settings file's fingerprint differs from here.

    Meant to be called by ``load_settings``: the warning points at the line that called it.

    Args:
        path: The settings file, named in the message.
        provenance: The settings' provenance.
        device_of: Returns the torch.device the settings train on here (see ``environment_differences``).
    """
    diffs = environment_differences(provenance, device_of)
    if diffs:
        warnings.warn(
            f"{path}: these settings were measured on a different machine or software, so the "
            f"speedup may not carry over; re-run `trainopt search` here to be sure:\n"
            + "\n".join(f"  - {d}" for d in diffs),
            TrainSettingsWarning,
            # Past this function and load_settings, to the user's own call.
            stacklevel=3,
        )
