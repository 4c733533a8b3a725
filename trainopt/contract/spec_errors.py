"""How a spec's problems are told: ``SpecError`` with one line per bad field, and pydantic's errors in those words."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trainopt.errors import UserError

__all__ = ["SpecError"]


class SpecError(UserError):
    """A spec that cannot be used; ``problems`` lists one line per bad field."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + ("; ".join(problems) if len(problems) <= 1 else f"{len(problems)} problems"))

    def render(self) -> str:
        """The message shown to the user: one line per problem."""
        where = f"invalid spec {self.source}" if self.source else "invalid spec"
        if len(self.problems) == 1:
            return f"{where}: {self.problems[0]}"
        return f"{where}:\n" + "\n".join(f"  - {p}" for p in self.problems)


def _fmt_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _pydantic_problems(err: ValidationError, prefix: str = "") -> list[str]:
    problems = []
    for e in err.errors(include_url=False):
        path = ".".join(str(p) for p in e["loc"]) or "(top level)"
        path = f"{prefix}{path}" if prefix else path
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if e["type"] == "extra_forbidden":
            problems.append(f"{path}: unknown key; remove it or check its spelling")
        elif e["type"] == "missing":
            problems.append(f"{path}: required field is missing")
        else:
            problems.append(f"{path}: got {_fmt_value(e.get('input'))}; {msg[0].lower() + msg[1:]}")
    return problems
