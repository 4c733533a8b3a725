"""The stability guard: notices when the machine changes under a search.

A session cancels load that hits all of its arms alike, but not load that comes and goes
within it (a neighbour's job hogging the CPUs for a few seconds at a time hits some
windows of some arms), and a machine whose speed moves between sessions makes figures
taken minutes apart disagree. The search runs its incumbent in every session, so the
incumbent's throughput is a probe of the machine: sessions of one incumbent (one
settings hash, one place) should measure it at about the same level, and a session's
windows should be about as noisy as the sessions before it.

``StabilityGuard.check`` judges a session against the stable history before it:

* the incumbent's level: its log throughput against the median of the earlier stable
  sessions of the same settings (and node and device), in units of their spread (scaled
  MAD, widened while the history is short), floored at ``LEVEL_PER_WINDOW_NOISE`` times
  its usual window noise, so a 25 % change stands out at a GPU's 1 % noise too;
* the session's window noise: against the pooled noise of the earlier stable sessions of
  the same incumbent beside the same kind of arm (a loader-worker or compiled arm makes
  the incumbent's windows uneven on a steady machine: the arm, not the machine), and
  against a fixed ceiling when one is set.

The broker measures an unstable screen again (at most ``max_retries`` times); a pair session
is kept, its verdict marked, and the next sessions wait ``settle_s``, so the guard picks no
pairs. Everything here is plain data in, plain data out: no torch, no clock, no sleeping.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from trainopt.contract.session import SessionResult

__all__ = [
    "Observation",
    "Check",
    "StabilityGuard",
    "observe",
    "window_noise",
    "final_disagreement",
    "session_kind",
    "MAD_TO_SD",
    "LEVEL_PER_WINDOW_NOISE",
    "FRESH_PROCESS_TOLERANCE",
]

# A normal distribution's sd is 1.4826 x its median absolute deviation.
MAD_TO_SD = 1.4826
# The variance of a median of n normal draws is about pi/2 x sigma^2 / n.
_MEDIAN_VARIANCE = math.pi / 2
# A quiet machine's session-to-session spread of one incumbent's level per unit of its
# usual window noise: 1.4-2.5 over each stage of a recorded demo run (2-core CPU; the
# process offset and the session's shared load move the level, not the windows). At the
# demo's 3-7 % noise that floors the spread at 8-18 %; at a GPU's 1 %, at 2.5 %, and a
# 25 % change of speed is 9 spreads away.
LEVEL_PER_WINDOW_NOISE = 2.5
# How far a one-shot fresh process of the baseline settings may sit from the final
# check's live arms before it counts as a disagreement: fresh processes and forked arms
# of the same settings differed by 1.2-1.5x in four quiet demo runs of five, and one fresh
# process scatters by sd 0.12 (0.165 for the log ratio of two): 1.5 x e^(2 x 0.12) = 1.9.
# A machine whose speed really moved (1,300 against 270-350 samples/s) is far outside it.
FRESH_PROCESS_TOLERANCE = 2.0


def session_kind(settings: Sequence[dict[str, Any] | None]) -> str:
    """The kinds of arm in a session that make windows uneven: ``workers``, ``compiled``, both, or ``plain``.

    Loader workers and compiled code run beside the timed loop (prefetching, compile
    threads), and their windows scatter by 20-50 % on a steady machine; an incumbent
    measured beside such an arm shows more window noise than beside a plain one.
    """
    kinds = set()
    for s in settings:
        if not s:
            continue
        if isinstance(s.get("num_workers"), int) and s["num_workers"] > 0:
            kinds.add("workers")
        if s.get("compile") not in (None, "off", False):
            kinds.add("compiled")
    return "+".join(sorted(kinds)) or "plain"


@dataclass(frozen=True)
class Observation:
    """What one session showed about the machine.

    Attributes:
        t_s: Seconds since the search started, at the end of the session.
        stage: The search stage.
        knob: The knob being decided.
        role: ``screen``, ``confirm``, ``holdout`` or ``final``.
        settings_hash: ``plan.settings_hash`` of the incumbent arm; levels compare only
            within one hash.
        incumbent_samples_per_s: The incumbent arm's throughput in this session, or None
            when it failed.
        noise: The session's window noise (see ``window_noise``), or None when no arm
            measured enough windows.
        wall_s: How long the session took (the start of an unstable period), if known.
        where: Where the incumbent ran (node and device); levels compare only within one
            place, as two slots of a machine need not run equally fast.
        kind: What kinds of arm the session held beside the incumbent (``session_kind``);
            window noise compares only within one kind.
        noise_df: Degrees of freedom of ``noise`` (its windows less one; 0: unknown, read as 2).
    """

    t_s: float
    stage: str
    knob: str
    role: str
    settings_hash: str
    incumbent_samples_per_s: float | None
    noise: float | None
    wall_s: float | None = None
    where: str = ""
    kind: str = ""
    noise_df: int = 0


@dataclass(frozen=True)
class Check:
    """The guard's judgement of one session.

    Attributes:
        stable: The session looks like the ones before it.
        reason: Empty when stable; else what moved, with the numbers.
    """

    stable: bool
    reason: str = ""


def window_noise(windows: Sequence[float]) -> float | None:
    """The spread of one arm's window throughputs: the sd of their logs, extremes left out.

    The standard deviation of the log throughputs without the fastest and the slowest
    window (kept when there are fewer than five): one odd window does not count, while
    load that comes and goes (a neighbour's job hogging the CPUs for a few seconds at a
    time, which slows a fifth to a half of the windows) does. Among the robust spreads
    tried (inter-quartile range, MAD, trimmed sd) it separates such load best from
    ordinary window noise of 5-15 %. On a log scale it reads like a relative spread; for
    ordinary noise of eight windows it is about 0.8 of their coefficient of variation.
    None for fewer than three usable windows.
    """
    logs = sorted(math.log(w) for w in windows if isinstance(w, (int, float)) and math.isfinite(w) and w > 0)
    if len(logs) < 3:
        return None
    if len(logs) >= 5:
        logs = logs[1:-1]
    return statistics.stdev(logs)


def _where(env: dict[str, Any]) -> str:
    parts = [str(env[k]) for k in ("node", "device") if env.get(k) not in (None, "")]
    return "/".join(parts)


def observe(
    session: SessionResult,
    incumbent_index: int,
    *,
    t_s: float,
    stage: str,
    knob: str,
    role: str,
    settings_hash: str,
) -> Observation:
    """The observation of one session.

    The session's noise is the incumbent's window noise over its steady windows; its kind
    (``session_kind``) is read from every arm's settings.

    Args:
        session: The session's result.
        incumbent_index: Which arm ran the incumbent.
        t_s: Seconds since the search started, at the end of the session.
        stage: The search stage.
        knob: The knob being decided.
        role: ``screen``, ``confirm``, ``holdout`` or ``final``.
        settings_hash: The incumbent's settings hash.
    """
    # The incumbent's windows only: its configuration is the same in every session of one
    # knob, while candidates differ (loader workers make windows far more uneven), so the
    # incumbent's noise is comparable from session to session and the candidates' is not.
    incumbent = session.arms[incumbent_index]
    noises, df = [], 0
    if incumbent.ok:
        arm = incumbent
        windows = arm.windows[arm.steady_from:] if len(arm.windows) - arm.steady_from >= 3 else arm.windows
        n = window_noise(windows)
        if n is not None:
            noises.append(n)
            used = sum(1 for w in windows if isinstance(w, (int, float)) and math.isfinite(w) and w > 0)
            df = (used - 2 if used >= 5 else used) - 1
    level = incumbent.samples_per_s if incumbent.ok and incumbent.samples_per_s else None
    return Observation(
        t_s=float(t_s),
        stage=stage,
        knob=knob,
        role=role,
        settings_hash=settings_hash,
        incumbent_samples_per_s=float(level) if level is not None else None,
        noise=statistics.median(noises) if noises else None,
        wall_s=session.wall_s,
        where=_where(incumbent.env or {}),
        kind=session_kind([a.settings for a in session.arms]),
        noise_df=df,
    )


def _fmt_rate(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _robust_sd(logs: Sequence[float], floor: float) -> float:
    """Scaled MAD of ``logs``, at least ``floor``, widened for the uncertainty of their median."""
    centre = statistics.median(logs)
    mad = statistics.median(abs(x - centre) for x in logs) * MAD_TO_SD
    return max(floor, mad) * math.sqrt(1.0 + _MEDIAN_VARIANCE / len(logs))


class StabilityGuard:
    """Tracks the incumbent's level and the window noise over a search, and judges sessions.

    Args:
        max_retries: How many times the caller measures an unstable screen again.
        settle_s: How long the caller waits before that, or after a kept unstable pair session.
        level_sd_floor: Smallest spread (log scale) a level's history is credited with;
            above it, ``level_noise`` times the incumbent's usual window noise (a quiet
            machine's session-to-session spread at that noise), so that a few lucky, close
            sessions do not make the next ordinary one look like a shift.
        level_noise: See ``level_sd_floor`` (``LEVEL_PER_WINDOW_NOISE``).
        level_limit: How many spreads the incumbent may move from its level.
        min_history: Stable sessions of the same incumbent needed before its level is judged.
        noise_ratio: A session is unstable when its noise exceeds this multiple of the
            usual (pooled) noise, or the F ratio reached by chance once in ``noise_alarm``
            sessions when that is larger (few windows in few sessions) ...
        noise_floor: ... and this absolute noise: three times a GPU's 1 % (a jump from 1 %
            to 3 % is no problem).
        min_noise_history: Stable sessions needed before noise is judged against its history.
        noise_alarm: See ``noise_ratio``.
        noise_ceiling: Noise beyond which a session is unstable whatever came before (load
            present all through a search never shows as a jump). Off by default: a fixed
            ceiling cannot scale with the machine (input-bound windows scatter by 40-50 %).
        history: How many of the latest stable sessions form a level (and, times three,
            the usual noise): a slow drift over a long search moves the reference along,
            a burst of load does not.
        persist: After this many consecutive sessions of one incumbent at a shifted but
            consistent level (and with ordinary noise), the shift is taken as the machine's
            new level rather than re-run forever.
    """

    def __init__(
        self,
        *,
        max_retries: int = 2,
        settle_s: float = 10.0,
        level_sd_floor: float = 0.01,
        level_noise: float = LEVEL_PER_WINDOW_NOISE,
        level_limit: float = 4.0,
        min_history: int = 3,
        noise_ratio: float = 3.0,
        noise_floor: float = 0.03,
        min_noise_history: int = 3,
        noise_alarm: float = 1e-3,
        noise_ceiling: float | None = None,
        history: int = 12,
        persist: int = 3,
    ):
        if max_retries < 0 or settle_s < 0:
            raise ValueError(f"max_retries ({max_retries}) and settle_s ({settle_s}) must be >= 0")
        if min_history < 2 or min_noise_history < 1 or persist < 2 or history < min_history:
            raise ValueError(
                f"min_history ({min_history}) must be >= 2, min_noise_history ({min_noise_history}) >= 1, "
                f"persist ({persist}) >= 2 and history ({history}) >= min_history"
            )
        self.max_retries, self.settle_s, self.history, self.persist = max_retries, settle_s, history, persist
        self.level_sd_floor, self.level_noise, self.level_limit = level_sd_floor, level_noise, level_limit
        self.min_history, self.min_noise_history = min_history, min_noise_history
        self.noise_ratio, self.noise_floor, self.noise_alarm = noise_ratio, noise_floor, noise_alarm
        self.noise_ceiling = noise_ceiling
        self.points: list[dict[str, Any]] = []
        # Per (settings_hash, where): log levels of the stable sessions, and of the
        # consecutive sessions since the last stable one that showed a shifted level.
        self._levels: dict[tuple[str, str], list[float]] = {}
        self._shifted: dict[tuple[str, str], list[float]] = {}
        # Per (settings_hash, where, kind): window noise of the stable sessions. Per
        # incumbent, as its configuration sets its noise (loader workers make windows far
        # more uneven), and per kind of arm beside it, which makes its windows uneven too.
        self._noises: dict[tuple[str, str, str], list[tuple[float, int]]] = {}

    # ---- judging --------------------------------------------------------------------------

    @staticmethod
    def _key(obs: Observation) -> tuple[str, str]:
        return obs.settings_hash, obs.where

    @staticmethod
    def _noise_key(obs: Observation) -> tuple[str, str, str]:
        return obs.settings_hash, obs.where, obs.kind

    def _usual_noise(self, obs: Observation) -> float | None:
        """The incumbent's pooled window noise (root mean square) over its stable sessions of any kind."""
        noises = [n for (h, w, _), ns in self._noises.items() if (h, w) == self._key(obs) for n, _ in ns[-3 * self.history:]]
        if not noises:
            return None
        return math.sqrt(sum(n * n for n in noises) / len(noises))

    def _level_floor(self, obs: Observation) -> float:
        """The smallest spread a level is credited with: ``level_noise`` x the usual window noise."""
        usual = self._usual_noise(obs)
        return max(self.level_sd_floor, self.level_noise * usual) if usual else self.level_sd_floor

    def _new_level(self, obs: Observation) -> bool:
        """The last ``persist`` shifted sessions agree with each other and with ``obs``."""
        shifted = self._shifted.get(self._key(obs), [])
        if len(shifted) < self.persist or obs.incumbent_samples_per_s is None:
            return False
        recent = shifted[-self.persist:]
        floor = self._level_floor(obs)
        sd = _robust_sd(recent, floor)
        centre = statistics.median(recent)
        agree = max(recent) - min(recent) <= 2 * self.level_limit * floor
        return agree and abs(math.log(obs.incumbent_samples_per_s) - centre) <= self.level_limit * sd

    def _level_reason(self, obs: Observation) -> str:
        history = self._levels.get(self._key(obs), [])[-self.history:]
        if obs.incumbent_samples_per_s is None or len(history) < self.min_history:
            return ""
        if self._new_level(obs):
            return ""
        centre = statistics.median(history)
        sd = _robust_sd(history, self._level_floor(obs))
        z = (math.log(obs.incumbent_samples_per_s) - centre) / sd
        if abs(z) <= self.level_limit:
            return ""
        return (
            f"incumbent at {_fmt_rate(obs.incumbent_samples_per_s)} samples/s, {abs(z):.1f} noise-sd "
            f"{'below' if z < 0 else 'above'} its level {_fmt_rate(math.exp(centre))}"
        )

    def _noise_reason(self, obs: Observation) -> str:
        if obs.noise is None:
            return ""
        if self.noise_ceiling is not None and obs.noise > self.noise_ceiling:
            return (
                f"window noise {obs.noise:.0%}, above the {self.noise_ceiling:.0%} a steady machine shows "
                f"(load that comes and goes within the session)"
            )
        noises = self._noises.get(self._noise_key(obs), [])
        if len(noises) < self.min_noise_history:
            return ""
        # The pooled spread (root mean square), not the median of the spreads: with few
        # windows a session's spread scatters widely (three windows: two degrees of
        # freedom), so a median of a handful of them often sits far below the machine's
        # real noise and ordinary sessions would then look "3x noisier". The mean of the
        # variances estimates the real one without that bias.
        # The ratio allowed grows while that pool is small: a session's noise over it is an F
        # ratio; three sessions of three windows put its 1-in-1,000 point at 5.2x, not 3x.
        recent = noises[-3 * self.history:]
        usual = math.sqrt(sum(n * n for n, _ in recent) / len(recent))
        from scipy.stats import f as f_dist
        df_usual = sum(max(d, 1) if d else 2 for _, d in recent)
        ratio = max(self.noise_ratio, math.sqrt(f_dist.isf(self.noise_alarm, obs.noise_df or 2, df_usual)))
        if obs.noise <= self.noise_floor or obs.noise <= ratio * usual:
            return ""
        return (
            f"window noise {obs.noise:.0%} against a usual {usual:.0%} "
            f"(more than {ratio:.1f}x and above {self.noise_floor:.0%})"
        )

    def check(self, obs: Observation) -> Check:
        """Judge a session against the stable sessions recorded before it; records nothing."""
        reasons = [r for r in (self._level_reason(obs), self._noise_reason(obs)) if r]
        return Check(stable=not reasons, reason="; ".join(reasons))

    # ---- bookkeeping ----------------------------------------------------------------------

    def record(self, obs: Observation, check: Check, *, retry: int, final: bool) -> None:
        """Remember one attempt of a session and how it was judged.

        Only stable attempts join the history that later sessions are judged against, so a
        burst of load cannot drag the reference along with it.

        Args:
            obs: The attempt's observation.
            check: ``check(obs)``.
            retry: 0 for the first attempt, 1 for the first re-run, ...
            final: This attempt's result is the one used (stable, or out of retries); an
                unstable final attempt marks its verdict.
        """
        key = self._key(obs)
        level = math.log(obs.incumbent_samples_per_s) if obs.incumbent_samples_per_s else None
        if check.stable:
            if level is not None:
                if self._new_level(obs):
                    # The machine has settled at another speed: judge from here on against it.
                    self._levels[key] = self._shifted[key][-self.persist:]
                self._levels.setdefault(key, []).append(level)
            self._shifted.pop(key, None)
            if obs.noise is not None:
                self._noises.setdefault(self._noise_key(obs), []).append((obs.noise, obs.noise_df))
        elif level is not None and not self._noise_reason(obs):
            # A shifted level with ordinary noise: a candidate for the machine's new level.
            self._shifted.setdefault(key, []).append(level)
        else:
            # Noisy sessions say nothing reliable about a new level.
            self._shifted.pop(key, None)
        self.points.append(
            {
                "t_s": obs.t_s,
                "wall_s": obs.wall_s,
                "stage": obs.stage,
                "knob": obs.knob,
                "role": obs.role,
                "settings_hash": obs.settings_hash,
                "where": obs.where,
                "kind": obs.kind,
                "samples_per_s": obs.incumbent_samples_per_s,
                "noise": obs.noise,
                "stable": check.stable,
                "retry": int(retry),
                "final": bool(final),
                "reason": check.reason,
            }
        )

    @property
    def retries(self) -> int:
        """Re-runs made so far."""
        return sum(1 for p in self.points if p["retry"] > 0)

    @property
    def unstable_verdicts(self) -> int:
        """Sessions whose last attempt was still unstable (their verdicts are marked)."""
        return sum(1 for p in self.points if p["final"] and not p["stable"])

    def unstable_periods(self) -> list[list[float]]:
        """``[start_s, end_s]`` of each run of consecutive unstable attempts, in time order.

        An attempt spans ``[t_s - wall_s, t_s]`` (just ``t_s`` when its length is unknown);
        consecutive unstable attempts with no stable one between them form one period.
        """
        periods: list[list[float]] = []
        open_period = False
        for p in sorted(self.points, key=lambda p: p["t_s"]):
            if p["stable"]:
                open_period = False
                continue
            start = p["t_s"] - (p["wall_s"] or 0.0)
            if open_period:
                periods[-1][0] = min(periods[-1][0], start)
                periods[-1][1] = max(periods[-1][1], p["t_s"])
            else:
                periods.append([start, p["t_s"]])
                open_period = True
        return periods

    def noise_by_stage(self) -> dict[str, float]:
        """The median window noise of every stage's sessions (all attempts)."""
        by_stage: dict[str, list[float]] = {}
        for p in self.points:
            if p["noise"] is not None:
                by_stage.setdefault(p["stage"], []).append(p["noise"])
        return {stage: statistics.median(values) for stage, values in by_stage.items()}

    def to_dict(self) -> dict[str, Any]:
        """The results document's ``stability`` section."""
        return {
            "points": [dict(p) for p in self.points],
            "unstable_periods": self.unstable_periods(),
            "noise_by_stage": self.noise_by_stage(),
            "retries": self.retries,
            "unstable_verdicts": self.unstable_verdicts,
            "max_retries": self.max_retries,
            "settle_s": self.settle_s,
        }


