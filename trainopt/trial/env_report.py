"""This machine's environment fingerprint, read in a child process: ``python -m trainopt.trial.env_report REQUEST.json``.

The request names the device and where the answer goes; the answer is the fingerprint
every trial result records (``trainopt.trial.environment``, with the CPUs this process may
run on), read here because it needs torch and the ``trainopt`` process never imports it.
``trainopt env`` starts this module and prints its answer.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any

from trainopt.atomic import write_json_atomic
from trainopt.knobs.kwargs import DeviceUnavailableError

__all__ = ["fingerprint", "main"]


def fingerprint(device_name: str = "auto") -> dict[str, Any]:
    """The environment fingerprint of this process on ``device_name``, as a trial records it.

    Raises:
        DeviceUnavailableError: CUDA was asked for but is not available.
    """
    import torch

    from trainopt.trial.applier import resolve_device
    from trainopt.trial.environment import environment

    device = resolve_device(device_name)
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise DeviceUnavailableError(f"device: {device_name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    env = environment(device)
    env["cpu_set"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return env


def main(argv: list[str] | None = None) -> int:
    """Read the request, write ``{"env": ...}`` or ``{"error": ...}`` to its ``answer_path``.

    A device that is not there is the user's to fix (``device_unavailable``); any other
    failure is answered with its type and message, and its traceback goes to the log.
    """
    argv = sys.argv[1:] if argv is None else argv
    request = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        answer: dict[str, Any] = {"env": fingerprint(request.get("device") or "auto")}
    except DeviceUnavailableError as exc:
        answer = {"error": str(exc), "device_unavailable": True}
    except Exception as exc:  # noqa: BLE001 - the answer says what failed; the log keeps the traceback
        traceback.print_exc()
        answer = {"error": f"{type(exc).__name__}: {exc}"}
    write_json_atomic(request["answer_path"], answer)
    return 0 if "env" in answer else 1


if __name__ == "__main__":
    sys.exit(main())
