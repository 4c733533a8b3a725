"""Measurement sessions: several configurations ("arms") measured together.

A fresh trial process per measurement carries a persistent offset of its own (thread
placement, memory layout, the machine's load at that moment), so two fresh processes of
the same settings differ by far more than the windows inside either suggest. A session
keeps one live process per arm instead, all warm, and alternates short timed windows
between them in a randomised order per round: load bursts hit every arm alike and cancel
in their ratio, and each arm pays its start-up and compile once.

Only one arm runs at a time; the others are stopped with SIGSTOP on their whole process
group (the arm and its DataLoader workers), so a paused arm takes no CPU and cannot
spin-wait next to the running one. Where the arms cannot live side by side (their
measured peaks do not fit the device, or the host RAM, together) the session falls back
to one fresh process per arm, run one after another, and says so in ``note``.

This module is the orchestrator side and never imports torch: the arms are forked from
``trainopt.trial.forkserver`` (which has torch imported) and run ``trainopt.trial.arm``.

Per-process offsets, and what this design does about each:

- OpenMP spin-waiting: an idle arm's OpenMP threads spin after their last parallel
  region and steal the core from the running arm. Removed: paused arms are SIGSTOPped,
  and ``pause`` waits until every process of the group has actually stopped.
- Address-space layout, hash seed, allocator state, import order: a fresh process draws
  all of these anew. Arms forked from one launcher inherit the same image and malloc
  state and allocate in the same order, so same-settings arms get the same layout.
  ``aslr=False`` also fixes the layout across launchers.
- Thread and core placement: left to the scheduler by default; ``cpus=`` pins every arm
  (its threads and loader workers inherit) to the same CPUs, and ``env={"OMP_PROC_BIND":
  ...}`` fixes OpenMP thread placement. Not default: pinning loader workers onto the
  compute cores changes what is measured, and on a shared machine the pinned cores may be
  the busy ones.
- ``OMP_WAIT_POLICY``: inherited, not forced to PASSIVE. With paused arms stopped, the
  remaining effect of the policy is on the running arm itself, i.e. on the figure the
  user's own training gets; forcing it would measure a different configuration.
- Cache state after a pause: each window is preceded by ``rewarm_steps`` untimed steps,
  so every arm starts its window with its own working set loaded, whichever arm ran
  before it. Arms whose step is longer than a quarter of a window skip them
  (``arm.rewarm_for``): the refill, measured at a few milliseconds, is then about 1 % of
  the window, and the untimed step would add 25-100 % to its cost.
"""

from __future__ import annotations

import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from trainopt.atomic import write_json_atomic
from trainopt.contract.boundary import COMPILER_PRELOAD, FORKSERVER_MODULE, FORKSERVER_PARENT_VAR, child_environment
from trainopt.contract.protocol import SCHEMA_VERSION, TrialRequest, TrialResult
from trainopt.execute.runner import Runner, SubprocessRunner, classify_exit
from trainopt.stats import intervals as stats

__all__ = [
    "SessionResult",
    "SessionRunner",
    "SequentialSessionRunner",
    "InterleavedSessionRunner",
    "round_orders",
    "sequential_order",
    "start_order",
    "fallback_reason",
    "window_timeout",
    "classify_reply",
    "arm_result",
    "CUDA_HEADROOM",
    "RAM_HEADROOM",
    "HOPELESS",
    "hopeless_arms",
    "arm_preload",
]

# Share of the device's memory the arms' peaks may fill together: the caching allocator
# and the CUDA context need room beyond what max_memory_reserved shows.
CUDA_HEADROOM = 0.9
# Share of the host's RAM the arms' peak resident sets may fill together: paused arms stay
# resident, and a session that pushes the machine into swap measures the swap, not the arms.
RAM_HEADROOM = 0.7
# An arm whose first window runs below this share of the incumbent's rate measures no
# further windows: no later window can lift it to a win (the search's screen gate is 0.98),
# and a slow arm's windows are the session's most expensive ones (bf16 on a CPU without
# bf16 units: 0.08x). Half, not more: the incumbent's own first window can run 1.5x its
# later ones on a busy machine, and a fair competitor must never be cut on that.
HOPELESS = 1 / 2


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


