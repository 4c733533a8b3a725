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

``beside`` plants a context effect that no truth table can: an arm whose settings hold
every entry of ``settings`` runs at ``factor`` times its truth in a session that also has
an arm holding every entry of ``partner`` (say, the combined settings measured beside the
baseline). It takes no draw, so seeded runs without it stay as they were.

``step = (n, factor)`` changes the machine's speed in the middle of a search: every trial
and arm measured after the first ``n`` sessions runs at ``factor`` times its truth (a GPU's
clock or thermal limit moving). ``first_window`` makes every arm's first window run that
many times its later ones (a first window after warm-up can run 1.5x fast on a busy
machine), and ``early_cut`` retires arms round by round as the interleaved session runner
does, with its own rules (``session_plan.cuttable_arms`` and ``hopeless_arms``): a retired
arm's figure is taken over the windows it measured. None of them takes a draw, so seeded
runs without them stay as they were.

``skewed`` gives the arms of some settings a skewed extra draw, from a generator of its
own (so seeded runs without it stay as they were), with zero mean in log: ``mixture``
(+0.06 in 80 % of arms, -0.24 in 20 %), ``lognormal`` (a centred log-normal with a long
slow tail) or ``outliers`` (-0.45 in 10 %, +0.05 otherwise). ``SKEW_MEAN[shape]`` is the
mean of ``exp`` of that draw: the factor it adds to the arm's mean throughput.

Training-check runs (``mode="train"``) return a loss curve (``fake_losses``): the same
falling curve for every settings, with minibatch noise drawn from the run's data-order seed
(so runs in one order share it, as real runs from the same weights and batches do), plus
a tiny jitter of their own; ``trains`` plants settings that train ``worse`` (the loss stays
where it started) or turn ``nan`` at the fourth step. Their draws come from generators of
their own, so seeded runs stay as they were.

``offsets = (share, size)`` gives each arm of a session, with probability ``share``, a
persistent offset of ``size`` in log (a process that happens to run fast or slow all
through), the same for every configuration. ``drift = (rho, sd)`` makes each
configuration's speed wander as an AR(1) series over the sessions it runs in (lag-1
autocorrelation ``rho``, stationary log sd ``sd``), so the log-ratios of successive pairs
are serially dependent. Both take draws from generators of their own.

``tail`` sets the shape of every draw (``normal``, ``t3`` scaled to the same sd, or
``contaminated``: 90 % normal, 10 % five times wider, scaled to the same sd). Probes
(``mode="probe"``) fit while ``batch_size <= fits_up_to`` and report OOM above it;
``memory`` plants settings that take less (or more) memory per sample: ``{(knob, value):
factor}`` scales every trial's peak memory and the size that fits (``batch_size x factor
<= fits_up_to``), as autocast's lower activation memory does.
"""

from __future__ import annotations

import math
import random
import zlib
from pathlib import Path
from typing import Any, Callable, Mapping, Union

from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult

__all__ = ["FakeRunner", "MemoryStore", "SessionResult", "SKEW_MEAN", "noise_draw", "breakdown_of", "skew_draw",
           "fake_losses", "training_result"]

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


_LOGNORMAL_SIGMA = 0.8
_LOGNORMAL_SCALE = 0.08


def skew_draw(rng: random.Random, shape: str) -> float:
    """One draw of a skewed extra log-noise with mean zero (see the module docstring)."""
    if shape == "mixture":
        return 0.06 if rng.random() < 0.8 else -0.24
    if shape == "lognormal":
        return -_LOGNORMAL_SCALE * (math.exp(rng.gauss(0.0, _LOGNORMAL_SIGMA)) - math.exp(_LOGNORMAL_SIGMA**2 / 2))
    if shape == "outliers":
        return -0.45 if rng.random() < 0.1 else 0.05
    raise ValueError(f"unknown skew {shape!r}; use mixture, lognormal or outliers")


def _skew_mean(shape: str, n: int = 200_000) -> float:
    if shape == "mixture":
        return 0.8 * math.exp(0.06) + 0.2 * math.exp(-0.24)
    if shape == "outliers":
        return 0.9 * math.exp(0.05) + 0.1 * math.exp(-0.45)
    rng = random.Random(12345)
    return sum(math.exp(skew_draw(rng, shape)) for _ in range(n)) / n


# E[exp(draw)] per shape: how much the skewed draw moves an arm's mean throughput.
SKEW_MEAN = {shape: _skew_mean(shape) for shape in ("mixture", "lognormal", "outliers")}


def fake_losses(settings: Mapping[str, Any], order_seed: int, steps: int,
                trains: Mapping[tuple[str, Any], str] | None = None) -> list[float | None]:
    """A training run's loss at every step (see the module docstring)."""
    batches = random.Random(order_seed * 1_000_003 + 11)
    own = random.Random(zlib.crc32(repr(sorted((k, str(v)) for k, v in settings.items())).encode()))
    planted = {how for (knob, value), how in (trains or {}).items() if settings.get(knob) == value}
    out: list[float | None] = []
    for k in range(steps):
        noise = 0.05 * batches.gauss(0, 1) + 1e-4 * own.gauss(0, 1)
        if "nan" in planted and k >= 3:
            out.append(None)
            break
        level = 2.3 if "worse" in planted else 2.3 * math.exp(-3.0 * k / steps)
        out.append(level + noise)
    return out


