"""A fake machine whose speed changes over (simulated) time, and the stability guard's loop over it.

``LoadedMachine`` is a ``FakeRunner`` whose sessions run on a clock: each arm alternates
timed windows with the others in randomised rounds, as an interleaved session does, and
every window runs at ``load(t)`` times the arm's speed, where ``load`` says how much of the
machine a neighbour leaves at time ``t``. ``hog`` makes the load of a CPU hog that runs a
few seconds in every period; ``drive_guard`` judges sessions with a ``StabilityGuard``
exactly as the search does (judge, re-run after ``settle_s``, mark when out of retries).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any, Callable

from tests.fakes import FakeRunner, noise_draw
from trainopt.contract.protocol import TrialRequest
from trainopt.contract.session import SessionResult
from trainopt.decide.plan import settings_hash
from trainopt.decide.session_plan import round_orders
from trainopt.decide.stability import StabilityGuard, observe

__all__ = ["LoadedMachine", "hog", "drive_guard", "request"]


def hog(on_s: float, off_s: float, slow: float, phase: float = 0.0) -> Callable[[float], float]:
    """The load of a CPU hog running ``on_s`` seconds in every ``on_s + off_s``: the arm gets ``slow`` of its speed."""
    period = on_s + off_s

    def load(t: float) -> float:
        return slow if on_s > 0 and (t + phase) % period < on_s else 1.0

    return load


class LoadedMachine(FakeRunner):
    """``FakeRunner`` sessions measured window by window on a clock, under a time-varying load.

    Args:
        effects: As ``FakeRunner``.
        load: ``t -> factor`` of the machine left to the arms at time ``t`` (1.0: idle).
        rounds: Timed rounds per session; each window takes 1 s at the arm's base speed
            (a fixed number of samples), longer when it runs slower.
        **kwargs: ``FakeRunner``'s (``base``, ``arm_sd``, ``session_sd``, ``window_sd``, ``tail``, ``seed`` ...).
    """

    def __init__(self, effects: dict[tuple[str, Any], float] | None = None, *,
                 load: Callable[[float], float] = lambda t: 1.0, rounds: int = 8, **kwargs: Any):
        kwargs.setdefault("window_sd", 0.07)
        super().__init__(effects, **kwargs)
        self.load = load
        self.rounds = rounds
        self.t = 0.0

    def sleep(self, seconds: float) -> None:
        self.t += seconds

    def run_session(self, requests: list[TrialRequest], log_paths: list[Path], timeout_s: float, seed: int) -> SessionResult:
        self.sessions.append(list(requests))
        self.requests.extend(requests)
        start = self.t
        shared = noise_draw(self.rng, self.session_sd, self.tail)
        arms = []
        speeds: dict[int, float] = {}
        for i, r in enumerate(requests):
            failed = self._failure(r)
            arms.append(failed)
            if failed is None:
                speeds[i] = self.truth(r.settings) * math.exp(shared + noise_draw(self.rng, self.arm_sd, self.tail))
        windows: dict[int, list[float]] = {i: [] for i in speeds}
        orders = []
        for order in round_orders(len(requests), self.rounds, seed):
            orders.append([i for i in order if i in speeds])
            for i in orders[-1]:
                w = speeds[i] * math.exp(noise_draw(self.rng, self.window_sd, self.tail)) * self.load(self.t)
                windows[i].append(w)
                self.t += self.base / w
        for i, ws in windows.items():
            # Fixed samples per window: the arm's throughput is the harmonic mean of its windows.
            arms[i] = self._measured(requests[i], len(ws) / sum(1.0 / w for w in ws), windows=ws)
        return SessionResult(arms=arms, mode="interleaved", rounds=self.rounds, order=orders, note="loaded fake session",
                             wall_s=self.t - start)


def request(settings: dict[str, Any]) -> TrialRequest:
    return TrialRequest(spec={}, source_dir=".", settings=settings, mode="measure", result_path="/nonexistent")


def drive_guard(guard: StabilityGuard, runner: FakeRunner, sessions: int, *, stage_len: int = 6,
                screen_arms: int = 4) -> tuple[int, int]:
    """Run ``sessions`` sessions judged by ``guard`` the way the search judges them.

    Every ``stage_len`` sessions a new incumbent takes over (a kept change: a new settings
    hash); each stage starts with a screen of ``screen_arms`` arms, then pair sessions. An
    unstable session is re-run after ``guard.settle_s`` until stable or out of retries.

    Args:
        guard: The guard.
        runner: A ``FakeRunner`` (its sessions take 8 s per arm) or a ``LoadedMachine``
            (its own clock, which the settling advances).
        sessions: Sessions to run.

    Returns:
        ``(sessions whose first attempt was judged unstable, sessions whose last attempt stayed unstable)``.
    """
    first_unstable = marked = 0
    t = 0.0
    for i in range(sessions):
        stage = i // stage_len
        incumbent = {"stage": stage, "amp": "off"}
        arms = screen_arms if i % stage_len == 0 else 2
        requests = [request(incumbent)] + [request({"stage": stage, "amp": f"c{k}"}) for k in range(arms - 1)]
        retry = 0
        while True:
            session = runner.run_session(requests, [], 60.0, seed=random.Random(i * 31 + retry).randrange(2**31))
            t += session.wall_s or 8.0 * len(requests)
            o = observe(session, 0, t_s=t, stage=f"s{stage}", knob="amp", role="screen" if arms > 2 else "confirm",
                        settings_hash=settings_hash(incumbent))
            c = guard.check(o)
            final = c.stable or retry == guard.max_retries
            guard.record(o, c, retry=retry, final=final)
            first_unstable += retry == 0 and not c.stable
            if final:
                marked += not c.stable
                break
            retry += 1
            t += guard.settle_s
            if isinstance(runner, LoadedMachine):
                runner.sleep(guard.settle_s)
    return first_unstable, marked
