"""The plain records a framework's keyword arguments are made of.

``FrameworkArgs`` is what ``trainopt.settings.frameworks.framework_args`` returns: the
keyword arguments in the order they are written, each with the settings it carries and
the comment beside it, plus the ``Unexpressed`` records of what the framework cannot
express. A value that is an object (Lightning's ``DDPStrategy``, a precision plugin) is a
``Call``: ``build()`` constructs it, and the export writes it as the same constructor call,
so the kwargs a training script gets and the code ``trainopt export`` prints are one data.
Nothing here imports a framework until ``Call.build`` runs.
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass, field
from typing import Any

from trainopt.knobs.catalog import format_value

__all__ = ["Argument", "Call", "FrameworkArgs", "Unexpressed", "build_value", "note"]


@dataclass(frozen=True)
class Call:
    """A constructor call inside a keyword argument's value.

    Attributes:
        module: The module to import the callable from (``lightning.pytorch.strategies``).
        name: The callable's name in that module (``DDPStrategy``).
        args: Positional arguments (plain values or ``Call``).
        kwargs: Keyword arguments as ``(name, value)`` pairs, in the order they are written.
        notes: ``(keyword, comment)`` pairs: the settings a keyword carries, for the export.
    """

    module: str
    name: str
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()
    notes: tuple[tuple[str, str], ...] = ()

    def build(self) -> Any:
        """Import the callable and call it with every argument built."""
        target = getattr(importlib.import_module(self.module), self.name)
        return target(*(build_value(a) for a in self.args), **{k: build_value(v) for k, v in self.kwargs})


def build_value(value: Any) -> Any:
    """A keyword argument's value with every ``Call`` in it constructed."""
    if isinstance(value, Call):
        return value.build()
    if isinstance(value, list):
        return [build_value(v) for v in value]
    return value


@dataclass(frozen=True)
class Argument:
    """One line of a framework's arguments: a keyword and value, or only a comment.

    Attributes:
        keyword: The keyword argument; None when nothing is passed (the framework's
            default stays, and ``note`` says why).
        value: The value (a plain value, a list, or a ``Call``); None without a keyword.
        settings: The best.yaml fields this line carries (knob names, ``device``,
            ``distributed.*``).
        note: The comment beside it: the settings' values and why this is written so.
    """

    keyword: str | None
    value: Any
    settings: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class Unexpressed:
    """A setting the framework's arguments cannot express, why, and what to do instead.

    Attributes:
        setting: The best.yaml field (a knob name, ``device`` or ``code.collate``).
        value: Its value as best.yaml writes it (``true``, ``null``, ``64``, ``bf16``).
        reason: Why the framework's arguments cannot carry it.
        instead: What to do in the training script so it runs as measured.
    """

    setting: str
    value: str
    reason: str
    instead: str

    def as_dict(self) -> dict[str, str]:
        """The record as a plain dict."""
        return asdict(self)


@dataclass(frozen=True)
class FrameworkArgs:
    """A framework's keyword arguments for settings, with their comments and what they leave out.

    Attributes:
        framework: ``lightning`` or ``hf``.
        constructor: What the keyword arguments are for (``lightning.Trainer``,
            ``transformers.TrainingArguments``).
        arguments: Every line in the order it is written; every knob is carried by a
            line or named in ``unexpressed``.
        unexpressed: What the framework cannot express.
    """

    framework: str
    constructor: str
    arguments: tuple[Argument, ...]
    unexpressed: tuple[Unexpressed, ...] = field(default=())

    def kwargs(self) -> dict[str, Any]:
        """The keyword arguments as data (``Call`` values unbuilt)."""
        return {a.keyword: a.value for a in self.arguments if a.keyword is not None}

    def built_kwargs(self) -> dict[str, Any]:
        """The keyword arguments ready for the constructor (every ``Call`` built)."""
        return {k: build_value(v) for k, v in self.kwargs().items()}


def note(settings: Any, *names: str) -> str:
    """``name: value, ...`` for knobs as best.yaml writes them, for comments."""
    return ", ".join(f"{n}: {format_value(settings[n])}" for n in names)
