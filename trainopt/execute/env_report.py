"""The orchestrator's side of ``trainopt env``: the environment fingerprint, read in a child process.

The CLI never imports torch, so the fingerprint comes from the module that
``boundary.ENV_REPORT_MODULE`` names, started as a trial is and answering in a JSON file.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from trainopt.atomic import write_json_atomic
from trainopt.contract.boundary import ENV_REPORT_MODULE
from trainopt.errors import UserError
from trainopt.execute.runner import classify_exit, run_child

__all__ = ["ENV_TIMEOUT_S", "environment_fingerprint"]

# How long reading the fingerprint may take: importing torch on a cold disk can take a while.
ENV_TIMEOUT_S = 180.0


def environment_fingerprint(device: str = "auto", timeout_s: float = ENV_TIMEOUT_S) -> dict[str, Any]:
    """This machine's environment fingerprint, read in a child process as a trial reads it.

    This process never imports torch, so the fingerprint comes from ``python -m`` of the
    module ``boundary.ENV_REPORT_MODULE`` names, answering in a JSON file.

    Args:
        device: The spec's device field (``auto``, ``cpu``, ``cuda``, ``cuda:N``).
        timeout_s: Limit for the child.

    Raises:
        UserError: The device is not available here.
        RuntimeError: The child failed or did not answer in time (the message names its log).
    """
    with tempfile.TemporaryDirectory(prefix="trainopt-env-") as tmp:
        folder = Path(tmp)
        request, answer_path, log = folder / "request.json", folder / "answer.json", folder / "env.log"
        write_json_atomic(request, {"device": device, "answer_path": str(answer_path)})
        end = run_child(ENV_REPORT_MODULE, request, log, timeout_s)
        try:
            answer = json.loads(answer_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            what = f"did not finish within {timeout_s:g} s" if end.timed_out else classify_exit(end.returncode, "the child")
            raise RuntimeError(f"reading the environment fingerprint failed: {what}\n{tail}") from None
    if answer.get("device_unavailable"):
        raise UserError(f"--device {device}: {answer['error']}")
    if "env" not in answer:
        raise RuntimeError(f"reading the environment fingerprint failed: {answer.get('error')}")
    return answer["env"]
