"""Writing a ``trainopt.settings.frameworks.FrameworkArgs`` as code: the arguments, their imports, the unexpressed.

The Lightning and Hugging Face exports print exactly the keyword arguments that
``TrainSettings.trainer_kwargs`` builds: each ``Argument`` becomes ``keyword=value,  # note``
(or a comment where the framework's default stays), a ``Call`` becomes the same constructor
call, and each ``Unexpressed`` record a comment saying what to do instead.
"""

from __future__ import annotations

from typing import Any

from trainopt.settings.frameworks import Call, FrameworkArgs

__all__ = ["argument_lines", "call_imports", "expression", "unexpressed_lines"]


def expression(value: Any) -> str:
    """A keyword argument's value as a Python expression (a ``Call`` as its constructor call)."""
    if isinstance(value, Call):
        parts = [expression(a) for a in value.args] + [f"{k}={expression(v)}" for k, v in value.kwargs]
        return f"{value.name}({', '.join(parts)})"
    if isinstance(value, list):
        return "[" + ", ".join(expression(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


def _calls(value: Any) -> list[Call]:
    if isinstance(value, Call):
        found = [value]
        for v in (*value.args, *(v for _, v in value.kwargs)):
            found += _calls(v)
        return found
    if isinstance(value, list):
        return [c for v in value for c in _calls(v)]
    return []


def call_imports(fa: FrameworkArgs) -> list[str]:
    """``from module import Name`` for every constructor the arguments call, in order, once each."""
    lines: list[str] = []
    for value in fa.kwargs().values():
        for call in _calls(value):
            line = f"from {call.module} import {call.name}"
            if line not in lines:
                lines.append(line)
    return lines


def argument_lines(fa: FrameworkArgs, indent: str) -> list[str]:
    """Every argument line, with its comment; a ``Call`` with notes is written one keyword per line."""
    lines = []
    for arg in fa.arguments:
        if arg.keyword is None:
            lines.append(f"{indent}# {arg.note}")
            continue
        value = arg.value
        if isinstance(value, Call) and value.notes:
            notes = dict(value.notes)
            lines.append(f"{indent}{arg.keyword}={value.name}(  # {arg.note}")
            lines += [f"{indent}    {expression(a)}," for a in value.args]
            for k, v in value.kwargs:
                comment = f"  # {notes[k]}" if k in notes else ""
                lines.append(f"{indent}    {k}={expression(v)},{comment}")
            lines.append(f"{indent}),")
        else:
            lines.append(f"{indent}{arg.keyword}={expression(value)},  # {arg.note}")
    return lines


def unexpressed_lines(fa: FrameworkArgs, what: str) -> list[str]:
    """The unexpressed records as comments: ``setting: value -> reason; instead: ...``."""
    if not fa.unexpressed:
        return [f"# Everything these settings set is in the {what} arguments above."]
    lines = [f"# Not expressible as {what} arguments (s.unexpressed({fa.framework!r}) lists them):"]
    for u in fa.unexpressed:
        lines.append(f"# {u.setting}: {u.value} -> {u.reason}")
        lines.append(f"#   instead: {u.instead}")
    return lines
