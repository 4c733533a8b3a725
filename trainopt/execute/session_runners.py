"""The session runners: several configurations ("arms") measured together in one session.

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

``InterleavedSessionRunner`` measures live arms; ``SequentialSessionRunner`` runs one fresh
trial process per arm, and is the interleaved one's fallback. What they decide (orders,
fallback, hopeless arms) is in ``trainopt.decide.session_plan``; the handles on the fork
server and the arms are in ``trainopt.execute.arm_handles``.

This module is the orchestrator side and never imports torch: the arms are forked from
``trainopt.trial.forkserver`` (which has torch imported) and run ``trainopt.trial.arm``.

Per-process offsets, and what this design does about each:

- OpenMP spin-waiting: an idle arm's OpenMP threads spin after their last parallel
  region and steal the core from the running arm. Removed: paused arms are SIGSTOPped,
  and ``ArmHandle.pause`` waits until every process of the group has actually stopped.
- Address-space layout, hash seed, allocator state, import order: a fresh process draws
  all of these anew. Arms forked from one fork server inherit the same image and malloc
  state and allocate in the same order, so same-settings arms get the same layout.
  ``aslr=False`` also fixes the layout across fork servers.
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
import os
import platform
import shutil
import sys
import time
import weakref
from pathlib import Path
from typing import Callable, Sequence

from trainopt.atomic import write_json_atomic
from trainopt.contract.boundary import FORKSERVER_PARENT_VAR, child_environment
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult
from trainopt.decide.machine import CUT_SPREAD, cut_allowed, starved_arms
from trainopt.decide.session_plan import (
    FIRST_WINDOW_FAST,
    HOPELESS,
    arm_preload,
    arm_result,
    cuttable_arms,
    fallback_reason,
    hopeless_arms,
    round_orders,
    sequential_order,
    start_order,
    window_timeout,
)
from trainopt.execute.arm_handles import ArmHandle, ForkServerHandle
from trainopt.execute.runner import Runner, SubprocessRunner

__all__ = ["SequentialSessionRunner", "InterleavedSessionRunner"]


class SequentialSessionRunner:
    """One fresh trial process per arm, run one after another in a seeded random order.

    Args:
        runner: Any ``Runner`` (``run(request, log_path, timeout_s) -> TrialResult``).
        note: Text for the result's ``note``.
    """

    def __init__(self, runner: Runner, note: str = ""):
        self.runner = runner
        self.note = note

    def run_session(self, requests: list[TrialRequest], log_paths: list[Path], timeout_s: float,
                    seed: int, note: str | None = None) -> SessionResult:
        """Run every request once, in ``sequential_order``; ``note``, when given, replaces the constructor's."""
        start = time.perf_counter()
        order = sequential_order(len(requests), seed)
        results: list[TrialResult | None] = [None] * len(requests)
        for i in order:
            results[i] = self.runner.run(requests[i], Path(log_paths[i]), timeout_s)
        return SessionResult(arms=list(results), mode="sequential", rounds=0, order=[order],
                             note=self.note if note is None else note, wall_s=time.perf_counter() - start)


