"""Executors: where and how many measurement sessions run at once.

The broker hands a batch of independent sessions (``SessionJob``) to an executor and
gets one ``SessionResult`` per job back, in job order. ``SerialExecutor`` runs them one
after another with any ``SessionRunner``; ``SlotExecutor`` runs up to one session per
slot of this machine at once (``--parallel N``); ``ray_executor.RayExecutor`` places them
on a Ray cluster (``--ray``).

Every arm's result records where it ran: ``env["slot"]``, ``env["node"]`` and
``env["device"]``.

Orchestrator side: no torch here.
"""

from __future__ import annotations

import os
import queue
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from trainopt.atomic import write_json_atomic
from trainopt.contract import slots as slotplan
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult, SessionRunner
from trainopt.contract.slots import Slot
from trainopt.execute.session_runners import InterleavedSessionRunner

__all__ = ["SessionJob", "SessionExecutor", "SerialExecutor", "SlotExecutor", "SlotThread", "record_placement",
           "record_local", "FingerprintCheck", "local_device", "MachineFlag"]


@dataclass(frozen=True)
class MachineFlag:
    """The machine check's latest verdict, as a session runner in another process reads it.

    A Ray slot's runner cannot sample this machine's probe, so each session it is given
    carries the probe's verdict at the moment the session was handed out.

    Attributes:
        busy_now: The launcher's latest machine sample said busy.
    """

    busy_now: bool


@dataclass(frozen=True)
class SessionJob:
    """One session to run: its arms, in order.

    Attributes:
        requests: The arms' requests, in arm order.
        log_paths: One log per arm (local paths under the output folder).
        timeout_s: Per-arm time limit, as ``SessionRunner.run_session`` takes it.
        seed: Randomises the arm order inside the session.
    """

    requests: list[TrialRequest]
    log_paths: list[Path]
    timeout_s: float
    seed: int


class SessionExecutor(Protocol):
    """Runs batches of independent sessions."""

    slots: int  # sessions that can run at once

    def run_many(self, jobs: list[SessionJob], exclusive: bool = False) -> list[SessionResult]:
        """One result per job, in job order; ``exclusive``: no other session beside each job."""
        ...

    def close(self) -> None: ...


def local_device(device_type: str | None, environ: Mapping[str, str] | None = None) -> str:
    """``env["device"]`` for a trial run unpinned on this machine: ``cpu:0-7`` or ``cuda[:ids]``."""
    environ = os.environ if environ is None else environ
    if device_type == "cuda":
        visible = slotplan.parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
        return f"cuda:{','.join(visible)}" if visible else "cuda"
    try:
        return f"cpu:{slotplan.cpu_list_text(sorted(os.sched_getaffinity(0)))}"
    except (AttributeError, OSError):
        return "cpu"


def record_placement(result: SessionResult, *, slot: int, node: str, device: str | None,
                     requests: Sequence[TrialRequest] | None = None,
                     span: tuple[float, float] | None = None) -> SessionResult:
    """Write slot, node and device into every arm's ``env`` (and into its result file).

    Args:
        result: The session's result (changed in place and returned).
        slot: The slot's number.
        node: Host name or Ray node id.
        device: ``cuda:3`` / ``cpu:0-3``; None: derived from each arm's device type.
        requests: The session's requests: each arm's result file at ``result_path`` is
            rewritten with the placement when it exists, so the file and the returned
            result agree.
        span: When the session started and ended on its slot (Unix seconds), kept as
            ``env["session_span"]``: which sessions ran side by side can be read back.
    """
    for i, arm in enumerate(result.arms):
        arm.env = {**(arm.env or {}), "slot": slot, "node": node,
                   "device": device or local_device(arm.env.get("device_type") if arm.env else None)}
        if span is not None:
            arm.env["session_span"] = [round(span[0], 3), round(span[1], 3)]
        if requests is not None and Path(requests[i].result_path).exists():
            write_json_atomic(requests[i].result_path, arm.to_dict())
    return result


