"""The child side of the factory check: ``python -m trainopt.trial.refcheck REQUEST.json``.

Resolves every ``module:callable`` reference of the request in this process (running the
user's import-time code here, not in the orchestrator), binds every factory's arguments to
its signature as the trial will (``reference.check_kwargs``, built-in factories included),
and writes one versioned answer with one problem per bad factory. The orchestrator's side is
``trainopt.execute.refcheck``.
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
from trainopt.contract.reference import WorkloadError, check_kwargs, resolve_reference

__all__ = ["answer", "main"]


def _builtin(kind: str, name: str) -> Any:
    """The built-in factory the trial calls for ``name``: a model, a data set class or an optimizer class."""
    if kind == "model":
        from trainopt.trial.workloads.models import BUILTIN_MODELS

        return BUILTIN_MODELS[name]
    if kind == "data":
        from trainopt.trial.workloads.data import BUILTIN_DATA

        return BUILTIN_DATA[name]
    from trainopt.trial.workloads import BUILTIN_OPTIMIZERS

    return BUILTIN_OPTIMIZERS[name]


def _check(item: dict[str, Any], source_dir: Path) -> None:
    if item.get("builtin"):
        factory, label = _builtin(item["builtin"], item["ref"]), item["ref"]
    else:
        factory, label = resolve_reference(item["ref"], source_dir, field=item["field"]), repr(item["ref"])
    if item.get("args_field"):
        check_kwargs(factory, item.get("args") or {}, item["args_field"], label, leading=int(item.get("leading", 0)))


def answer(request: dict[str, Any]) -> dict[str, Any]:
    """Resolve every reference and bind every factory's arguments in this process: the child's side."""
    problems = []
    tracebacks = False
    for item in request["references"]:
        try:
            _check(item, Path(request["source_dir"]))
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
