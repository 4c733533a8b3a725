"""What a measurement session returns, and what measures one.

A session measures several configurations ("arms") together. ``SessionResult`` is plain
data shared by the session runners (``trainopt.execute``), the decisions read from
sessions (``trainopt.decide``) and the search; ``SessionRunner`` is what any of them may
call to measure a session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainopt.contract.protocol import TrialRequest, TrialResult

__all__ = ["SessionResult", "SessionRunner"]


@dataclass
class SessionResult:
    """What a session measured.

    Attributes:
        arms: One result per request, in request order; each with its own status and the
            windows and throughput measured inside this session.
        mode: ``interleaved`` (live arms, alternating windows) or ``sequential`` (fallback).
        rounds: Timed rounds completed (interleaved); 0 for sequential.
        order: The arm order in each round (sequential: one list, the order the arms ran).
        note: Why the session fell back to sequential, or other remarks.
        wall_s: Wall time of the whole session.
        start_order: The order the arms were forked and warmed up in (interleaved).
    """

    arms: list[TrialResult]
    mode: str
    rounds: int = 0
    order: list[list[int]] = field(default_factory=list)
    note: str = ""
    wall_s: float | None = None
    start_order: list[int] = field(default_factory=list)

    def ratio(self, a: int, b: int) -> float | None:
        """samples_per_s of arm a / arm b, or None if either arm failed."""
        ra, rb = self.arms[a], self.arms[b]
        if not (ra.ok and rb.ok) or not ra.samples_per_s or not rb.samples_per_s:
            return None
        return ra.samples_per_s / rb.samples_per_s

    def to_dict(self) -> dict[str, Any]:
        return {"arms": [a.to_dict() for a in self.arms], "mode": self.mode, "rounds": self.rounds,
                "order": self.order, "note": self.note, "wall_s": self.wall_s, "start_order": self.start_order}


class SessionRunner(Protocol):
    """Anything that measures several requests together."""

    def run_session(self, requests: list[TrialRequest], log_paths: list[Path], timeout_s: float,
                    seed: int) -> SessionResult: ...
