"""Sessions on a Ray cluster (``--ray [ADDRESS]``): one Ray actor per slot.

Ray places the actors and watches the nodes; this module decides how many slots each
node has (one per GPU, or one per ``cpus_per_slot`` cores on CPU-only nodes), pins each
slot to its own cores on its node, and hands sessions to free actors. A node that dies
costs only the sessions in flight on it: their actors fail with ``RayActorError`` and the
sessions are run again on the remaining slots. A session's result is taken from the one
actor that finished it, so every job gets exactly one result.

The orchestrator stays the only writer of the output folder: an actor runs its session
in a temporary folder on its node and returns the results and the arms' log text, which
are written here. The workload's code must be at the same path (``source_dir``) on every
node.

Ray is an optional extra (``pip install "trainopt[ray]"``); it is imported only when a
``RayExecutor`` is made.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import platform
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from trainopt.atomic import write_json_atomic
from trainopt.contract import slots as slotplan
from trainopt.contract.boundary import checkout_root
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult
from trainopt.errors import UserError
from trainopt.execute.executors import FingerprintCheck, SessionJob, record_placement

__all__ = ["RayExecutor", "RaySlot", "cluster_slots", "session_from_dict", "import_ray", "RAY_MISSING"]

RAY_MISSING = '--ray needs Ray, which is not installed here: pip install "trainopt[ray]"'

# How long the actors may take to be placed and to start before the cluster counts as
# unable to host them (a pending actor waits for free resources forever otherwise).
ACTOR_START_S = 300.0


def import_ray():
    """The ``ray`` module, or a ``UserError`` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise UserError(RAY_MISSING) from exc
    return ray


@dataclass(frozen=True)
class RaySlot:
    """Where one Ray slot lives.

    Attributes:
        index: The slot's number across the cluster.
        node_id: The Ray node it is placed on.
        host: That node's host name.
        index_on_node: Its number among the slots of its node (picks its cores there).
        count_on_node: How many slots its node has.
        num_cpus: Ray CPU resources the actor reserves (and cores it is pinned to).
        num_gpus: 1 for a GPU slot, else 0.
    """

    index: int
    node_id: str
    host: str
    index_on_node: int
    count_on_node: int
    num_cpus: int
    num_gpus: int