# ---- the final check against the rest ---------------------------------------------------


def _interval(d: dict[str, Any]) -> tuple[float, float] | None:
    ci = d.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_positive(c) for c in ci):
        return float(min(ci)), float(max(ci))
    speedup = d.get("speedup")
    return (float(speedup), float(speedup)) if _positive(speedup) else None


def _fmt_speedup(v: Any) -> str:
    return f"{float(v):.3f}x" if _positive(v) else "no speedup"


def _positive(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def final_disagreement(
    final: dict[str, Any],
    kept: list[dict[str, Any]],
    baseline_samples_per_s: float | None,
    *,
    baseline_tolerance: float = 0.3,
    prediction_level: float = 0.95,
    baseline_label: str = "the baseline trial",
    fresh_process: bool | None = None,
    spread_floor: float = 0.05,
) -> str | None:
    """A warning when the final check disagrees with earlier measurements of the same settings.

    Two comparisons, each only when both sides were measured:

    * the final check's interval against the interval the kept changes imply together
      (the product of their lower ends to the product of their upper ends: generous, as
      each change's interval is taken at its extreme at once);
    * the baseline settings' throughput in the final check against an earlier measurement
      of them (``baseline_samples_per_s``). That is one process, and every process of the
      same settings carries an offset of its own: the final check's own baseline arms of
      the demo scattered over 322-507 samples/s on a quiet machine, and a fixed 30 %
      tolerance flagged two quiet demo runs of three. So it is compared with the ``prediction_level``
      prediction interval for one more process, from the final check's baseline arms on
      the log scale (``final["baseline_arms_samples_per_s"]``, Student t), never more
      strictly than ``spread_floor``: the interval scales with the machine's own
      scatter, so a 20-30 % change of a GPU's clock at 1 % noise shows. With fewer than
      three such arms, the fixed ``baseline_tolerance`` applies. An earlier figure from a
      one-shot fresh process (``fresh_process``: the baseline trial) is not like with
      like: fresh processes and forked arms of the same settings differ by 1.2-1.5x on
      a quiet machine, so it counts only beyond ``FRESH_PROCESS_TOLERANCE`` (twice or
      half) on the log scale. A machine whose speed really moved (1,300 against 270-350
      samples/s in the case that prompted this check) is still far outside it.

    Args:
        final: The results document's ``final`` section (``ci``, ``speedup``,
            ``baseline_samples_per_s``, ...).
        kept: The kept decisions (``speedup``, ``ci``), in the order adopted.
        baseline_samples_per_s: An earlier throughput of the baseline settings (the search
            passes its first screen session's incumbent arm, measured like the final check's
            arms; the baseline trial when there was no screen).
        baseline_tolerance: Relative difference of the two baseline figures always tolerated.
        prediction_level: Level of the prediction interval from the final check's
            baseline arms (used when it has three or more).
        baseline_label: What measured ``baseline_samples_per_s``, for the message.
        fresh_process: ``baseline_samples_per_s`` is a one-shot fresh process, not a live
            session arm; None: it is when ``baseline_label`` is the default (the baseline
            trial).
        spread_floor: The least relative difference tolerated when the final check's own
            baseline arms give the prediction interval.

    Returns:
        The warning text, or None when everything agrees.
    """
    problems = []
    final_ci = final.get("ci")
    if kept and isinstance(final_ci, (list, tuple)) and len(final_ci) == 2 and all(_positive(c) for c in final_ci):
        parts = [_interval(d) for d in kept]
        if all(p is not None for p in parts):
            low = math.prod(p[0] for p in parts)
            high = math.prod(p[1] for p in parts)
            f_low, f_high = float(min(final_ci)), float(max(final_ci))
            if f_high < low or f_low > high:
                point = math.prod(float(d["speedup"]) if _positive(d.get("speedup")) else math.sqrt(p[0] * p[1])
                                  for d, p in zip(kept, parts))
                n = len(kept)
                problems.append(
                    f"the final check measured {_fmt_speedup(final.get('speedup'))} [{f_low:.3f}, {f_high:.3f}] against "
                    f"the baseline, while the {n} kept change{'s' if n != 1 else ''} multiply to {point:.3f}x "
                    f"[{low:.3f}, {high:.3f}]"
                )
    final_base = final.get("baseline_samples_per_s")
    if _positive(final_base) and _positive(baseline_samples_per_s):
        ratio = float(final_base) / float(baseline_samples_per_s)
        tolerance, off = math.log1p(baseline_tolerance), math.log(ratio)
        arms = [math.log(float(r)) for r in final.get("baseline_arms_samples_per_s") or [] if _positive(r)]
        if len(arms) >= 3:
            from scipy import stats as st

            n = len(arms)
            spread = st.t.ppf(0.5 + prediction_level / 2, n - 1) * statistics.stdev(arms) * math.sqrt(1 + 1 / n)
            # The arms' mean on the log scale: the figure the prediction interval is centred on.
            off = statistics.fmean(arms) - math.log(float(baseline_samples_per_s))
            tolerance = max(math.log1p(spread_floor), spread)
        if fresh_process is None:
            fresh_process = baseline_label == "the baseline trial"
        if fresh_process:
            tolerance = max(tolerance, math.log(FRESH_PROCESS_TOLERANCE))
        if abs(off) > tolerance:
            problems.append(
                f"the final check measured the baseline settings at {_fmt_rate(float(final_base))} samples/s, "
                f"{baseline_label} at {_fmt_rate(float(baseline_samples_per_s))} samples/s ({ratio:.2f}x)"
            )
    if not problems:
        return None
    return (
        "The final check disagrees with earlier measurements of the same settings: "
        + "; and ".join(problems)
        + ". The machine's speed probably changed during the search (other jobs starting or stopping); "
        "re-run the search on a quieter machine before relying on these figures."
    )
