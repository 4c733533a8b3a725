"""Check a spec's ``module:callable`` references in a short child process, never in the CLI's.

Importing a user's module runs its import-time code and usually pulls in torch; the
orchestrator (CLI, search, results, report) must do neither. So ``trainopt validate``,
``measure`` and ``search`` ask a child, ``python -m trainopt.trial.refcheck REQUEST.json``, to
resolve every reference; it writes one versioned JSON answer with one problem per bad
reference, in the same words as ``reference.resolve_reference``. The child is started
through ``runner.run_child``, the same launcher as trials (own session, time limit, log).

Request: ``{kind: "trainopt-refcheck-request", schema_version, source_dir, answer_path,
references: [{field, ref}]}``. Answer: ``{kind: "trainopt-refcheck", schema_version,
problems: [message, ...], tracebacks: bool}``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trainopt.atomic import write_json_atomic
from trainopt.contract.boundary import REFCHECK_MODULE
from trainopt.contract.protocol import (
    REFCHECK_ANSWER_KIND,
    REFCHECK_REQUEST_KIND,
    REFCHECK_SCHEMA_VERSION,
)
from trainopt.contract.reference import WorkloadError, is_reference

__all__ = ["spec_references", "check_references"]


def spec_references(spec: Any) -> list[tuple[str, str]]:
    """The ``(field, reference)`` pairs of a spec that name user code."""
    fields = (
        ("model.name", spec.model.name),
        ("data.name", spec.data.name),
        ("data.collate", spec.data.collate),
        ("loss", spec.loss),
        ("step", spec.step),
        ("optimizer.name", spec.optimizer.name),
    )
    return [(field, ref) for field, ref in fields if ref is not None and is_reference(ref)]


def check_references(spec: Any, timeout_s: float | None = None) -> None:
    """Resolve the spec's references in a child process; raise on the first bad answer.

    Nothing is started when the spec names no user code.

    Args:
        spec: The validated spec.
        timeout_s: Limit for the child (default: the spec's ``measure.trial_timeout_s``).

    Raises:
        WorkloadError: A reference cannot be resolved (the message says which field and
            why, one line per bad reference), or the check itself could not finish.
    """
    from trainopt.execute.runner import classify_exit, run_child

    refs = spec_references(spec)
    if not refs:
        return
    timeout_s = timeout_s if timeout_s is not None else spec.measure.trial_timeout_s
    folder = Path(tempfile.mkdtemp(prefix="trainopt-refcheck-"))
    keep = True
    try:
        request_path, answer_path, log_path = folder / "request.json", folder / "answer.json", folder / "refcheck.log"
        write_json_atomic(
            request_path,
            {
                "kind": REFCHECK_REQUEST_KIND,
                "schema_version": REFCHECK_SCHEMA_VERSION,
                "source_dir": str(spec.source_dir()),
                "answer_path": str(answer_path),
                "references": [{"field": f, "ref": r} for f, r in refs],
            },
        )
        end = run_child(REFCHECK_MODULE, request_path, log_path, timeout_s)
        if end.timed_out:
            raise WorkloadError(
                f"importing the spec's references did not finish within {timeout_s:g} s "
                f"({', '.join(f'{f} {r!r}' for f, r in refs)}); check their import-time code (log: {log_path})"
            )
        try:
            data = json.loads(answer_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise WorkloadError(
                f"the spec's references could not be checked: {classify_exit(end.returncode, 'the reference check')} "
                f"while importing {', '.join(f'{f} {r!r}' for f, r in refs)} (log: {log_path})"
            ) from None
        if data.get("kind") != REFCHECK_ANSWER_KIND or data.get("schema_version") != REFCHECK_SCHEMA_VERSION:
            raise WorkloadError(f"unreadable reference-check answer {answer_path}: {str(data)[:200]}")
        problems = data.get("problems") or []
        if problems:
            lines = list(problems)
            if data.get("tracebacks"):
                lines.append(f"tracebacks: {log_path}")
            raise WorkloadError("\n  ".join(lines))
        keep = False
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
