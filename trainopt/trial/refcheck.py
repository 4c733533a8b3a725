"""The child side of the reference check: ``python -m trainopt.trial.refcheck REQUEST.json``.

Resolves every ``module:callable`` reference of the request in this process (running the
user's import-time code here, not in the orchestrator) and writes one versioned answer with
one problem per bad reference. The orchestrator's side is ``trainopt.execute.refcheck``.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any

from trainopt.atomic import write_json_atomic
from trainopt.contract.protocol import (
    REFCHECK_ANSWER_KIND,
    REFCHECK_REQUEST_KIND,
    REFCHECK_SCHEMA_VERSION,
)
from trainopt.contract.reference import WorkloadError, resolve_reference

__all__ = ["answer", "main"]


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Resolve every reference of a request in this process: the child's side."""
    problems = []
    tracebacks = False
    for item in request["references"]:
        try:
            resolve_reference(item["ref"], Path(request["source_dir"]), field=item["field"])
        except WorkloadError as exc:
            problems.append(str(exc))
            if exc.__cause__ is not None:
                # The user's own error inside their module: its traceback goes to the log.
                traceback.print_exception(exc.__cause__, file=sys.stderr)
                tracebacks = True
    return {"kind": REFCHECK_ANSWER_KIND, "schema_version": REFCHECK_SCHEMA_VERSION, "problems": problems, "tracebacks": tracebacks}


def main(argv: list[str] | None = None) -> int:
    """``python -m trainopt.trial.refcheck REQUEST.json``: write the answer file; exit 0 when written."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m trainopt.trial.refcheck REQUEST.json", file=sys.stderr)
        return 2
    request = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    if request.get("kind") != REFCHECK_REQUEST_KIND or request.get("schema_version") != REFCHECK_SCHEMA_VERSION:
        print(f"not a version-{REFCHECK_SCHEMA_VERSION} reference-check request: {args[0]}", file=sys.stderr)
        return 2
    write_json_atomic(Path(request["answer_path"]), answer(request))
    return 0


if __name__ == "__main__":
    sys.exit(main())
