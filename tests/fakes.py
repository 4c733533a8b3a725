"""A fake trial and session runner with a known truth, for tests and simulation benchmarks.

Throughput is ``base x effect(settings) x noise``. The effect table says, for each
``(knob, value)``, the true factor; the noise is seeded and shaped like the machine's:

* a single trial (``run``, a fresh process measured on its own) gets one draw of the
  per-process noise ``process_sd``;
* a session (``run_session``) gets one shared draw for the whole session (the machine's
  load at that moment, which hits every arm alike and cancels in their ratios) and one
  per-arm draw of ``arm_sd`` (each live process's persistent offset), so the log-ratio of
  two arms in one session has sd ``arm_sd * sqrt(2)``.

With ``window_sd`` > 0 each measured trial or arm also reports ``windows`` timed
windows scattered around its throughput (log-scale sd ``window_sd``; the throughput
itself is unchanged by them); by default every window equals the throughput and no
extra draw is taken, so seeded runs stay as they were.

A diagnosed trial (``TrialRequest.diagnose``) reports the ``breakdown`` and ``run_costs``
the runner was given (fixed, or computed from the trial's settings), as the real trial's
profiled window would; without them it reports none, as a trial without that window does.

``tail`` sets the shape of every draw (``normal``, ``t3`` scaled to the same sd, or
``contaminated``: 90 % normal, 10 % five times wider, scaled to the same sd). Probes
(``mode="probe"``) fit while ``batch_size <= fits_up_to`` and report OOM above it.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable, Mapping, Union

from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult

__all__ = ["FakeRunner", "MemoryStore", "SessionResult", "noise_draw", "breakdown_of"]

ENV = {"device_type": "cpu", "device_name": "fake", "torch": "fake"}

# A fixed figure, or one computed from a trial's settings (None: the trial reports none).
PerSettings = Union[Mapping[str, Any], Callable[[dict[str, Any]], Union[Mapping[str, Any], None]], None]


def breakdown_of(shares: Mapping[str, float], *, wall_s: float = 1.0, steps: int = 10, device_type: str = "cpu",
                 device_busy: float | None = None) -> dict[str, Any]:
    """A ``TrialResult.breakdown`` with these phase shares, shaped like the profiled window's.

    Args:
        shares: Share of the wall time per named phase; ``other`` is what they leave.
        wall_s: Wall time of the profiled steps.
        steps: Steps profiled.
        device_type: ``cpu`` or ``cuda``.
        device_busy: The device's busy share of the wall time (accelerators), or None.
    """
    from trainopt.stats.phases import phase_shares

    seconds = {p: s * wall_s for p, s in shares.items() if p != "other"}
    return {"steps": steps, "wall_s": wall_s, "seconds": seconds, "shares": phase_shares(seconds, wall_s),
            "device_type": device_type, "device_busy": device_busy}


def noise_draw(rng: random.Random, sd: float, tail: str = "normal") -> float:
    """One zero-median draw with standard deviation ``sd`` and the given tail shape."""
    if sd <= 0:
        return 0.0
    if tail == "normal":
        return rng.gauss(0.0, sd)
    if tail == "t3":
        # Student t with 3 degrees of freedom has variance 3; scale it to sd.
        z = rng.gauss(0.0, 1.0)
        chi2 = sum(rng.gauss(0.0, 1.0) ** 2 for _ in range(3))
        return sd * z / math.sqrt(chi2 / 3.0) / math.sqrt(3.0)
    if tail == "contaminated":
        # Mixture variance 0.9 + 0.1 * 25 = 3.4.
        wide = 5.0 if rng.random() < 0.1 else 1.0
        return sd * wide * rng.gauss(0.0, 1.0) / math.sqrt(3.4)
    raise ValueError(f"unknown tail {tail!r}; use normal, t3 or contaminated")


class FakeRunner:
    """Implements ``Runner.run`` and ``SessionRunner.run_session`` from a truth table.

    Args:
        effects: ``{(knob, value): factor}``; settings matching several entries multiply.
        base: Throughput of a configuration with no effect, samples/s.
        process_sd: Log-scale noise of a single fresh trial (``run``).
        arm_sd: Log-scale per-arm noise inside a session.
        session_sd: Log-scale noise shared by all arms of one session.
        window_sd: Log-scale noise of each timed window around its trial's throughput.
        windows: Timed windows per measured trial (or arm).
        tail: Shape of every noise draw.
        fits_up_to: Largest batch size that fits in memory.
        fail: ``{(knob, value): status}``: settings that fail with that status.
        seed: Seed of the noise.
        wait: The share of each step every trial reports waiting for the DataLoader.
        breakdown: What a diagnosed trial reports as its ``breakdown``: a dict, or a function
            of the trial's settings returning one (or None).
        run_costs: Likewise for a diagnosed trial's ``run_costs``.
    """

    def __init__(
        self,
        effects: dict[tuple[str, Any], float] | None = None,
        *,
        base: float = 1000.0,
        process_sd: float = 0.1,
        arm_sd: float = 0.05,
        session_sd: float = 0.1,
        window_sd: float = 0.0,
        windows: int = 4,
        tail: str = "normal",
        fits_up_to: int = 10**9,
        fail: dict[tuple[str, Any], str] | None = None,
        seed: int = 0,
        wait: float = 0.05,
        breakdown: PerSettings = None,
        run_costs: PerSettings = None,
    ):
        self.effects = dict(effects or {})
        self.wait = wait
        self.breakdown = breakdown
        self.run_costs = run_costs
        self.base = base
        self.process_sd, self.arm_sd, self.session_sd = process_sd, arm_sd, session_sd
        self.window_sd, self.n_windows = window_sd, windows
        self.tail = tail
        self.fits_up_to = fits_up_to
        self.fail = dict(fail or {})
        self.rng = random.Random(seed)
        self.requests: list[TrialRequest] = []
        self.sessions: list[list[TrialRequest]] = []

    def truth(self, settings: dict[str, Any]) -> float:
        """The noiseless throughput of these settings."""
        speed = self.base
        for (knob, value), factor in self.effects.items():
            if settings.get(knob) == value:
                speed *= factor
        return speed

    def _failure(self, request: TrialRequest) -> TrialResult | None:
        s = request.settings
        if s.get("batch_size", 0) > self.fits_up_to:
            return TrialResult(status="oom", settings=s, mode=request.mode, error="fake out of memory", env=ENV)
        for (knob, value), status in self.fail.items():
            if s.get(knob) == value:
                return TrialResult(status=status, settings=s, mode=request.mode, error=f"fake {status}", env=ENV)
        return None

    def _measured(self, request: TrialRequest, speed: float, windows: list[float] | None = None) -> TrialResult:
        s = request.settings
        batch = s.get("batch_size", 1)
        if windows is not None:
            pass
        elif self.window_sd > 0:
            windows = [speed * math.exp(noise_draw(self.rng, self.window_sd, self.tail)) for _ in range(self.n_windows)]
        else:
            windows = [speed] * self.n_windows
        return TrialResult(
            status="ok", settings=s, mode="measure", samples_per_s=speed, windows=windows, window_steps=10,
            step_time_s=batch / speed, data_wait_fraction=self.wait, peak_memory_bytes=batch * 2**20,
            env=ENV, dataset_len=4096, steps=10 * len(windows),
            breakdown=self._diagnosed(self.breakdown, request), run_costs=self._diagnosed(self.run_costs, request),
        )

    @staticmethod
    def _diagnosed(figure: PerSettings, request: TrialRequest) -> dict[str, Any] | None:
        """What a diagnosed trial reports for ``figure``; None for any other trial."""
        if not request.diagnose or figure is None:
            return None
        value = figure(dict(request.settings)) if callable(figure) else figure
        return dict(value) if value is not None else None

    def run(self, request: TrialRequest, log_path: Path, timeout_s: float) -> TrialResult:
        """One fresh trial: a probe (fits or OOM) or a measurement with per-process noise."""
        self.requests.append(request)
        failed = self._failure(request)
        if failed is not None:
            return failed
        s = request.settings
        if request.mode == "probe":
            return TrialResult(status="ok", settings=s, mode="probe", peak_memory_bytes=s.get("batch_size", 1) * 2**20,
                               env=ENV, dataset_len=4096)
        noise = noise_draw(self.rng, self.process_sd, self.tail)
        return self._measured(request, self.truth(s) * math.exp(noise))

    def run_session(self, requests: list[TrialRequest], log_paths: list[Path], timeout_s: float, seed: int) -> SessionResult:
        """All arms measured together: one shared draw for the session, one draw per arm."""
        self.sessions.append(list(requests))
        self.requests.extend(requests)
        shared = noise_draw(self.rng, self.session_sd, self.tail)
        order_rng = random.Random(seed)
        arms = []
        for request in requests:
            failed = self._failure(request)
            if failed is not None:
                arms.append(failed)
                continue
            noise = shared + noise_draw(self.rng, self.arm_sd, self.tail)
            arms.append(self._measured(request, self.truth(request.settings) * math.exp(noise)))
        rounds = 6
        order = [order_rng.sample(range(len(requests)), len(requests)) for _ in range(rounds)]
        return SessionResult(arms=arms, mode="interleaved", rounds=rounds, order=order, note="fake session", wall_s=0.0)


class _Handle:
    def __init__(self, number: int):
        self.number = number


class MemoryStore:
    """The ``TrialStore`` interface kept in a dict: for simulations that run the search thousands of times."""

    def __init__(self):
        self.stale = 0
        self._done: dict[str, TrialResult] = {}
        self._records: list[dict[str, Any]] = []
        self._next = 0

    def lookup(self, key: str) -> TrialResult | None:
        return self._done.get(key)

    def begin(self, key: str, meta: dict[str, Any]) -> _Handle:
        self._next += 1
        return _Handle(self._next - 1)

    def finish(self, handle: _Handle, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        self._done[key] = result
        self._records.append({"number": handle.number, "key": key, **meta, "result": result})

    def records(self) -> list[dict[str, Any]]:
        return list(self._records)
