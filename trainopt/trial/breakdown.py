"""Where a training step's time goes: a profiled window run after the timed ones.

``profile_steps`` runs more real training steps once the timed windows are over (never
inside them, so the throughput figures are those of plain training) and times each phase
of every step (``trainopt.stats.phases.PHASES``): the wait inside ``next()`` on the loader,
the copies to the device, forward and loss, backward, the optimizer update, and the host
read of the loss that ``sync_every`` asks for. On a CPU the work is synchronous, so the
clock at each phase edge says where the time went. On CUDA the host only queues work, so
the profiled window synchronizes the device at every phase edge, which makes wall time
attributable to the phase whose work ran; a second, short pass without those
synchronizations then measures under ``torch.profiler`` how much of its wall time the
device was busy (``device_busy``): a device that idles while the host launches work is
host-bound, whatever the phases say. NVML's utilization and memory figures are added
where ``pynvml`` (the optional ``nvidia-ml-py``) can be imported.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable, Iterable

from trainopt.stats.phases import PHASES, covered_seconds, phase_shares
from trainopt.trial.measure import host_read

__all__ = [
    "PhaseTimer",
    "profile_steps",
    "profile_or_none",
    "device_intervals",
    "device_busy",
    "nvml_figures",
    "breakdown_steps",
]


class PhaseTimer:
    """Adds up the seconds of each phase of the training step.

    The step calls ``start(phase)`` at every phase edge (starting a phase ends the one
    before it, with a single clock read) and ``stop()`` after the last. With ``sync`` (a
    CUDA device) the device is synchronized at every edge first, so the time charged to a
    phase is that of the work it queued, not of work queued before it.

    Args:
        clock: The time source.
        sync: Waits for queued device work, or None where work is synchronous.

    Attributes:
        seconds: Seconds per named phase (every phase of ``PHASES`` but ``other``).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, sync: Callable[[], None] | None = None):
        self.seconds = dict.fromkeys(PHASES[:-1], 0.0)
        self._clock = clock
        self._sync = sync
        self._open: str | None = None
        self._since = 0.0

    def start(self, phase: str) -> None:
        """Begin ``phase``, ending the one open now."""
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r}; known: {', '.join(self.seconds)}")
        if self._sync is not None:
            self._sync()
        now = self._clock()
        if self._open is not None:
            self.seconds[self._open] += now - self._since
        self._open, self._since = phase, now

    def stop(self) -> None:
        """End the open phase (nothing when none is open)."""
        if self._open is None:
            return
        if self._sync is not None:
            self._sync()
        self.seconds[self._open] += self._clock() - self._since
        self._open = None


def breakdown_steps(measure: dict[str, Any], window_steps: int) -> int:
    """Steps of the profiled window: ``measure.breakdown_steps``, or one timed window's when null (0: none)."""
    steps = measure.get("breakdown_steps")
    return int(window_steps) if steps is None else int(steps)


def device_intervals(events: Iterable[Any], device_kind: Any) -> list[tuple[float, float]]:
    """``(start, end)`` in seconds of every event that ran on the device.

    Args:
        events: Profiler events (``torch.profiler.profile.events()``), each with
            ``device_type`` and ``time_range.start`` / ``time_range.end`` in microseconds.
        device_kind: The ``device_type`` of events that ran on the device
            (``torch.autograd.DeviceType.CUDA``); host-side events are left out.

    Returns:
        The intervals of kernels and of copies and fills on the device alike: the host waits
        for either, and a device with nothing queued is idle either way.
    """
    out = []
    for event in events:
        if event.device_type != device_kind:
            continue
        start, end = float(event.time_range.start), float(event.time_range.end)
        if end > start:
            out.append((start / 1e6, end / 1e6))
    return out


def _cuda_profiler():
    from torch.profiler import ProfilerActivity, profile

    return profile(activities=[ProfilerActivity.CUDA])


def _note(message: str) -> None:
    # The trial's stdout and stderr go to its log; the result file carries the figures.
    print(f"trainopt.trial.breakdown: {message}", file=sys.stderr, flush=True)


def device_busy(trainer: Any, steps: int, clock: Callable[[], float] = time.perf_counter,
                profiler: Callable[[], Any] = _cuda_profiler) -> float | None:
    """The device's busy share of the wall time of ``steps`` steps run as in training.

    No synchronization inside the pass: the host runs ahead as it does in the timed windows,
    and the profiler records when the device ran something. The steps run even when the
    profiler cannot start, so every rank of a data-parallel job runs the same steps.

    Args:
        trainer: The configured training step (``trainopt.trial.measure.Trainer``).
        steps: Steps in the pass.
        clock: The time source.
        profiler: Makes the profiler (a context manager with ``events()``); injectable for tests.

    Returns:
        The covered share of the pass's wall time (at most 1), or None when the profiler
        could not run or recorded nothing.
    """
    import torch

    try:
        prof = profiler()
        prof.__enter__()
    except Exception as exc:  # noqa: BLE001 - no busy share, the breakdown still stands
        _note(f"device_busy not measured: the profiler did not start ({type(exc).__name__}: {exc})")
        prof = None
    try:
        trainer.sync()
        t0 = clock()
        for _ in range(steps):
            trainer.step(clock)
            host_read(trainer)
        trainer.sync()
        wall = clock() - t0
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
    if prof is None or not wall > 0:
        return None
    try:
        busy = covered_seconds(device_intervals(prof.events(), torch.autograd.DeviceType.CUDA))
    except Exception as exc:  # noqa: BLE001
        _note(f"device_busy not measured: the profiler's events could not be read ({type(exc).__name__}: {exc})")
        return None
    if busy <= 0:
        _note("device_busy not measured: the profiler recorded no device activity")
        return None
    # The profiler's clock and this one are not the same clock; a covered span a hair
    # longer than the wall time is still a device busy all the time.
    return min(1.0, busy / wall)