# ---- decisions (pure) ------------------------------------------------------------------


def sequential_order(n: int, seed: int) -> list[int]:
    """A seeded random order of ``n`` arms, for running them one after another."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def start_order(n: int, seed: int) -> list[int]:
    """The order in which a session forks and warms up its arms: a seeded permutation.

    Arm 0 is the incumbent, and a fixed start order would hand every candidate the same
    place in the launcher's fork sequence and the same turn in the warm-up (after the
    incumbent, beside its held memory). 146 real A/A sessions on 2-core machines, pooled, put
    the second-started arm 1.6 % ahead of the first (2.1 standard errors): small, but a
    bias of one sign in every pair moves every confirmation the same way. Drawing the order
    per session makes whatever start position does symmetric noise, which the rule's
    intervals already allow for. The stream is separate from ``round_orders``' so the
    start order says nothing about the first round's.
    """
    order = list(range(n))
    random.Random(f"start/{seed}").shuffle(order)
    return order


def round_orders(n: int, rounds: int, seed: int) -> list[list[int]]:
    """The arm order of every round: randomised, in balanced blocks.

    Rounds come in blocks of ``n``; within a block each arm takes each position once (a
    random Latin square: a shuffled cyclic one with shuffled rows), so no arm is always
    first after a pause of the others, and drifts within a block hit every arm alike.

    Args:
        n: Number of arms.
        rounds: Number of rounds.
        seed: Seed of the randomisation.
    """
    rng = random.Random(seed)
    orders: list[list[int]] = []
    while len(orders) < rounds:
        labels = list(range(n))
        rng.shuffle(labels)
        shifts = list(range(n))
        rng.shuffle(shifts)
        for s in shifts:
            orders.append([labels[(s + k) % n] for k in range(n)])
    return orders[:rounds]


def fallback_reason(device_type: str | None, statuses: Sequence[str | None], peaks: Sequence[int | None],
                    capacity: int | None) -> str | None:
    """Why the arms cannot be measured side by side, or None when they can.

    Args:
        device_type: ``cuda`` or ``cpu`` (of the arms that warmed up).
        statuses: Each arm's warm-up outcome: None when it is live, else its failed status.
        peaks: Each arm's peak memory after warm-up (bytes; CUDA: reserved by the allocator;
            CPU: resident set including loader workers); None when unknown.
        capacity: The device's total memory (CUDA) or the host's RAM (CPU), bytes.
    """
    live = [i for i, s in enumerate(statuses) if s is None]
    if device_type == "cuda" and "oom" in statuses and len(statuses) > 1:
        # Arms hold their device memory while paused: an out-of-memory during warm-up next
        # to other arms may be theirs, so each arm is measured alone instead.
        return "an arm ran out of device memory while other arms held theirs; measured one at a time instead"
    if len(live) < 2 or capacity is None:
        return None
    known = [peaks[i] for i in live if peaks[i] is not None]
    need = sum(known)
    headroom = CUDA_HEADROOM if device_type == "cuda" else RAM_HEADROOM
    if need > headroom * capacity:
        where = "device memory" if device_type == "cuda" else "host RAM"
        return (f"the arms' peaks ({need / 2**30:.2f} GiB together) do not fit {headroom:.0%} of the "
                f"{where} ({capacity / 2**30:.2f} GiB); measured one at a time instead")
    return None


def hopeless_arms(first_rates: Sequence[float | None], floor: float = HOPELESS) -> list[int]:
    """Arms that stop after their first window: far slower than the incumbent (arm 0).

    Args:
        first_rates: Each arm's throughput in its first window (None: it measured none).
        floor: The share of the incumbent's rate below which an arm is hopeless.
    """
    base = first_rates[0] if first_rates else None
    if not base:
        # Nothing to compare with: every arm measures on.
        return []
    return [i for i, r in enumerate(first_rates) if i and r is not None and r < floor * base]


def arm_preload(request: TrialRequest) -> tuple[str, ...]:
    """Modules the launcher imports before forking this request's arm (the compiler for a compiled one)."""
    from trainopt.knobs.kwargs import compile_mode

    return COMPILER_PRELOAD if compile_mode({"compile": request.settings.get("compile", "off")})[0] else ()


