"""Turn a ``module:callable`` or ``path/file.py:callable`` string into the callable.

Every failure that is the spec's fault (a module that is not there, a misspelled
attribute, arguments the factory does not take) becomes a ``WorkloadError`` whose one
line names the spec field, the string given and what to change. Failures inside the
user's own code are left alone by the callers, so their tracebacks reach the trial log.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Mapping

from trainopt.errors import UserError

__all__ = ["REFERENCE_PATTERN", "WorkloadError", "resolve_reference", "check_kwargs", "is_reference"]

# What a reference looks like as written in a spec or a best.yaml: ``target:attribute``,
# the attribute a (dotted) identifier; resolving it is what proves it names something.
REFERENCE_PATTERN = re.compile(r"^[^\s:]+:[A-Za-z_][A-Za-z0-9_.]*$")


class WorkloadError(UserError):
    """A workload that cannot be built as the spec describes it; the message says why."""


def is_reference(name: str) -> bool:
    """True when ``name`` has the ``target:attribute`` form of a reference."""
    return ":" in name


def _split(ref: str, field: str) -> tuple[str, str]:
    # rpartition, so that a Windows drive letter ("C:/x.py:make") stays in the path.
    target, sep, attr = ref.rpartition(":")
    if not sep or not target or not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise WorkloadError(
            f"{field} {ref!r}: expected 'package.module:callable' or 'path/to/file.py:callable'"
        )
    return target, attr


def _put_first_on_path(directory: Path) -> None:
    # First, so that a module next to the spec wins over an installed one of the same name.
    # It stays on the path: factories may import more of their own modules when called.
    entry = str(directory)
    if entry in sys.path:
        sys.path.remove(entry)
    sys.path.insert(0, entry)


def _import_error(field: str, ref: str, what: str, exc: BaseException, hint: str) -> WorkloadError:
    detail = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return WorkloadError(f"{field} {ref!r}: {what} could not be imported ({detail}); {hint}")


def _import_module(name: str, ref: str, source_dir: Path, field: str, base: str = "the spec's folder") -> ModuleType:
    _put_first_on_path(source_dir)
    # A module written after this process looked at its folder would otherwise be missed.
    importlib.invalidate_caches()
    try:
        return importlib.import_module(name)
    except (Exception, SystemExit) as exc:
        missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
        if missing and (name == missing or name.startswith(missing + ".")):
            hint = f"check the module name; it is looked up from {source_dir} ({base}) and sys.path"
        else:
            hint = "fix the error in that module (its traceback is in the trial log)"
        raise _import_error(field, ref, f"module {name!r}", exc, hint) from exc


def _module_name_for(path: Path) -> str:
    # Unique per file, so two files named alike never share a module; stable, so the
    # model and the data set taken from one file share one module and its state.
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    return f"trainopt_user_{stem}_{digest}"


def _load_file(target: str, ref: str, source_dir: Path, field: str, base: str = "the spec's folder") -> ModuleType:
    path = Path(target).expanduser()
    if not path.is_absolute():
        path = source_dir / path
    path = path.resolve()
    if not path.is_file():
        raise WorkloadError(
            f"{field} {ref!r}: file {str(path)!r} does not exist; "
            f"relative paths start at {source_dir} ({base})"
        )
    name = _module_name_for(path)
    if name in sys.modules:
        return sys.modules[name]
    # The file may import its neighbours and modules next to the spec, as a script would.
    _put_first_on_path(source_dir)
    _put_first_on_path(path.parent)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise WorkloadError(f"{field} {ref!r}: {str(path)!r} cannot be loaded as a Python module; use a .py file")
    module = importlib.util.module_from_spec(spec)
    # Registered before running, as a normal import does, so dataclasses and pickling
    # of the file's own classes can find the module.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        del sys.modules[name]
        raise _import_error(
            field, ref, f"file {str(path)!r}", exc, "fix the error in that file (its traceback is in the trial log)"
        ) from exc
    return module


def _public_callables(module: Any, limit: int = 8) -> str:
    names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n, None))]
    if not names:
        return "it defines no public callables"
    shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
    return f"it defines: {shown}"


def resolve_reference(
    ref: str, source_dir: Path, field: str = "model.name", base: str = "the spec's folder"
) -> Callable[..., Any]:
    """Import the callable that a spec reference names.

    Args:
        ref: ``"pkg.module:callable"`` or ``"path/to/file.py:callable"``; the part after
            the colon may be dotted (``"mod:Class.factory"``).
        source_dir: The spec's folder. It goes first on ``sys.path`` and relative file
            paths start there, so code kept next to the spec is found.
        field: The spec field the reference came from, used in error messages.
        base: What ``source_dir`` is, as messages name it.

    Returns:
        The callable.

    Raises:
        WorkloadError: The module or file cannot be imported, the attribute is missing,
            or it is not callable.
    """
    source_dir = Path(source_dir).resolve()
    target, attr = _split(ref, field)
    if target.endswith(".py") or "/" in target or "\\" in target:
        module = _load_file(target, ref, source_dir, field, base)
        where = f"file {target!r}"
    else:
        module = _import_module(target, ref, source_dir, field, base)
        where = f"module {target!r}"
    obj: Any = module
    walked: list[str] = []
    for part in attr.split("."):
        if not hasattr(obj, part):
            owner = where if not walked else repr(".".join(walked))
            listing = f"; {_public_callables(obj)}" if not walked else ""
            raise WorkloadError(f"{field} {ref!r}: {owner} has no attribute {part!r}{listing}")
        obj = getattr(obj, part)
        walked.append(part)
    if not callable(obj):
        raise WorkloadError(
            f"{field} {ref!r}: {attr!r} is a {type(obj).__name__}, not a callable; "
            f"name a function or class that builds the object"
        )
    return obj


def _hint(unknown: list[str], keywords: list[str]) -> str:
    """A near miss (``did you mean 'n_layer'?``), or how to pass arguments to a model built from a config object."""
    close = {k: difflib.get_close_matches(k, keywords, n=1, cutoff=0.75) for k in unknown}
    near = [f"{k!r} -> {m[0]!r}" for k, m in close.items() if m]
    if near:
        return f" (did you mean {', '.join(near)}?)"
    if any("config" in k.lower() for k in keywords):
        return (" (it takes a config object: name a factory that builds the config from these arguments "
                "and returns the model, as docs/your-code.md shows)")
    return ""


def check_kwargs(
    factory: Callable[..., Any], args: Mapping[str, Any], field: str, label: str, leading: int = 0
) -> None:
    """Check that ``factory(*leading_args, **args)`` would bind, before calling it.

    A mismatch is the spec's fault, so it is reported against the spec field rather than
    as a TypeError from somewhere inside the call.

    Args:
        factory: The callable about to be called.
        args: The keyword arguments from the spec.
        field: The spec field that holds ``args`` (e.g. ``"model.args"``).
        label: How to name the factory in the message (built-in name or reference).
        leading: How many positional arguments the caller passes first.

    Raises:
        WorkloadError: An argument is unknown, or a required one is missing.
    """
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # some C-implemented callables have no signature; let the call decide
    params = list(sig.parameters.values())
    allowed_any = any(p.kind is p.VAR_KEYWORD for p in params)
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_var_positional = any(p.kind is p.VAR_POSITIONAL for p in params)
    if leading > len(positional) and not has_var_positional:
        raise WorkloadError(
            f"{field}: {label} must take {leading} positional argument(s) first; its signature is {sig}"
        )
    taken_by_position = {p.name for p in positional[:leading]}
    keywords = [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in taken_by_position
    ]
    if not allowed_any:
        unknown = [k for k in args if k not in keywords]
        if unknown:
            allowed = ", ".join(keywords) if keywords else "none"
            names = ", ".join(repr(k) for k in unknown)
            raise WorkloadError(f"{field}: unknown key(s) {names} for {label}; allowed: {allowed}{_hint(unknown, keywords)}")
    missing = [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is p.empty
        and p.name not in taken_by_position
        and p.name not in args
    ]
    if missing:
        names = ", ".join(repr(k) for k in missing)
        raise WorkloadError(f"{field}: {label} needs {names}; add them to {field}")