def _nvml_handle(pynvml: Any, device: Any):
    """NVML's handle on ``device``, honouring CUDA_VISIBLE_DEVICES (NVML numbers every GPU)."""
    index = device.index if device.index is not None else 0
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    chosen = visible[index]
    if chosen.isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(chosen))
    return pynvml.nvmlDeviceGetHandleByUUID(chosen)


def nvml_figures(device: Any) -> tuple[float | None, int | None]:
    """NVML's utilization (a share of its last sample period) and used memory of ``device``.

    Returns:
        ``(gpu_utilization, gpu_memory_used_bytes)``; both None off CUDA, without ``pynvml``,
        or when NVML answers with an error.
    """
    if getattr(device, "type", None) != "cuda":
        return None, None
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no NVML figures, nothing else lost
        _note(f"NVML not available: {type(exc).__name__}: {exc}")
        return None, None
    try:
        handle = _nvml_handle(pynvml, device)
        utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
        used = int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        return utilization, used
    except Exception as exc:  # noqa: BLE001
        _note(f"NVML figures not read: {type(exc).__name__}: {exc}")
        return None, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down a library that did answer
            pass


def profile_steps(trainer: Any, steps: int, clock: Callable[[], float] = time.perf_counter, group: Any = None,
                  busy_steps: int | None = None, profiler: Callable[[], Any] = _cuda_profiler) -> dict[str, Any]:
    """Run ``steps`` more training steps with each phase timed; call it after the timed windows.

    Args:
        trainer: The configured training step (``trainopt.trial.measure.Trainer``), warm.
        steps: Steps in the profiled window.
        clock: The time source.
        group: For a data-parallel trial, the rank's ``trainopt.trial.ddp_rank.RankGroup``: every
            rank starts the window at a barrier. Under DDP the gradients' all-reduce runs
            inside backward, so a rank that waits for its peers shows it in ``backward``.
        busy_steps: Steps of the CUDA pass that measures ``device_busy`` (default: a quarter
            of ``steps``, at least 1).
        profiler: Makes the CUDA profiler; injectable for tests.

    Returns:
        The ``TrialResult.breakdown`` figures: ``steps``, ``wall_s``, ``seconds`` and ``shares``
        per phase (shares summing to 1), ``device_type``, ``device_busy`` (None on a CPU),
        ``gpu_utilization`` and ``gpu_memory_used_bytes`` (None without NVML).
    """
    if steps < 1:
        raise ValueError(f"the profiled window needs at least one step, not {steps}")
    cuda = trainer.device.type == "cuda"
    timer = PhaseTimer(clock, trainer.sync if cuda else None)
    trainer.sync()
    if group is not None:
        group.barrier()
    t0 = clock()
    for _ in range(steps):
        trainer.step(clock, phases=timer)
        timer.start("loss_read")
        host_read(trainer)
        timer.stop()
    trainer.sync()
    wall = clock() - t0
    shares = phase_shares(timer.seconds, wall)
    seconds = dict(timer.seconds)
    seconds["other"] = max(0.0, wall - sum(seconds.values()))
    busy = utilization = used = None
    if cuda:
        busy = device_busy(trainer, busy_steps or max(1, steps // 4), clock, profiler)
        # Right after the unsynchronized pass: NVML's sample covers training as it runs.
        utilization, used = nvml_figures(trainer.device)
    return {
        "steps": steps,
        "wall_s": wall,
        "seconds": seconds,
        "shares": shares,
        "device_type": trainer.device.type,
        "device_busy": busy,
        "gpu_utilization": utilization,
        "gpu_memory_used_bytes": used,
    }


def profile_or_none(trainer: Any, measure: dict[str, Any], window_steps: int, group: Any = None) -> dict[str, Any] | None:
    """``profile_steps`` for a diagnosed trial; None, with the reason in the trial's log, when it fails.

    The timed windows are over and their figures are kept whatever happens here.

    Args:
        trainer: The trainer the timed windows ran.
        measure: The spec's ``measure`` section (``breakdown_steps``: null is one window, 0 none).
        window_steps: Steps in one timed window.
        group: The rank's group in a data-parallel trial.
    """
    steps = breakdown_steps(measure, window_steps)
    if steps == 0:
        return None
    try:
        return profile_steps(trainer, steps, group=group)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a failed profile must not cost the measurement
        import traceback

        traceback.print_exc()
        _note(f"no breakdown: the profiled window failed ({type(exc).__name__}: {exc}); the timed windows' figures stand")
        return None