def window_timeout(timeout_s: float, window_s: float) -> float:
    """How long one timed window may take before its arm counts as hung.

    Twenty times the calibrated window and at least 30 s (a loaded machine can slow a
    window many times over), never more than the trial timeout.
    """
    return min(timeout_s, max(30.0, 20.0 * window_s))


def classify_reply(reply: dict[str, Any] | None, *, timed_out: bool, returncode: int | None, timeout_s: float,
                   what: str) -> tuple[str, str] | None:
    """The failure an arm's answer (or silence) means, or None for a normal answer.

    Args:
        reply: The arm's message, or None when it sent none.
        timed_out: The arm did not answer within ``timeout_s``.
        returncode: How the arm process ended, when it ended without answering.
        timeout_s: The limit it had.
        what: What it was doing (``warm-up``, ``window 3``), for the message.

    Returns:
        ``(status, error)`` for a failed arm.
    """
    if timed_out:
        return "timeout", f"the arm did not finish its {what} within {timeout_s:g} s and was stopped"
    if reply is None:
        how = classify_exit(returncode if returncode is not None else -signal.SIGKILL)
        return "crashed", f"{how} during its {what}"
    if reply.get("kind") == "failed":
        return str(reply.get("status", "error")), str(reply.get("error") or "")
    return None


def arm_result(request: TrialRequest, ready: dict[str, Any] | None, windows: Sequence[dict[str, Any]],
               final: dict[str, Any] | None, failure: tuple[str, str] | None) -> TrialResult:
    """One arm's TrialResult from its messages: steady-state throughput over its kept windows.

    Args:
        request: The arm's request.
        ready: Its warm-up report, if it got that far.
        windows: Its window reports, in order.
        final: Its closing report, if any.
        failure: ``(status, error)`` when the arm failed.
    """
    r = TrialResult(status="ok", settings=dict(request.settings), mode=request.mode)
    if ready:
        r.env = dict(ready.get("env") or {})
        r.window_steps = int(ready.get("window_steps") or 0)
        r.warmup_s, r.compile_s = ready.get("warmup_s"), ready.get("compile_s")
        r.first_step_s, r.first_loss = ready.get("first_step_s"), ready.get("first_loss")
        r.dataset_len = ready.get("dataset_len")
        r.peak_memory_bytes = ready.get("peak_memory_bytes")
    r.windows = [w["samples"] / w["elapsed_s"] for w in windows]
    if windows:
        r.last_loss = windows[-1].get("last_loss")
    if final:
        r.peak_memory_bytes = final.get("peak_memory_bytes") or r.peak_memory_bytes
        r.steps = int(final.get("steps") or 0)
    if failure:
        r.status, r.error = failure
        return r
    if not windows:
        r.status, r.error = "error", "the arm measured no window"
        return r
    cut = stats.steady_state(r.windows)
    kept = windows[cut.start:]
    kept_time = sum(w["elapsed_s"] for w in kept)
    kept_steps = sum(w["steps"] for w in kept)
    r.steady_from, r.steady = cut.start, cut.steady
    r.samples_per_s = sum(w["samples"] for w in kept) / kept_time
    r.step_time_s = kept_time / kept_steps
    r.data_wait_fraction = sum(w["data_wait_s"] for w in kept) / kept_time
    summary = stats.summarize_windows(r.windows[cut.start:])
    r.median, r.iqr = summary["median"], summary["iqr"]
    return r


# ---- sequential ---------------------------------------------------------------------------