def training_result(request: TrialRequest, trains: Mapping[tuple[str, Any], str] | None = None) -> TrialResult:
    """A training-check run's result, as the worker's ``train`` mode writes it."""
    t = request.training or {}
    losses = fake_losses(request.settings, int(t.get("order_seed", 0)), int(t.get("steps", 0)), trains)
    status = "ok"
    return TrialResult(status=status, settings=request.settings, mode="train", env=ENV, dataset_len=4096,
                       training={"losses": losses, "scaler_skipped": None, "order_seed": t.get("order_seed")})


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
        beside: ``[(settings, partner, factor), ...]``: context effects inside sessions
            (see the module docstring).
        step: ``(sessions, factor)``: the machine's speed changes after that many sessions.
        first_window: Speed of every arm's first window relative to its later ones.
        early_cut: Retire far-slower arms as the interleaved session runner does.
        skewed: ``{(knob, value): shape}``: arms holding that value get a skewed extra
            draw in sessions (see the module docstring).
        trains: ``{(knob, value): "worse" | "nan"}``: training-check runs holding that value
            train worse or turn non-finite (see the module docstring).
        offsets: ``(share, size)``: planted per-process offsets (see the module docstring).
        drift: ``(rho, sd)``: each configuration's AR(1) drift over sessions.
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
        beside: list[tuple[Mapping[str, Any], Mapping[str, Any], float]] | None = None,
        step: tuple[int, float] | None = None,
        first_window: float = 1.0,
        early_cut: bool = False,
        skewed: Mapping[tuple[str, Any], str] | None = None,
        trains: Mapping[tuple[str, Any], str] | None = None,
        offsets: tuple[float, float] | None = None,
        drift: tuple[float, float] | None = None,
        memory: Mapping[tuple[str, Any], float] | None = None,
    ):
        self.trains = dict(trains or {})
        self.offsets, self.drift = offsets, drift
        self.offset_rng = random.Random(seed * 104729 + 3)
        self.drift_rng = random.Random(seed * 15485863 + 5)
        self._drift_state: dict[str, float] = {}
        self.step, self.first_window, self.early_cut = step, first_window, early_cut
        self.memory = dict(memory or {})
        self.effects = dict(effects or {})
        self.beside = list(beside or [])
        self.skewed = dict(skewed or {})
        self.skew_rng = random.Random(seed * 7919 + 17)
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

    def memory_factor(self, settings: dict[str, Any]) -> float:
        """Memory per sample of these settings relative to the plain ones (``memory``)."""
        factor = 1.0
        for (knob, value), f in self.memory.items():
            if settings.get(knob) == value:
                factor *= f
        return factor

    def peak(self, settings: dict[str, Any]) -> int:
        """The peak memory a trial of these settings reports."""
        return int(settings.get("batch_size", 1) * 2**20 * self.memory_factor(settings))

    def context(self, settings: dict[str, Any], others: list[dict[str, Any]]) -> float:
        """The factor of the ``beside`` effects on an arm of ``settings`` in a session with arms of ``others``."""
        def holds(s: dict[str, Any], part: Mapping[str, Any]) -> bool:
            return all(s.get(k) == v for k, v in part.items())

        factor = 1.0
        for mine, partner, f in self.beside:
            if holds(settings, mine) and any(holds(o, partner) for o in others):
                factor *= f
        return factor

    def machine_speed(self, before: int = 0) -> float:
        """The machine's speed now (``step``): 1 until ``step[0]`` sessions have run (``before``: the current one among them)."""
        if self.step is None:
            return 1.0
        return self.step[1] if len(self.sessions) - before >= self.step[0] else 1.0

    def _planted(self, settings: dict[str, Any]) -> float:
        """This arm's planted offset and its configuration's drift (0 when neither is set)."""
        extra = 0.0
        if self.offsets is not None and self.offset_rng.random() < self.offsets[0]:
            extra += self.offsets[1]
        if self.drift is not None:
            rho, sd = self.drift
            key = repr(sorted(settings.items(), key=lambda kv: kv[0]))
            prev = self._drift_state.get(key)
            step = self.drift_rng.gauss(0.0, sd)
            x = step if prev is None else rho * prev + math.sqrt(1.0 - rho * rho) * step
            self._drift_state[key] = x
            extra += x
        return extra

    def _cut(self, requests: list[TrialRequest], arms: list[TrialResult]) -> list[TrialResult]:
        """The arms' first windows at ``first_window``, and the early cut applied round by round."""
        from trainopt.decide.session_plan import cuttable_arms, hopeless_arms
        from trainopt.stats.intervals import steady_state

        for a in arms:
            if a.ok and a.windows:
                a.windows = [a.windows[0] * self.first_window, *a.windows[1:]]
        cuttable = cuttable_arms([r.trial_id for r in requests], [r.settings for r in requests])
        retired: dict[int, int] = {}
        rounds = max((len(a.windows) for a in arms if a.ok), default=0)
        for r in range(1, rounds + 1):
            so_far = [a.windows[:retired.get(i, r)] if a.ok else [] for i, a in enumerate(arms)]
            for i in hopeless_arms(so_far, cuttable) if self.early_cut else []:
                retired.setdefault(i, r)
        for i, a in enumerate(arms):
            if a.ok:
                a.windows = a.windows[:retired.get(i, len(a.windows))]
                # As the session runner reads an arm: the steady windows (MSER cut), and with
                # fixed samples per window the figure is their harmonic mean.
                a.steady_from = steady_state(a.windows).start
                kept = a.windows[a.steady_from:]
                a.samples_per_s = len(kept) / sum(1.0 / w for w in kept)
        return arms

    def _failure(self, request: TrialRequest) -> TrialResult | None:
        s = request.settings
        if s.get("batch_size", 0) * self.memory_factor(s) > self.fits_up_to:
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
            step_time_s=batch / speed, data_wait_fraction=self.wait, peak_memory_bytes=self.peak(s),
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
            return TrialResult(status="ok", settings=s, mode="probe", peak_memory_bytes=self.peak(s),
                               env=ENV, dataset_len=4096)
        if request.mode == "train":
            return training_result(request, self.trains)
        noise = noise_draw(self.rng, self.process_sd, self.tail)
        return self._measured(request, self.truth(s) * self.machine_speed() * math.exp(noise))

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
            truth = self.truth(request.settings)
            if self.beside:
                truth *= self.context(request.settings, [r.settings for r in requests if r is not request])
            for (knob, value), shape in self.skewed.items():
                if request.settings.get(knob) == value:
                    noise += skew_draw(self.skew_rng, shape)
            noise += self._planted(request.settings)
            arms.append(self._measured(request, truth * self.machine_speed(before=1) * math.exp(noise)))
        if self.first_window != 1.0 or self.early_cut:
            arms = self._cut(requests, arms)
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


def simulated_search(spec: Any, out_dir: Path, runner: Any, *, guard: bool = True, store: Any = None, **kw: Any) -> Any:
    """A ``Search`` as the CLI builds it, over a fake runner: the real decision code.

    Args:
        spec: The experiment spec.
        out_dir: The search's output folder.
        runner: The runner (usually a ``FakeRunner``).
        guard: Give it the CLI's stability guard (``StabilityGuard()``); False: none.
        store: The trial store (default: a fresh ``MemoryStore``).
        **kw: More ``Search`` arguments (``rule``, ...).

    The guard's waits for the machine to settle take no time.
    """
    from trainopt.decide.stability import StabilityGuard
    from trainopt.search.search import Search

    search = Search(spec, out_dir, runner, store if store is not None else MemoryStore(),
                    guard=StabilityGuard() if guard else None, **kw)
    search.broker.sleep = lambda seconds: None
    return search