def cluster_slots(nodes: Sequence[Mapping[str, Any]], cpus_per_slot: int | None, device: str = "auto") -> list[RaySlot]:
    """The slots of a Ray cluster, from ``ray.nodes()``.

    GPU slots (one per GPU) when the spec's device can be CUDA and some node has GPUs;
    each also reserves ``cpus_per_slot`` cores (default: the node's cores shared evenly
    among its GPUs). Otherwise CPU slots of ``cpus_per_slot`` cores (default: one slot
    per node, all its cores).

    Raises:
        UserError: No node can hold a slot.
    """
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    if cpus_per_slot is not None and cpus_per_slot < 1:
        raise slotplan.SlotError(f"--cpus-per-slot {cpus_per_slot}: a slot needs at least one core")
    use_gpus = device != "cpu" and any(float(n.get("Resources", {}).get("GPU", 0)) >= 1 for n in alive)
    out: list[RaySlot] = []
    for node in sorted(alive, key=lambda n: n["NodeID"]):
        res = node.get("Resources", {})
        cpus, gpus = int(float(res.get("CPU", 0))), int(float(res.get("GPU", 0)))
        host = str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or node["NodeID"][:12])
        if use_gpus:
            count = gpus
            per = cpus_per_slot if cpus_per_slot is not None else (cpus // gpus if gpus else 0)
            if gpus and per * gpus > cpus:
                count = cpus // per if per else gpus
            num_gpus = 1
        else:
            per = cpus_per_slot if cpus_per_slot is not None else cpus
            count = cpus // per if per else 0
            num_gpus = 0
        for k in range(count):
            out.append(RaySlot(len(out), node["NodeID"], host, k, count, per, num_gpus))
    if not out:
        what = "a GPU" if use_gpus else f"{cpus_per_slot or 1} free CPU(s)"
        raise UserError(f"--ray: no node of the Ray cluster has {what} for a slot "
                        f"({len(alive)} node(s) alive); add nodes or lower --cpus-per-slot")
    return out


def session_from_dict(data: Mapping[str, Any]) -> SessionResult:
    """The inverse of ``SessionResult.to_dict``."""
    return SessionResult(arms=[TrialResult.from_dict(a) for a in data["arms"]], mode=data["mode"],
                         rounds=int(data.get("rounds", 0)), order=[list(o) for o in data.get("order", [])],
                         note=str(data.get("note", "")), wall_s=data.get("wall_s"),
                         start_order=[int(i) for i in data.get("start_order", [])])


class _SlotActor:
    """One slot on one node: its own session runner, pinned to the slot's cores (or GPU)."""

    def __init__(self, slot: RaySlot, session_runner_options: dict[str, Any]):
        import ray

        from trainopt.execute.executors import SlotThread
        from trainopt.execute.session_runners import InterleavedSessionRunner

        cpus: tuple[int, ...] = ()
        affinity = sorted(os.sched_getaffinity(0))
        if slot.num_cpus and len(affinity) >= slot.num_cpus * slot.count_on_node:
            cpus = slotplan.split_cpus(affinity, slot.count_on_node, slot.num_cpus)[slot.index_on_node]
        gpu_ids = ray.get_gpu_ids() if slot.num_gpus else []
        self.slot = slotplan.Slot(slot.index, cpus, str(gpu_ids[0]) if gpu_ids else None)
        self.info = slot
        env = {**session_runner_options.pop("env", {}), **self.slot.env()}
        import psutil

        # The node's slots share its RAM (see SlotExecutor).
        ram_share = int(psutil.virtual_memory().total) // max(1, slot.count_on_node)
        session_runner = InterleavedSessionRunner(env=env, cpus=list(cpus) or None, host_ram_bytes=ram_share,
                                                  **session_runner_options)
        self.slot_thread = SlotThread(self.slot, session_runner)

    def describe(self) -> dict[str, Any]:
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
                "python": platform.python_version(), "device": self.slot.device, "cpus": list(self.slot.cpus),
                "pid": os.getpid()}

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        """Run one session in a temporary folder; return its result and the arms' logs."""
        import queue

        folder = Path(tempfile.mkdtemp(prefix="trainopt-slot-"))
        try:
            requests, logs = [], []
            for i, data in enumerate(job["requests"]):
                data = dict(data, result_path=str(folder / f"arm{i}.result.json"))
                requests.append(TrialRequest(**data))
                logs.append(folder / "logs" / f"arm{i}.log")
            done: queue.Queue = queue.Queue()
            t0 = time.time()
            if hasattr(self.slot_thread.session_runner, "machine"):
                # The launcher's machine check at the moment it handed out this session.
                from trainopt.execute.executors import MachineFlag

                busy = job.get("machine_busy")
                self.slot_thread.session_runner.machine = None if busy is None else MachineFlag(bool(busy))

            def task() -> None:
                try:
                    if self.slot_thread.start_error is not None:
                        raise self.slot_thread.start_error
                    result = self.slot_thread.session_runner.run_session(requests, logs, job["timeout_s"], job["seed"])
                    done.put(("ok", result))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller below
                    done.put(("error", exc))

            # On the slot's own long-lived thread: its affinity, and its fork server's life.
            self.slot_thread.inbox.put(task)
            kind, value = done.get()
            if kind == "error":
                raise value
            texts = [p.read_text(errors="replace") if p.exists() else "" for p in logs]
            return {"session": value.to_dict(), "logs": texts, "device": self.slot.device, "host": socket.gethostname(),
                    "span": [t0, time.time()]}
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def close(self) -> None:
        self.slot_thread.close()