class SequentialSessionRunner:
    """The old design as a session: one fresh trial process per arm, in a seeded random order.

    Args:
        runner: Any ``Runner`` (``run(request, log_path, timeout_s) -> TrialResult``).
        note: Text for the result's ``note``.
    """

    def __init__(self, runner: Runner, note: str = ""):
        self.runner = runner
        self.note = note

    def run_session(self, requests: list[TrialRequest], log_paths: list[Path], timeout_s: float,
                    seed: int, note: str | None = None) -> SessionResult:
        start = time.perf_counter()
        order = sequential_order(len(requests), seed)
        results: list[TrialResult | None] = [None] * len(requests)
        for i in order:
            results[i] = self.runner.run(requests[i], Path(log_paths[i]), timeout_s)
        return SessionResult(arms=list(results), mode="sequential", rounds=0, order=[order],
                             note=self.note if note is None else note, wall_s=time.perf_counter() - start)


# ---- the fork server, orchestrator side -----------------------------------------------------


class _Launcher:
    """A running ``trainopt.trial.forkserver`` process and the socket to it."""

    def __init__(self, env: dict[str, str], command: list[str], tag: str = ""):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._out = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            # The tag (the first session's log folder) only names the processes: forked arms keep
            # this command line, so ``ps`` (and the test suite's orphan check) can tell whose they are.
            [*command, "-m", FORKSERVER_MODULE, str(theirs.fileno()), *([tag] if tag else [])],
            pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT, env=env,
        )
        theirs.close()
        self.sock = ours
        self.sock.settimeout(300)
        try:
            hello = self.sock.recv(4096)
        except (socket.timeout, OSError):
            hello = b""
        if not hello:
            self._out.seek(0)
            tail = self._out.read().decode(errors="replace")[-2000:].strip() or f"exit code {self.proc.poll()}"
            self.close()
            raise RuntimeError(f"the arm launcher did not start:\n{tail}")

    def _ask(self, message: dict[str, Any], fds: list[int] | None = None) -> dict[str, Any]:
        data = json.dumps(message).encode()
        if fds:
            socket.send_fds(self.sock, [data], fds)
        else:
            self.sock.sendall(data)
        reply = self.sock.recv(65536)
        if not reply:
            raise RuntimeError("the arm launcher ended unexpectedly")
        return json.loads(reply)

    def spawn(self, control_fd: int, log_fd: int, preload: Sequence[str] = ()) -> int:
        message: dict[str, Any] = {"op": "spawn"}
        if preload:
            message["preload"] = list(preload)
        return int(self._ask(message, [control_fd, log_fd])["pid"])

    def wait(self, pid: int) -> int:
        return int(self._ask({"op": "wait", "pid": pid})["returncode"])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self._out.close()


