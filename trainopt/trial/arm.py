"""A live trial process ("arm") of an interleaved measurement session.

An arm builds its workload exactly as a one-shot trial does (the same device resolver,
memory cap, workload factory and knobs applied by ``measure.Trainer``), warms up once (discarded), calibrates how many
steps fill one window, and then waits for commands on its control socket. It never
writes anything the orchestrator reads to stdout or stderr; those go to the arm's log.

Messages are JSON objects, each carrying ``schema_version``:

orchestrator -> arm
    ``{"cmd": "start", "request": {...TrialRequest...}, "window_seconds": s, "rewarm_steps": k,
    "rewarm_share": f, "relocate": bool}``  (relocate: move weights and optimizer state to fresh
    memory before each window; rewarm_share: see ``rewarm_for``, default ``REWARM_SHARE``)
    ``{"cmd": "window"}``  run one timed window
    ``{"cmd": "finish"}``  report the final figures and exit
arm -> orchestrator
    ``{"kind": "alive"}``  sent at once after the fork (start-up cost is measured to it)
    ``{"kind": "ready", ...}``  warm-up done: window_steps, rewarm_steps, warmup_s, compile_s, peak memory, env, ...
    ``{"kind": "window", "elapsed_s", "steps", "samples", "data_wait_s", "last_loss", "rewarm_s", "cpu_s"}``
    ``{"kind": "final", "peak_memory_bytes", "steps"}``
    ``{"kind": "failed", "status", "error"}``  oom, nonfinite, error or not_applicable; the arm then exits

While the orchestrator runs another arm, this process and its loader workers are
stopped with SIGSTOP, so a paused arm uses no CPU; OpenMP threads that would otherwise
spin-wait after the last parallel region are stopped too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from trainopt.contract import slots
from trainopt.contract.protocol import SCHEMA_VERSION, TrialRequest
from trainopt.knobs import catalog as knobs
from trainopt.trial.applier import resolve_device
from trainopt.trial.faults import fault_status
from trainopt.trial.memory import PeakMemory, cap_memory

__all__ = ["serve", "send", "receive", "rewarm_for", "REWARM_SHARE", "REWARM_MIN_S"]

# Untimed re-warm steps run only while one step is at most this share of a window. The
# re-warm reloads what another arm evicted while this one was paused (caches, the
# allocator's free lists). Measured here (``benchmarks/rewarm.py``): a step taken cold
# after a pause exceeds a warm one by a few milliseconds at most (median +1 ms at a 63 ms
# step; +4 and -1 ms in two runs at 355 ms), about 1 % of a one-step window, while the re-warm step itself
# costs a whole step: from a quarter-window step on it adds 25-100 % to every window.
REWARM_SHARE = 0.25
# With steps of a few milliseconds (a GPU), one step re-warms too little: after a pause an
# accelerator's clocks and power state take tens of milliseconds to come back, not one
# step's worth. The re-warm then lasts at least this long (still within the share above);
# at the CPU demo's 60 ms steps it is the one step it was.
REWARM_MIN_S = 0.05


def send(conn: Connection, message: dict[str, Any]) -> None:
    """Write one JSON message (NaN/inf refused: they would not round-trip as JSON)."""
    conn.send_bytes(json.dumps({**message, "schema_version": SCHEMA_VERSION}, allow_nan=False).encode())


def receive(conn: Connection) -> dict[str, Any]:
    """Read one JSON message; a message of another schema version is refused."""
    message = json.loads(conn.recv_bytes())
    if message.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"control message has schema version {message.get('schema_version')!r}, expected {SCHEMA_VERSION}"
        )
    return message


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


def _cpu_set(pid: int) -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(pid))
    except (AttributeError, OSError):
        return None


def _children_cpu_sets() -> list[list[int]]:
    """The CPU affinity of each loader worker alive now (empty without workers)."""
    import psutil

    out = []
    for kid in psutil.Process().children(recursive=True):
        cpus = _cpu_set(kid.pid)
        if cpus is not None:
            out.append(cpus)
    return out


class _Arm:
    """The trainer of one arm and its counters."""

    def __init__(self, request: TrialRequest, window_seconds: float | None, rewarm_steps: int,
                 relocate: bool = False, rewarm_share: float = REWARM_SHARE):
        self.request = request
        self.rewarm_share = rewarm_share
        self.relocate = relocate
        self.window_seconds = window_seconds or request.spec["measure"]["window_seconds"]
        self.rewarm_steps = rewarm_steps
        self.trainer = None
        self.mem = None
        self.steps = 0
        self.window_steps = 0

    def setup(self) -> dict[str, Any]:
        """Build and warm up; returns the ``ready`` message or a ``failed`` one."""
        import torch

        from trainopt.trial import environment as fingerprint
        from trainopt.trial.measure import Trainer
        from trainopt.trial.workloads import build_workload

        request = self.request
        settings = dict(request.settings)
        device = resolve_device(request.spec.get("device", "auto"))
        env = fingerprint.environment(device)
        env["cpu_set"] = _cpu_set(os.getpid())
        reason = knobs.not_applicable_reason(settings, device.type) or slots.threads_reason(
            settings.get("threads"), slots.slot_cpus_from_env(os.environ))
        if reason:
            return {"kind": "failed", "status": "not_applicable", "error": reason}
        cap_memory(request.memory_gb, device)
        seed = int(request.spec.get("seed", 0))
        torch.manual_seed(seed)
        workload = build_workload(request.spec, Path(request.source_dir))
        reason = knobs.channels_last_reason(settings, workload.image_like)
        if reason:
            return {"kind": "failed", "status": "not_applicable", "error": reason}
        mem = PeakMemory(device)  # before the trainer, so the peak counts building it too
        trainer = Trainer(workload, settings, device, seed=seed)
        env["torch_threads"] = torch.get_num_threads()
        self.trainer, self.mem = trainer, mem
        return self._warm_up(env, device)

    def _host_read(self, i: int) -> None:
        # Read the loss on the host every sync_every steps, as a logging loop does.
        every = self.trainer.settings["sync_every"]
        if every and (i + 1) % every == 0:
            self.trainer.loss_value()

    def _warm_up(self, env: dict[str, Any], device) -> dict[str, Any]:
        cfg = self.request.spec["measure"]
        trainer, clock = self.trainer, time.perf_counter
        trainer.sync()
        start = clock()
        trainer.step()
        first_loss = trainer.loss_value()  # syncs: the first step's time includes any compilation
        first_step_s = clock() - start
        steps = 1
        after_first = clock()
        while steps < max(cfg["warmup_steps"], 2) or clock() - start < cfg["warmup_seconds"]:
            trainer.step()
            self._host_read(steps)
            steps += 1
        trainer.loss_value()
        typical = (clock() - after_first) / (steps - 1)
        warmup_s = clock() - start
        self.steps = steps
        self.window_steps = max(1, int(round(self.window_seconds / max(typical, 1e-9))))
        self.rewarm_steps = rewarm_for(typical, self.window_seconds, self.rewarm_steps, self.rewarm_share)
        self.mem.sample()
        # Where the loader workers may run (they inherit this process's affinity), read from
        # inside the trial so a slot's confinement is a measured fact, not an assumption.
        env["loader_cpu_sets"] = _children_cpu_sets()
        capacity, footprint = None, self.mem.peak()
        if device.type == "cuda":
            import torch

            # What other arms cannot use while this one is paused: the allocator's reservation.
            capacity = int(torch.cuda.mem_get_info(device)[1])
            footprint = int(torch.cuda.max_memory_reserved(device))
        return {
            "kind": "ready",
            "window_steps": self.window_steps,
            "rewarm_steps": self.rewarm_steps,
            "samples_per_step": trainer.samples_per_step,
            "warmup_s": warmup_s,
            "first_step_s": first_step_s,
            "compile_s": max(0.0, first_step_s - typical) if trainer.settings["compile"] != "off" else None,
            "first_loss": first_loss,
            "typical_step_s": typical,
            "peak_memory_bytes": self.mem.peak(),
            "footprint_bytes": footprint,
            "device_type": device.type,
            "device_capacity_bytes": capacity,
            "dataset_len": trainer.dataset_len,
            "env": env,
        }

    def window(self) -> dict[str, Any]:
        """One timed window of ``window_steps`` steps, after ``rewarm_steps`` untimed ones."""
        trainer, clock = self.trainer, time.perf_counter
        t = clock()
        if self.relocate and self.rewarm_steps:
            # Only with a re-warm step after it: the new pages' faults must not be timed.
            _relocate(trainer)
        for _ in range(self.rewarm_steps):
            # Untimed: the caches were another arm's while this one was paused.
            trainer.step()
        if self.rewarm_steps:
            trainer.loss_value()
        rewarm_s = clock() - t
        trainer.data_wait = 0.0
        trainer.sync()
        t0, c0 = clock(), time.process_time()
        for i in range(self.window_steps):
            trainer.step()
            self._host_read(i)
        trainer.sync()
        elapsed = clock() - t0
        # This process's CPU time over the window, all its threads together: against the wall
        # time x its threads, the share of the CPU it got (the machine check's evidence).
        cpu_s = time.process_time() - c0
        wait = trainer.data_wait
        # Outside the timed region: the loss check and the memory sample cost nothing measured.
        last_loss = trainer.loss_value()
        self.mem.sample()
        self.steps += self.rewarm_steps + self.window_steps
        return {
            "kind": "window",
            "elapsed_s": elapsed,
            "steps": self.window_steps,
            "samples": self.window_steps * trainer.samples_per_step,
            "data_wait_s": wait,
            "last_loss": last_loss,
            "rewarm_s": rewarm_s,
            "cpu_s": cpu_s,
        }

    def final(self) -> dict[str, Any]:
        return {"kind": "final", "peak_memory_bytes": self.mem.peak() if self.mem else None, "steps": self.steps}


def _relocate(trainer) -> None:
    """Give the model's weights, buffers and optimizer state fresh memory.

    A process keeps the physical pages of its weights (and, through the allocator's free
    lists, of its activations) for its whole life, so their cache placement is fixed per
    process. Copying the long-lived tensors and returning the freed heap pages to the
    kernel re-draws that placement before every window.
    """
    import ctypes

    import torch

    with torch.no_grad():
        for t in list(trainer.model.parameters()) + list(trainer.model.buffers()):
            t.data = t.data.clone()
        for state in trainer.optimizer.state.values():
            for key, value in list(state.items()):
                if torch.is_tensor(value):
                    state[key] = value.clone()
    with contextlib.suppress(OSError, AttributeError):
        # glibc only: madvise(DONTNEED) on every free chunk, so the next allocations fault in new pages.
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rewarm_for(typical_step_s: float, window_seconds: float, rewarm_steps: int,
               share: float = REWARM_SHARE, min_seconds: float = REWARM_MIN_S) -> int:
    """Re-warm steps before each window.

    ``rewarm_steps`` (0: none) while a step is at most ``share`` of a window, 0 for longer
    steps; raised, where that takes more steps, to cover ``min_seconds`` but no more than
    ``share`` of a window.
    """
    if rewarm_steps <= 0 or typical_step_s > share * window_seconds:
        return 0
    step = max(typical_step_s, 1e-9)
    raised = min(math.ceil(min_seconds / step), int(share * window_seconds / step))
    return max(rewarm_steps, raised)


def _failure(exc: BaseException) -> dict[str, Any]:
    from trainopt.trial.measure import NonFiniteLoss

    if isinstance(exc, NonFiniteLoss):
        return {"kind": "failed", "status": "nonfinite", "error": str(exc)}
    # The user's traceback goes to the arm's log; the result keeps its last line.
    traceback.print_exc()
    status, error = fault_status(exc)
    return {"kind": "failed", "status": status, "error": error}


def serve(fd: int) -> int:
    """Serve one arm on the control socket ``fd`` until ``finish``, a failure or EOF.

    Returns:
        The process exit code (0 after ``finish`` or a reported failure).
    """
    conn = Connection(fd)
    send(conn, {"kind": "alive", "pid": os.getpid()})
    arm: _Arm | None = None
    while True:
        try:
            msg = receive(conn)
        except EOFError:
            return 0  # the orchestrator went away; nothing left to report to
        cmd = msg.get("cmd")
        try:
            if cmd == "start":
                request = TrialRequest.from_json(json.dumps(msg["request"]))
                arm = _Arm(request, msg.get("window_seconds"), int(msg.get("rewarm_steps", 1)),
                           bool(msg.get("relocate", False)), float(msg.get("rewarm_share", REWARM_SHARE)))
                reply = arm.setup()
            elif cmd == "window" and arm is not None:
                reply = arm.window()
            elif cmd == "finish":
                send(conn, arm.final() if arm else {"kind": "final", "steps": 0})
                return 0
            else:
                reply = {"kind": "failed", "status": "error", "error": f"unexpected command {cmd!r}"}
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - every fault becomes a status
            reply = _failure(exc)
        reply = {k: (_finite(v) if isinstance(v, float) else v) for k, v in reply.items()}
        send(conn, reply)
        if reply["kind"] == "failed":
            sys.stdout.flush()
            return 0
