"""Check a spec's factories in a short child process, never in the CLI's: references and arguments.

Importing a user's module runs its import-time code and usually pulls in torch; the
orchestrator (CLI, search, results, report) must do neither. So ``trainopt validate``,
``measure`` and ``search`` ask a child, ``python -m trainopt.trial.refcheck REQUEST.json``, to
resolve every reference and to bind every factory's ``args`` to its signature (the user's
classes, functions and classmethods, and the built-in models, data sets and optimizers
alike), as the trial will; it writes one versioned JSON answer with one problem per bad
factory, in the same words as ``reference.resolve_reference`` and ``reference.check_kwargs``.
The child is started through ``runner.run_child``, the same launcher as trials (own session,
time limit, log).

Request: ``{kind: "trainopt-refcheck-request", schema_version, source_dir, answer_path,
references: [{field, ref, builtin, args_field, args, leading}]}`` (``builtin``: ``model``,
``data`` or ``optimizer`` for a built-in name, else None; ``args_field``: the spec field of
``args``, None when the factory takes none from the spec; ``leading``: how many positional
arguments the trial passes first). Answer: ``{kind: "trainopt-refcheck", schema_version,
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

__all__ = ["spec_factories", "spec_references", "check_references"]


def spec_references(spec: Any) -> list[tuple[str, str]]:
    """The ``(field, reference)`` pairs of a spec that name user code."""
    return [(item["field"], item["ref"]) for item in spec_factories(spec) if item["builtin"] is None]


def _item(field: str, ref: str, builtin: str | None, args_field: str | None, args: Any, leading: int) -> dict[str, Any]:
    return {"field": field, "ref": ref, "builtin": builtin, "args_field": args_field,
            "args": dict(args or {}), "leading": leading}


def spec_factories(spec: Any) -> list[dict[str, Any]]:
    """Every factory the trial will call with the spec's arguments, as the child checks them.

    A user reference is always listed (it must resolve); a built-in name only when the spec
    gives it arguments, since without any there is nothing to bind. ``leading`` is how many
    positional arguments the trial passes before the keywords: the parameters to an
    optimizer, the items to a collate function, the model and batch to a step.
    """
    from trainopt.contract.spec import BUILTIN_DATA, BUILTIN_MODELS, BUILTIN_OPTIMIZERS

    items = []
    parts = (
        ("model.name", spec.model.name, "model", BUILTIN_MODELS, "model.args", spec.model.args, 0),
        ("data.name", spec.data.name, "data", BUILTIN_DATA, "data.args", spec.data.args, 0),
        ("data.datamodule", spec.data.datamodule, None, (), "data.args", spec.data.args, 0),
        ("data.collate", spec.data.collate, None, (), "data.collate", {}, 1),
        ("loss", spec.loss, None, (), None, {}, 0),
        ("step", spec.step, None, (), "step", {}, 2),
        ("optimizer.name", spec.optimizer.name, "optimizer", BUILTIN_OPTIMIZERS, "optimizer.args", spec.optimizer.args, 1),
    )
    for field, name, kind, builtins, args_field, args, leading in parts:
        if name is None:
            continue
        if is_reference(name):
            items.append(_item(field, name, None, args_field, args, leading))
        elif name in builtins and args:
            items.append(_item(field, name, kind, args_field, args, leading))
    return items


def check_references(spec: Any, timeout_s: float | None = None) -> None:
    """Resolve the spec's references and bind its factories' arguments in a child process.

    Nothing is started when the spec names no user code and gives no built-in arguments.

    Args:
        spec: The validated spec.
        timeout_s: Limit for the child (default: the spec's ``measure.trial_timeout_s``).

    Raises:
        WorkloadError: A reference cannot be resolved or a factory does not take its
            arguments (the message says which field and why, and for an argument the ones
            accepted; one line per bad factory), or the check itself could not finish.
    """
    from trainopt.execute.runner import classify_exit, run_child

    items = spec_factories(spec)
    if not items:
        return
    # Messages name the user's references: their import-time code is what can hang or fail.
    refs = [(i["field"], i["ref"]) for i in items if i["builtin"] is None] or [(i["field"], i["ref"]) for i in items]
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
                "references": items,
            },
        )
        end = run_child(REFCHECK_MODULE, request_path, log_path, timeout_s)
        if end.timed_out:
            raise WorkloadError(
                f"importing the spec's factories did not finish within {timeout_s:g} s "
                f"({', '.join(f'{f} {r!r}' for f, r in refs)}); check their import-time code (log: {log_path})"
            )
        try:
            data = json.loads(answer_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise WorkloadError(
                f"the spec's factories could not be checked: {classify_exit(end.returncode, 'the reference check')} "
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
