"""Screening one knob: multi-arm sessions of the incumbent and every candidate, and a second look at the near misses.

A screen only chooses what to confirm (``decide.screen``); its ratios are point figures
from one session. With several slots the candidates are split over up to one session per
slot, each with its own copy of the incumbent, and a candidate's ratio is always to the
incumbent of its own session.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from trainopt.contract.protocol import TrialResult
from trainopt.decide import plan
from trainopt.decide.screen import (
    MAX_CONFIRM,
    RESCREEN_FLOOR,
    SCREEN_GATE,
    rescreen_candidates,
)
from trainopt.search.broker import SessionAsk, TrialBroker
from trainopt.search.errors import SearchFailed

__all__ = ["Screen", "Screener"]


class Screen(NamedTuple):
    """One candidate's screen.

    Attributes:
        settings: The candidate's settings.
        arm: Its arm in the screen session (the first session's, when screened twice and
            it ran both times).
        ratio: Its throughput over the incumbent of its session (the geometric mean of
            both when screened twice); None when it failed.
    """

    settings: dict[str, Any]
    arm: TrialResult
    ratio: float | None


class Screener:
    """Runs the screen sessions of the search's knobs.

    Args:
        broker: Runs or reuses the sessions.

    Attributes:
        rescreen_floor: The lowest ratio screened a second time (None: never screened
            again); see ``decide.screen.RESCREEN_FLOOR``.
        first_screen_rate: The incumbent arm's throughput in the search's first screen
            session: the baseline settings (nothing is adopted before a screen), measured
            the way session arms are.
    """

    def __init__(self, broker: TrialBroker):
        self.broker = broker
        self.rescreen_floor: float | None = RESCREEN_FLOOR
        self.first_screen_rate: float | None = None
        # Both screen ratios of each candidate screened twice, by settings hash.
        self._twice: dict[str, list[float | None]] = {}

    def screen(self, incumbent: dict[str, Any], cands: list[dict[str, Any]], stage: str, knob: str,
               tag: str = "screen") -> tuple[TrialResult, list[Screen]]:
        """Point speedups of every candidate from sessions with the incumbent.

        One session of the incumbent and every candidate; with several slots, the
        candidates are split over up to one session per slot, and the sessions run side by
        side.

        Returns:
            The first session's incumbent arm, and each candidate's screen in order.

        Raises:
            SearchFailed: The incumbent failed in a session.
        """
        n = max(1, min(int(getattr(self.broker.executor, "slots", 1) or 1), len(cands)))
        groups = [cands[g * len(cands) // n:(g + 1) * len(cands) // n] for g in range(n)]
        # One session keeps the plain tag, so a one-slot search stores what it always did.
        asks = [SessionAsk([incumbent, *group], stage, knob, "screen", tag if n == 1 else f"{tag}{g}")
                for g, group in enumerate(groups)]
        sessions = self.broker.sessions(asks)
        screens = []
        for group, session in zip(groups, sessions):
            ref = session.arms[0]
            if not ref.ok:
                raise SearchFailed(f"the incumbent failed while screening {knob} ({ref.status}: {ref.error}); "
                                   f"log: {ref.log_path}")
            if self.first_screen_rate is None:
                self.first_screen_rate = ref.samples_per_s
            screens += [Screen(settings, session.arms[i + 1], session.ratio(i + 1, 0)) for i, settings in enumerate(group)]
        return sessions[0].arms[0], screens

    def rescreen(self, incumbent: dict[str, Any], screens: list[Screen], stage: str, knob: str) -> list[Screen]:
        """Screen the near misses once more in a fresh session; judge them by both screens.

        Only while fewer than ``MAX_CONFIRM`` candidates cleared the gate (a near miss could
        not be confirmed otherwise); see ``decide.screen.rescreen_candidates``.

        Returns:
            The screens, the near misses' replaced by their geometric mean (or by a failure
            when they failed the second time).
        """
        screens = list(screens)
        again = rescreen_candidates([s.ratio for s in screens], SCREEN_GATE, self.rescreen_floor, MAX_CONFIRM)
        if not again:
            return screens
        _, second = self.screen(incumbent, [screens[i].settings for i in again], stage, knob, tag="rescreen")
        for i, (_, r2, sp2) in zip(again, second):
            settings, r, sp = screens[i]
            if not r2.ok or sp2 is None:
                # Failing when run again is a failure, however it screened the first time.
                screens[i] = Screen(settings, r2, None)
            else:
                screens[i] = Screen(settings, r, math.sqrt(sp * sp2))
            self._twice[plan.settings_hash(settings)] = [sp, sp2]
        return screens

    def both_screens(self, settings: dict[str, Any]) -> list[float | None] | None:
        """Both screen ratios of a candidate screened twice (None when screened once)."""
        return self._twice.get(plan.settings_hash(settings))