class InterleavedSessionRunner:
    """Live arms forked from a pre-imported fork server, alternating timed windows.

    Args:
        rounds: Timed rounds (one window per arm each); default: the spec's ``measure.windows``.
        window_seconds: Target window length; default: the spec's ``measure.window_seconds``.
        rewarm_steps: Untimed steps an arm runs after being resumed, before its window.
        rewarm_share: Arms whose step is longer than this share of a window skip the
            re-warm; default: ``arm.REWARM_SHARE`` (``float("inf")`` always re-warms).
        env: Variables set for the fork server and so for every arm (for example
            ``OMP_WAIT_POLICY``, which the OpenMP runtime reads when torch is imported).
        cpus: Pin every arm (and its threads and loader workers) to these CPUs; None: no pinning.
        fallback: Runner for the sequential fallback (default: ``SubprocessRunner``).
        python: Interpreter for the fork server (default: this one).
        aslr: False starts the fork server with address-space layout randomisation off
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
        # The machine check (``execute.machine_probe.MachineProbe``); while its latest sample
        # says busy, the early cut does not act (``decide.machine.cut_allowed``).
        self.machine = None
        # max/min of the incumbent's windows in the latest session (None before the first).
        self._incumbent_spread: float | None = None
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
        self._fork_server: ForkServerHandle | None = None
        self._finalizer = None
        self.startup_s: list[float] = []  # per arm: spawn until the arm's first message

    # -- the fork server's lifetime --

    def _get_fork_server(self, tag: str = "") -> ForkServerHandle:
        """The fork server, started on first use and again after it ended; ``tag`` names its process."""
        if not sys.platform.startswith("linux"):
            # The fork server relies on fork after import torch, descriptor passing and prctl.
            raise RuntimeError(f"live arms need Linux, this is {sys.platform}")
        if self._fork_server is None or not self._fork_server.alive:
            env = child_environment(extra=self.extra_env)
            # The fork server's watchdog ends it (and its arms) once this process is gone.
            env[FORKSERVER_PARENT_VAR] = str(os.getpid())
            prefix: list[str] = []
            if not self.aslr and shutil.which("setarch"):
                prefix = ["setarch", platform.machine(), "-R"]
            self._fork_server = ForkServerHandle(env, prefix + [self.python], tag)
            self._finalizer = weakref.finalize(self, ForkServerHandle.close, self._fork_server)
        return self._fork_server

    def close(self) -> None:
        """Stop the fork server (arms are stopped at the end of every session anyway)."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._fork_server = None

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
        arms: list[ArmHandle] = []
        try:
            try:
                fork_server = self._get_fork_server(str(Path(log_paths[0]).parent) if log_paths else "")
            except (RuntimeError, OSError) as exc:
                return self._sequential(requests, log_paths, timeout_s, seed, start,
                                        f"live arms are not available here ({exc}); measured one at a time instead")
            started = start_order(n, seed)
            by_index: dict[int, ArmHandle] = {}
            for i in started:
                t0 = time.perf_counter()
                arm = ArmHandle(i, fork_server, Path(log_paths[i]), arm_preload(requests[i]))
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
            note_held = ""
            cuttable = cuttable_arms([q.trial_id for q in requests], [q.settings for q in requests])
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
                if n > 1:
                    # The cut is judged after every round on each arm's windows so far,
                    # only where it may act (a screen's candidates; see cuttable_arms).
                    rates = [[w["samples"] / w["elapsed_s"] for w in a.windows] if not a.failure else []
                             for a in arms]
                    busy = bool(self.machine is not None and self.machine.busy_now)
                    hopeless = [i for i in hopeless_arms(rates, cuttable) if i not in retired]
                    if cut_allowed(rates[0], busy, self._incumbent_spread):
                        retired += hopeless
                    elif hopeless and not note_held:
                        note_held = ("the early cut did not act on a slow arm: " + ("the machine was busy" if busy else
                                     f"the incumbent's windows spread more than {CUT_SPREAD:g}x"))
            note = ""
            if retired:
                note = (f"arm{'s' if len(retired) > 1 else ''} {', '.join(map(str, sorted(retired)))} ran below "
                        f"{HOPELESS:.2f}x the incumbent (below {HOPELESS / FIRST_WINDOW_FAST:.2f}x after one window) "
                        f"and measured no further windows")
            starved = ""
            if readies := [a.ready for a in arms if a.ready]:
                if readies[0].get("device_type") in (None, "cpu"):
                    # Only arms that load their own data: one with loader workers waits for them.
                    starved = starved_arms([(a.windows if not a.failure and not (q.settings.get("num_workers") or 0) else [],
                                             (a.ready or {}).get("env", {}).get("torch_threads")) for a, q in zip(arms, requests)])
            note = "; ".join(filter(None, [note, note_held, starved]))
            first = [w["samples"] / w["elapsed_s"] for w in arms[0].windows] if not arms[0].failure else []
            if len(first) >= 2 and min(first) > 0:
                # The next session's cut after one window judges by this spread (one window has none).
                self._incumbent_spread = max(first) / min(first)
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

    def _fallback_reason(self, arms: list[ArmHandle]) -> str | None:
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