def record_local(result: TrialResult) -> TrialResult:
    """Node and device of a trial run outside every slot (baseline, batch probes), in its ``env``.

    Such a trial runs alone on this machine, unpinned, so its ``slot`` is None and its
    device is this process's cores (or visible GPUs). Values the trial already has are kept.
    """
    env = result.env if result.env is not None else {}
    env.setdefault("slot", None)
    env.setdefault("node", socket.gethostname())
    env.setdefault("device", local_device(env.get("device_type")))
    result.env = env
    return result


class FingerprintCheck:
    """Compares the environment of every slot's trials with the first slot that reported.

    The fingerprint comes from inside the trials themselves (their ``env``), so it costs
    nothing extra and describes what really ran. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._first: tuple[str, dict[str, Any]] | None = None
        self._seen: set[str] = set()

    def check(self, name: str, result: SessionResult) -> None:
        """Raise ``slots.SlotError`` if this slot's trials ran on a different environment."""
        env = next((a.env for a in result.arms if a.env and a.env.get("torch")), None)
        if env is None:
            return
        with self._lock:
            if self._first is None:
                self._first = (name, dict(env))
                self._seen.add(name)
                return
            if name in self._seen:
                return
            slotplan.check_alike([self._first[1], env], names=[self._first[0], name])
            self._seen.add(name)


class SerialExecutor:
    """One session at a time with any ``SessionRunner``, on this machine: ``slots == 1``.

    Args:
        session_runner: Runs one session.
    """

    slots = 1

    def __init__(self, session_runner: SessionRunner):
        self.session_runner = session_runner
        self.node = socket.gethostname()

    def attach_machine(self, probe: Any) -> None:
        """Let the session runner read the machine check (its early cut holds while the machine is busy)."""
        if hasattr(self.session_runner, "machine"):
            self.session_runner.machine = probe

    def run_many(self, jobs: list[SessionJob], exclusive: bool = False) -> list[SessionResult]:
        results = []
        for job in jobs:
            t0 = time.time()
            result = self.session_runner.run_session(job.requests, job.log_paths, job.timeout_s, job.seed)
            results.append(record_placement(result, slot=0, node=self.node, device=None, requests=job.requests,
                                            span=(t0, time.time())))
        return results

    def close(self) -> None:
        close = getattr(self.session_runner, "close", None)
        if close is not None:
            close()


class SlotThread:
    """A long-lived thread that runs one slot's sessions (here, and in a Ray slot's actor).

    Long-lived because the fork server dies with the *thread* that started it (Linux's
    parent-death signal follows the creating thread), and because its affinity is set
    once: every process started from this thread (fork server, arms, loader workers,
    fallback trial processes) inherits the slot's cores.

    Args:
        slot: The slot whose cores the thread is pinned to.
        session_runner: Runs the slot's sessions; closed with the thread.
    """

    def __init__(self, slot: Slot, session_runner: SessionRunner):
        self.slot = slot
        self.session_runner = session_runner
        self.inbox: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.start_error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name=f"trainopt-slot-{slot.index}", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        if self.slot.cpus:
            try:
                os.sched_setaffinity(0, self.slot.cpus)  # 0: this thread only
            except OSError as exc:
                # Reported by the first session given to this slot, never run unpinned.
                self.start_error = slotplan.SlotError(
                    f"slot {self.slot.index}: cannot pin to cores {slotplan.cpu_list_text(self.slot.cpus)} ({exc})")
        while True:
            task = self.inbox.get()
            if task is None:
                return
            task()

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join(timeout=60)
        close = getattr(self.session_runner, "close", None)
        if close is not None:
            close()