class RayExecutor:
    """Sessions on the slots of a Ray cluster (``--ray [ADDRESS]``, ``--cpus-per-slot K``).

    Args:
        address: ``None`` starts a local Ray instance (on this machine's cores); ``auto``
            joins the cluster started with ``ray start`` on this machine; ``HOST:PORT`` (or
            ``ray://HOST:10001``) joins that one. Ignored when Ray is already initialised.
        cpus_per_slot: Cores per slot on CPU-only nodes (default: one slot per node), or
            cores each GPU slot reserves (default: the node's cores shared among its GPUs).
        device: The spec's ``device`` (``cpu`` makes CPU slots even on GPU nodes).
        rounds, window_seconds, rewarm_steps, env: For each slot's ``InterleavedSessionRunner``.
        max_slots: Use at most this many slots.

    Raises:
        UserError: Ray is not installed, no node can hold a slot, or the slots' actors
            could not start.
    """

    def __init__(self, address: str | None = None, cpus_per_slot: int | None = None, *, device: str = "auto",
                 rounds: int | None = None, window_seconds: float | None = None, rewarm_steps: int = 1,
                 env: Mapping[str, str] | None = None, max_slots: int | None = None):
        ray = import_ray()
        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            root = str(checkout_root())
            # The actors must import this trainopt (a checkout need not be installed); a node
            # without this path falls back to the trainopt installed there.
            pythonpath = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
            try:
                ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}},
                         include_dashboard=False, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError) as exc:
                raise UserError(f"--ray {address or ''}: could not join the Ray cluster ({exc}); start it with "
                                "`ray start --head` or pass its address as --ray HOST:6379") from exc
        plan = cluster_slots(ray.nodes(), cpus_per_slot, device)
        if max_slots is not None:
            plan = plan[:max_slots]
        options = {"rounds": rounds, "window_seconds": window_seconds, "rewarm_steps": rewarm_steps,
                   "env": dict(env or {})}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(_SlotActor)
        self._actors: dict[int, Any] = {}
        for slot in plan:
            self._actors[slot.index] = remote.options(
                num_cpus=slot.num_cpus, num_gpus=slot.num_gpus, max_restarts=0, max_task_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(slot.node_id, soft=False),
            ).remote(slot, dict(options))
        self.plan = {slot.index: slot for slot in plan}
        refs = {ray_ref: k for k, actor in self._actors.items() for ray_ref in [actor.describe.remote()]}
        ready, waiting = ray.wait(list(refs), num_returns=len(refs), timeout=ACTOR_START_S)
        if waiting:
            self.close()
            raise UserError(f"--ray: {len(waiting)} of {len(refs)} slots could not start on the cluster within "
                            f"{ACTOR_START_S:g} s (not enough free CPUs/GPUs?); lower --cpus-per-slot")
        self.described = {refs[r]: ray.get(r) for r in ready}
        self.slots = len(self._actors)
        self.fingerprints = FingerprintCheck()
        # Job index -> slot index, for the sessions now running (progress displays, tests).
        self.in_flight: dict[int, int] = {}
        self.lost_slots: list[int] = []
        self.reruns = 0
        # The launcher's machine check (``machine_probe.MachineProbe``): each session carries its verdict.
        self.machine: Any = None

    def attach_machine(self, probe: Any) -> None:
        """Hand each later session the machine check's latest verdict (the slots' early cut holds while busy).

        The slots' actors on this machine are the search's own processes, not other load,
        even when Ray was started apart from this process (``--ray auto``).
        """
        self.machine = probe
        here = socket.gethostname()
        probe.add_own(d["pid"] for d in self.described.values() if d.get("host") == here and d.get("pid"))

    def run_many(self, jobs: list[SessionJob], exclusive: bool = False) -> list[SessionResult]:
        """One result per job, in job order; sessions whose slot died are run again elsewhere.

        With ``exclusive``, one session at a time on the whole cluster.
        """
        ray = self._ray
        lost = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError,
                ray.exceptions.OwnerDiedError, ray.exceptions.ObjectLostError)
        pending = collections.deque(range(len(jobs)))
        results: list[SessionResult | None] = [None] * len(jobs)
        running: dict[Any, tuple[int, int]] = {}
        # Job index -> how many times its slot was lost under it.
        tries: collections.Counter[int] = collections.Counter()
        free = sorted(self._actors)
        try:
            while pending or running:
                while pending and free and not (exclusive and running):
                    i, k = pending.popleft(), free.pop(0)
                    running[self._actors[k].run.remote(_job_payload(jobs[i], self.machine))] = (i, k)
                    self.in_flight[i] = k
                if not running:
                    raise UserError(f"--ray: every slot of the Ray cluster was lost (slots {self.lost_slots}); "
                                    f"{len(pending)} session(s) could not run")
                # A short timeout keeps Ctrl-C responsive while sessions run.
                done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for ref in done:
                    i, k = running.pop(ref)
                    self.in_flight.pop(i, None)
                    try:
                        out = ray.get(ref)
                    except lost:
                        # Its node or actor died mid-session: nothing of it was written here; run it again.
                        self._actors.pop(k, None)
                        self.lost_slots.append(k)
                        self.reruns += 1
                        tries[i] += 1
                        slot = self.plan[k]
                        print(f"trainopt: Ray slot {k} on {slot.host} (node {slot.node_id[:12]}) was lost mid-session; "
                              f"session {jobs[i].requests[0].trial_id} runs again on the remaining slots",
                              file=sys.stderr)
                        pending.appendleft(i)
                        continue
                    except ray.exceptions.RayTaskError as exc:
                        raise exc.as_instanceof_cause() from None
                    results[i] = self._land(jobs[i], out, k, reruns=tries[i])
                    free.append(k)
        except BaseException:
            # Interrupted: ask the actors to drop their sessions; close() ends them for good.
            for ref in running:
                try:
                    ray.cancel(ref)
                except Exception:  # noqa: BLE001 - best effort while interrupted
                    pass
            self.in_flight.clear()
            raise
        return results  # type: ignore[return-value]

    def _land(self, job: SessionJob, out: dict[str, Any], k: int, reruns: int = 0) -> SessionResult:
        """Write a finished session's logs and results into the output folder.

        ``reruns``: how many times the session was lost with its slot before this result;
        kept as ``env["session_reruns"]`` on every arm when not 0.
        """
        result = session_from_dict(out["session"])
        for arm, log_path, text in zip(result.arms, job.log_paths, out["logs"]):
            log_path = Path(log_path)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(text)
            arm.log_path = str(log_path)
        slot = self.plan[k]
        span = out.get("span")
        record_placement(result, slot=k, node=out.get("host") or slot.host, device=out["device"],
                         span=tuple(span) if span else None)
        for arm, request in zip(result.arms, job.requests):
            arm.env["ray_node_id"] = slot.node_id
            if reruns:
                arm.env["session_reruns"] = reruns
            write_json_atomic(request.result_path, arm.to_dict())
        self.fingerprints.check(f"slot {k} on {slot.host}", result)
        return result

    def close(self) -> None:
        """End the actors (their sessions' processes with them) and a Ray instance started here."""
        ray = self._ray
        for actor in list(self._actors.values()):
            try:
                ray.kill(actor)
            except Exception:  # noqa: BLE001 - a dead actor needs no killing
                pass
        self._actors.clear()
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> "RayExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _job_payload(job: SessionJob, machine: Any = None) -> dict[str, Any]:
    """What a slot's actor needs of one session; ``machine_busy`` is None where no machine check runs."""
    return {"requests": [dataclasses.asdict(r) for r in job.requests], "timeout_s": job.timeout_s, "seed": job.seed,
            "machine_busy": None if machine is None else bool(machine.busy_now)}