def _kill_group(pid: int) -> None:
    """SIGKILL the arm's process group (the arm and its loader workers), stopped or not."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
            return
        except (ProcessLookupError, PermissionError):
            continue


def _is_gone(pid: int) -> bool:
    """True once the arm process has ended (a zombie of the launcher counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    except OSError:
        return False


class _Arm:
    """The orchestrator's handle on one live arm."""

    def __init__(self, index: int, launcher: _Launcher, log_path: Path, preload: Sequence[str] = ()):
        self.index = index
        self.launcher = launcher
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.pid = launcher.spawn(theirs.fileno(), log_fd, preload)
        finally:
            os.close(log_fd)
            theirs.close()
        self.conn = Connection(ours.detach())
        self.paused = False
        self.ended = False
        self.returncode: int | None = None
        self.ready: dict[str, Any] | None = None
        self.windows: list[dict[str, Any]] = []
        self.final: dict[str, Any] | None = None
        self.failure: tuple[str, str] | None = None

    def send(self, message: dict[str, Any]) -> None:
        self.conn.send_bytes(json.dumps({**message, "schema_version": SCHEMA_VERSION}).encode())

    def receive(self, timeout_s: float) -> tuple[dict[str, Any] | None, bool]:
        """The arm's next message, or (None, timed_out) when it died or stayed silent."""
        deadline = time.monotonic() + timeout_s
        while True:
            # Loader workers hold a copy of the control socket, so a dead arm need not
            # show as EOF at once: look at the process itself between short polls.
            left = deadline - time.monotonic()
            if left <= 0:
                return None, True
            try:
                if self.conn.poll(min(left, 0.25)):
                    message = json.loads(self.conn.recv_bytes())
                    if message.get("schema_version") != SCHEMA_VERSION:
                        return {"kind": "failed", "status": "error",
                                "error": f"arm message of schema version {message.get('schema_version')!r}"}, False
                    return message, False
            except (EOFError, OSError):
                return None, False
            if _is_gone(self.pid):
                return None, False

    def ask(self, message: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any] | None:
        """Send a command and wait for the answer; on any failure record it, end the arm, return None."""
        try:
            self.send(message)
        except OSError:
            pass  # a dead arm: its silence is classified below
        reply, timed_out = self.receive(timeout_s)
        returncode = None
        if reply is None:
            self.kill()
            returncode = self.returncode
        failure = classify_reply(reply, timed_out=timed_out, returncode=returncode, timeout_s=timeout_s, what=what)
        if failure:
            self.failure = failure
            self.kill()
            return None
        return reply

    def tree(self) -> list[int]:
        """The arm's pid and its loader workers' (empty once ended)."""
        if self.ended:
            return []
        import psutil

        try:
            proc = psutil.Process(self.pid)
            return [self.pid] + [p.pid for p in proc.children(recursive=True)]
        except psutil.Error:
            return []

    def pause(self) -> None:
        """Stop the arm's process group and wait (up to 2 s) until every member has stopped.

        SIGSTOP is delivered asynchronously; waiting keeps the next arm's window free of
        this arm's last few milliseconds of work.
        """
        if self.ended or self.paused:
            return
        try:
            os.killpg(self.pid, signal.SIGSTOP)
        except ProcessLookupError:
            return
        self.paused = True
        import psutil

        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            states = []
            for pid in self.tree():
                try:
                    states.append(psutil.Process(pid).status())
                except psutil.Error:
                    continue
            if all(s in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) for s in states):
                return
            time.sleep(0.001)

    def resume(self) -> None:
        if not self.ended and self.paused:
            try:
                os.killpg(self.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.paused = False

    def kill(self) -> None:
        """End the arm and its loader workers and learn how it ended."""
        if self.ended:
            return
        self.ended = True
        _kill_group(self.pid)
        try:
            self.returncode = self.launcher.wait(self.pid)
        except (OSError, RuntimeError, ValueError):
            self.returncode = None
        self.conn.close()


# ---- interleaved ----------------------------------------------------------------------------


class InterleavedSessionRunner:
    """Live arms forked from a pre-imported launcher, alternating timed windows.

    Args:
        rounds: Timed rounds (one window per arm each); default: the spec's ``measure.windows``.
        window_seconds: Target window length; default: the spec's ``measure.window_seconds``.
        rewarm_steps: Untimed steps an arm runs after being resumed, before its window.
        rewarm_share: Arms whose step is longer than this share of a window skip the
            re-warm; default: ``arm.REWARM_SHARE`` (``float("inf")`` always re-warms).
        env: Variables set for the launcher and so for every arm (for example
            ``OMP_WAIT_POLICY``, which the OpenMP runtime reads when torch is imported).
        cpus: Pin every arm (and its threads and loader workers) to these CPUs; None: no pinning.
        fallback: Runner for the sequential fallback (default: ``SubprocessRunner``).
        python: Interpreter for the launcher (default: this one).
        aslr: False starts the launcher with address-space layout randomisation off
            (``setarch -R``), so every arm of every session gets the same memory layout.
        relocate: True moves every arm's weights and optimizer state to fresh memory (and
            returns its freed heap to the kernel) before each window.
        host_ram_bytes: The host RAM the CPU co-residence rule compares against (default:
            the machine's total RAM).
        on_window: Called as ``on_window(arm_index, trees)`` before each timed window, while
            every arm is paused; ``trees[i]`` lists arm i's pid and its loader workers' pids
            (empty once it ended). For observing sessions (tests, benchmarks).
    """

    def __init__(self, rounds: int | None = None, window_seconds: float | None = None, rewarm_steps: int = 1,
                 env: dict[str, str] | None = None, cpus: Sequence[int] | None = None,
                 fallback: Runner | None = None, python: str | None = None,
                 aslr: bool = True, host_ram_bytes: int | None = None, relocate: bool = False,
                 rewarm_share: float | None = None,
                 on_window: Callable[[int, list[list[int]]], None] | None = None):
        self.on_window = on_window
        self.aslr = aslr
        self.relocate = relocate
        self.host_ram_bytes = host_ram_bytes
        self.rounds = rounds
        self.window_seconds = window_seconds
        self.rewarm_steps = rewarm_steps
        self.rewarm_share = rewarm_share
        self.extra_env = dict(env or {})
        self.cpus = list(cpus) if cpus is not None else None
        self.fallback = fallback or SubprocessRunner(extra_env=self.extra_env)
        self.python = python or sys.executable
        self._launcher: _Launcher | None = None
        self._finalizer = None
        self.startup_s: list[float] = []  # per arm: spawn until the arm's first message

    # -- launcher lifetime --

    def _get_launcher(self, tag: str = "") -> _Launcher:
        if not sys.platform.startswith("linux"):
            # The launcher relies on fork after import torch, descriptor passing and prctl.
            raise RuntimeError(f"live arms need Linux, this is {sys.platform}")
        if self._launcher is None or not self._launcher.alive:
            env = child_environment(extra=self.extra_env)
            # The fork server's watchdog ends it (and its arms) once this process is gone.
            env[FORKSERVER_PARENT_VAR] = str(os.getpid())
            prefix: list[str] = []
            if not self.aslr and shutil.which("setarch"):
                prefix = ["setarch", platform.machine(), "-R"]
            self._launcher = _Launcher(env, prefix + [self.python], tag)
            self._finalizer = weakref.finalize(self, _Launcher.close, self._launcher)
        return self._launcher

    def close(self) -> None:
        """Stop the launcher (arms are stopped at the end of every session anyway)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._launcher = None

    def __enter__(self) -> "InterleavedSessionRunner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- a session --

    def run_session(self, requests: list[TrialRequest], log_paths: list[Path], timeout_s: float,
                    seed: int) -> SessionResult:
        """Measure every request in one interleaved session (or fall back to sequential)."""
        start = time.perf_counter()
        n = len(requests)
        if any(r.spec.get("distributed") for r in requests):
            # A data-parallel trial is a torchrun job of several ranks, not one forked arm.
            return self._sequential(requests, log_paths, timeout_s, seed, start,
                                    "data-parallel trials run as torchrun jobs, one at a time")
        arms: list[_Arm] = []
        try:
            try:
                launcher = self._get_launcher(str(Path(log_paths[0]).parent) if log_paths else "")
            except (RuntimeError, OSError) as exc:
                return self._sequential(requests, log_paths, timeout_s, seed, start,
                                        f"live arms are not available here ({exc}); measured one at a time instead")
            started = start_order(n, seed)
            by_index: dict[int, _Arm] = {}
            for i in started:
                t0 = time.perf_counter()
                arm = _Arm(i, launcher, Path(log_paths[i]), arm_preload(requests[i]))
                by_index[i] = arm
                arms.append(arm)
                if self.cpus:
                    os.sched_setaffinity(arm.pid, self.cpus)
                hello, _ = arm.receive(60)
                if hello is None or hello.get("kind") != "alive":
                    arm.failure = ("crashed", "the arm process did not start")
                    arm.kill()
                self.startup_s.append(time.perf_counter() - t0)
            # From here on, arms[i] is request i's arm.
            arms = [by_index[i] for i in range(n)]
            # Warm up one arm at a time, each alone on the machine; pause it when warm.
            for i in started:
                arm, request = arms[i], requests[i]
                if arm.failure:
                    continue
                arm.ready = arm.ask({"cmd": "start", "request": json.loads(request.to_json()),
                                     "window_seconds": self.window_seconds, "rewarm_steps": self.rewarm_steps,
                                     "relocate": self.relocate,
                                     **({"rewarm_share": self.rewarm_share} if self.rewarm_share is not None else {})},
                                    timeout_s, "warm-up")
                arm.pause()
            reason = self._fallback_reason(arms)
            if reason:
                for arm in arms:
                    arm.kill()
                return self._sequential(requests, log_paths, timeout_s, seed, start, reason)
            rounds = self.rounds or int(requests[0].spec["measure"]["windows"])
            orders: list[list[int]] = []
            retired: list[int] = []
            for r, order in enumerate(round_orders(n, rounds, seed)):
                ran = []
                for i in order:
                    arm = arms[i]
                    if arm.failure or i in retired:
                        continue
                    if self.on_window is not None:
                        self.on_window(i, [a.tree() for a in arms])
                    arm.resume()
                    limit = window_timeout(timeout_s, float(arm.ready.get("typical_step_s", 1.0))
                                           * (arm.ready["window_steps"] + arm.ready.get("rewarm_steps", self.rewarm_steps)))
                    reply = arm.ask({"cmd": "window"}, limit, f"window {r + 1}")
                    if reply is not None:
                        arm.windows.append(reply)
                        arm.pause()
                    ran.append(i)
                orders.append(ran)
                if r == 0 and n > 1:
                    # Only arms with other settings than the incumbent's: a copy of the
                    # incumbent is never hopeless, whatever one window of it says.
                    retired = hopeless_arms([a.windows[0]["samples"] / a.windows[0]["elapsed_s"]
                                             if a.windows and not a.failure
                                             and (i == 0 or q.settings != requests[0].settings) else None
                                             for i, (a, q) in enumerate(zip(arms, requests))])
            note = ""
            if retired:
                note = (f"arm{'s' if len(retired) > 1 else ''} {', '.join(map(str, retired))} ran below "
                        f"{HOPELESS:.2f}x the incumbent in the first round and measured no further windows")
            for arm in arms:
                if not arm.failure:
                    arm.resume()
                    arm.final = arm.ask({"cmd": "finish"}, 60, "finish")
            results = []
            for arm, request, log_path in zip(arms, requests, log_paths):
                res = arm_result(request, arm.ready, arm.windows, arm.final, arm.failure)
                res.log_path = str(log_path)
                res.wall_s = time.perf_counter() - start
                write_json_atomic(request.result_path, res.to_dict())
                results.append(res)
            return SessionResult(arms=results, mode="interleaved", rounds=len(orders), order=orders,
                                 wall_s=time.perf_counter() - start, note=note, start_order=started)
        finally:
            # Also on Ctrl-C or SIGTERM (raised as an exception by the CLI): no arm or loader
            # worker outlives its session, stopped ones included.
            for arm in arms:
                arm.kill()

    def _sequential(self, requests, log_paths, timeout_s, seed, start: float, note: str) -> SessionResult:
        result = SequentialSessionRunner(self.fallback).run_session(requests, log_paths, timeout_s, seed, note=note)
        result.wall_s = time.perf_counter() - start
        return result

    def _fallback_reason(self, arms: list[_Arm]) -> str | None:
        statuses = [a.failure[0] if a.failure else None for a in arms]
        readies = [a.ready for a in arms if a.ready]
        device_type = readies[0].get("device_type") if readies else None
        peaks = [a.ready.get("footprint_bytes") if a.ready else None for a in arms]
        if device_type == "cuda":
            capacity = readies[0].get("device_capacity_bytes")
        elif self.host_ram_bytes is not None:
            capacity = self.host_ram_bytes
        else:
            import psutil

            capacity = int(psutil.virtual_memory().total)
        return fallback_reason(device_type, statuses, peaks, capacity)