class SlotExecutor:
    """Up to one session per slot of this machine at once (``--parallel N``).

    Each slot has its own session runner (its own fork server), pinned to the slot's
    cores or GPU, with thread counts set to the slot's cores. Sessions are taken from one
    queue by whichever slot is free, so a slow session does not hold up the others.

    Args:
        parallel: Number of slots.
        device: The spec's ``device`` (GPU slots where it can be CUDA and GPUs are visible).
        rounds, window_seconds, rewarm_steps, env: Passed to each slot's
            ``InterleavedSessionRunner`` (``env`` is merged under the slot's own variables).
        runner_factory: Builds a slot's session runner instead (tests, other session runners).
        cpus: The cores to split (default: this process's affinity).
        gpus: The GPU ids to hand out (default: ``slots.detect_gpus()``).

    Raises:
        slots.SlotError: More slots than cores or GPUs.
    """

    def __init__(self, parallel: int, *, device: str = "auto", rounds: int | None = None,
                 window_seconds: float | None = None, rewarm_steps: int = 1, env: Mapping[str, str] | None = None,
                 runner_factory: Callable[[Slot], SessionRunner] | None = None,
                 cpus: Sequence[int] | None = None, gpus: Sequence[str] | None = None):
        cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
        gpus = slotplan.detect_gpus() if gpus is None else list(gpus)
        self.plan = slotplan.plan_slots(parallel, cpus, gpus, device)
        self.slots = len(self.plan)
        self.node = socket.gethostname()
        base_env = dict(env or {})
        # The slots share the host's RAM: each session's arms may fill only its slot's share
        # of it side by side before the session measures them one at a time instead.
        ram_share = _host_ram() // self.slots if self.slots > 1 else None

        def default_factory(slot: Slot) -> SessionRunner:
            return InterleavedSessionRunner(rounds=rounds, window_seconds=window_seconds, rewarm_steps=rewarm_steps,
                                            env={**base_env, **slot.env()}, cpus=list(slot.cpus) or None,
                                            host_ram_bytes=ram_share)

        factory = runner_factory or default_factory
        self._threads = [SlotThread(slot, factory(slot)) for slot in self.plan]
        self.fingerprints = FingerprintCheck()
        self._closed = False

    def attach_machine(self, probe: Any) -> None:
        """Let every slot's session runner read the machine check (the slots' own processes are the search's)."""
        for slot_thread in self._threads:
            if hasattr(slot_thread.session_runner, "machine"):
                slot_thread.session_runner.machine = probe

    def run_many(self, jobs: list[SessionJob], exclusive: bool = False) -> list[SessionResult]:
        """Run the jobs on the free slots; with ``exclusive``, one at a time on slot 0, the rest idle."""
        if self._closed:
            raise RuntimeError("run_many after close")
        pending: queue.Queue[int] = queue.Queue()
        for i in range(len(jobs)):
            pending.put(i)
        results: list[SessionResult | None] = [None] * len(jobs)
        errors: list[BaseException] = []
        abort = threading.Event()
        slot_threads = self._threads[:1] if exclusive else self._threads
        finished = threading.Semaphore(0)

        def drain(slot_thread: SlotThread) -> Callable[[], None]:
            slot = slot_thread.slot

            def task() -> None:
                try:
                    if slot_thread.start_error is not None:
                        raise slot_thread.start_error
                    while not abort.is_set():
                        try:
                            i = pending.get_nowait()
                        except queue.Empty:
                            return
                        job = jobs[i]
                        t0 = time.time()
                        result = slot_thread.session_runner.run_session(job.requests, job.log_paths, job.timeout_s,
                                                                        job.seed)
                        record_placement(result, slot=slot.index, node=self.node,
                                         device=slot.device if slot.cpus or slot.gpu else None,
                                         requests=job.requests, span=(t0, time.time()))
                        self.fingerprints.check(f"slot {slot.index}", result)
                        results[i] = result
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    errors.append(exc)
                    abort.set()
                finally:
                    finished.release()
            return task

        for slot_thread in slot_threads:
            slot_thread.inbox.put(drain(slot_thread))
        try:
            for _ in slot_threads:
                while not finished.acquire(timeout=0.5):
                    pass
        except BaseException:
            # Ctrl-C / SIGTERM in the caller: stop taking jobs and end the sessions in flight
            # (closing a session runner ends its fork server, and the fork server's arms die with it).
            abort.set()
            self._stop_session_runners()
            raise
        if errors:
            raise errors[0]
        lost = [i for i, r in enumerate(results) if r is None]
        if lost:
            raise RuntimeError(f"sessions {lost} returned no result")
        return results  # type: ignore[return-value]

    def _stop_session_runners(self) -> None:
        for slot_thread in self._threads:
            close = getattr(slot_thread.session_runner, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - best effort while interrupted
                    pass

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for slot_thread in self._threads:
            slot_thread.close()

    def __enter__(self) -> "SlotExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _host_ram() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
