"""Slots: the disjoint shares of a machine on which measurement sessions run side by side.

A slot is one GPU, or a set of CPU cores that no other slot uses. Sessions on different
slots run at once; the arms of one session always share one slot. Everything here is a
decision over plain data (core lists, device ids, fingerprints); processes and threads
are ``trainopt.execute.executors.SlotExecutor``'s business.

Why the thread counts are set explicitly: PyTorch sizes its intra-op pool from the
machine's core count, not from the process's affinity, so a trial pinned to one core
would otherwise start as many threads as the machine has cores and time-slice them on
that core. ``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are read when the OpenMP runtime
loads (in the arm launcher), so they go into the environment of the slot's processes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trainopt.contract.boundary import SLOT_CPUS_VAR
from trainopt.contract.fingerprint import COMPARED_KEYS, differences
from trainopt.errors import UserError

__all__ = [
    "Slot",
    "SlotError",
    "SLOT_KEYS",
    "cpu_list_text",
    "split_cpus",
    "parse_visible_devices",
    "parse_nvidia_smi",
    "detect_gpus",
    "plan_slots",
    "slot_differences",
    "check_alike",
    "threads_reason",
    "slot_cpus_from_env",
    "parse_gpu_ids",
    "parse_compute_apps",
    "foreign_gpu_processes",
    "gpu_busy_warnings",
]

# Fingerprint keys that must agree between slots: a verdict measured on one slot is
# combined with measurements from the others, so they must be the same kind of machine.
SLOT_KEYS = (*COMPARED_KEYS, "python", "cpu_flags", "device_memory_bytes")


class SlotError(UserError):
    """Slots that cannot be made (more slots than cores or GPUs) or that differ."""


@dataclass(frozen=True)
class Slot:
    """One share of a machine.

    Attributes:
        index: The slot's number (0-based), recorded with every trial as ``env["slot"]``.
        cpus: The cores it owns; empty: not pinned (the process's whole affinity).
        gpu: The CUDA device id it owns, as ``CUDA_VISIBLE_DEVICES`` names it; None on CPU.
    """

    index: int
    cpus: tuple[int, ...] = ()
    gpu: str | None = None

    @property
    def device(self) -> str:
        """Where the slot's trials run, for ``env["device"]``: ``cuda:3`` or ``cpu:0-3``."""
        if self.gpu is not None:
            return f"cuda:{self.gpu}"
        return f"cpu:{cpu_list_text(self.cpus)}" if self.cpus else "cpu"

    def env(self) -> dict[str, str]:
        """Environment variables for every process of this slot (launcher, arms, trials)."""
        out: dict[str, str] = {}
        if self.cpus:
            n = str(len(self.cpus))
            out.update(OMP_NUM_THREADS=n, MKL_NUM_THREADS=n, **{SLOT_CPUS_VAR: n})
        if self.gpu is not None:
            out["CUDA_VISIBLE_DEVICES"] = self.gpu
        return out


def cpu_list_text(cpus: Sequence[int]) -> str:
    """``0-3,8,10-11`` for a list of core ids (the ``taskset -c`` notation)."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def split_cpus(cpus: Sequence[int], n: int, per_slot: int | None = None) -> list[tuple[int, ...]]:
    """``n`` disjoint, equal sets of consecutive cores out of ``cpus``.

    Consecutive ids keep a slot on neighbouring cores (often one socket or core complex).
    Cores left over when ``len(cpus)`` is not a multiple of ``n`` stay unused, so every
    slot has the same number of cores.

    Args:
        cpus: The cores this process may use (``os.sched_getaffinity(0)``).
        n: Number of slots.
        per_slot: Cores per slot; default: as many as divide evenly.

    Raises:
        SlotError: ``n`` (times ``per_slot``) is more than the cores available.
    """
    ids = sorted(set(cpus))
    if n < 1:
        raise SlotError(f"--parallel {n}: the number of slots must be at least 1")
    size = per_slot if per_slot is not None else len(ids) // n
    if per_slot is not None and per_slot < 1:
        raise SlotError(f"--cpus-per-slot {per_slot}: a slot needs at least one core")
    if size < 1 or n * size > len(ids):
        need = f"{n} slots of {size} cores" if per_slot is not None else f"{n} slots"
        raise SlotError(
            f"--parallel {n}: {need} need more cores than the {len(ids)} this process may use "
            f"({cpu_list_text(ids)}); use --parallel {max(1, len(ids) // max(1, per_slot or 1))} or fewer"
        )
    return [tuple(ids[k * size:(k + 1) * size]) for k in range(n)]


def parse_visible_devices(value: str | None) -> list[str] | None:
    """The device ids in a ``CUDA_VISIBLE_DEVICES`` value; None when the variable is unset.

    An empty value (or ``-1``, or ``NoDevBackup``-style junk) means no GPU; CUDA stops
    reading the list at the first invalid entry, and so does this.
    """
    if value is None:
        return None
    ids: list[str] = []
    for part in value.split(","):
        part = part.strip()
        if not part or part.startswith("-"):
            break
        ids.append(part)
    return ids


def parse_nvidia_smi(text: str) -> list[str]:
    """GPU indices from ``nvidia-smi -L`` output (``GPU 0: NVIDIA H100 (UUID: ...)``)."""
    ids = []
    for line in text.splitlines():
        head, sep, _ = line.partition(":")
        if sep and head.startswith("GPU "):
            ids.append(head[4:].strip())
    return ids


def detect_gpus(environ: Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, without importing torch.

    ``CUDA_VISIBLE_DEVICES`` when it is set; otherwise ``nvidia-smi -L`` when it is
    installed; otherwise none.
    """
    environ = os.environ if environ is None else environ
    visible = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        return visible
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else []


def plan_slots(n: int, cpus: Sequence[int], gpus: Sequence[str], device: str = "auto") -> list[Slot]:
    """The slots of ``--parallel n`` on this machine.

    One GPU per slot when the spec's device can be CUDA and there are GPUs; each GPU slot
    also gets an equal share of the cores when there are enough (its loader workers and
    Python overhead then do not compete with another slot's). Otherwise ``n`` disjoint
    core sets.

    Args:
        n: Number of slots.
        cpus: The cores this process may use.
        gpus: The GPU ids it may use (``detect_gpus()``).
        device: The spec's ``device`` (``auto``, ``cpu``, ``cuda``, ``cuda:1``).

    Raises:
        SlotError: More slots than GPUs (GPU runs) or cores (CPU runs).
    """
    if n < 1:
        raise SlotError(f"--parallel {n}: the number of slots must be at least 1")
    if device.startswith("cuda") and ":" in device and n > 1:
        raise SlotError(f"--parallel {n} with device: {device!r}: a spec pinned to one GPU cannot use several "
                        f"slots; set device: cuda (each slot then gets its own GPU)")
    use_gpus = device != "cpu" and len(gpus) > 0
    if device.startswith("cuda") and not gpus:
        raise SlotError(f"--parallel {n}: the spec asks for device {device!r} but no GPU is visible "
                        "(CUDA_VISIBLE_DEVICES, nvidia-smi)")
    if use_gpus:
        if n > len(gpus):
            raise SlotError(f"--parallel {n}: only {len(gpus)} GPU(s) visible ({','.join(gpus)}); one slot "
                            f"needs one GPU, so use --parallel {len(gpus)} or fewer")
        shares = split_cpus(cpus, n) if len(set(cpus)) >= n else [()] * n
        return [Slot(k, shares[k], gpus[k]) for k in range(n)]
    if n == 1:
        # Today's behaviour: no pinning, PyTorch's own thread count.
        return [Slot(0)]
    return [Slot(k, share) for k, share in enumerate(split_cpus(cpus, n))]


def slot_differences(first: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """Lines naming each fingerprint key (``SLOT_KEYS``) that differs between the first slot and another."""
    return differences(first, other, SLOT_KEYS, "{key}: {a!r} on the first slot, {b!r} here")


def check_alike(fingerprints: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> None:
    """Refuse slots whose environment differs from the first slot's.

    Args:
        fingerprints: Each slot's environment fingerprint (``trainopt.trial.environment.environment``).
        names: How to call each slot in the message (default ``slot K``).

    Raises:
        SlotError: Naming every differing slot and what differs.
    """
    names = list(names) if names is not None else [f"slot {k}" for k in range(len(fingerprints))]
    problems = []
    for k in range(1, len(fingerprints)):
        diff = slot_differences(fingerprints[0], fingerprints[k])
        if diff:
            problems.append(f"{names[k]} differs from {names[0]}: " + "; ".join(diff))
    if problems:
        raise SlotError(
            "slots must be alike, since a verdict combines measurements from all of them:\n  "
            + "\n  ".join(problems)
            + "\n  run on alike machines only (same CPU/GPU model, Python, torch and CUDA)"
        )


def threads_reason(threads: int | None, slot_cpus: int | None) -> str | None:
    """Why a ``threads`` level cannot be measured on a slot of ``slot_cpus`` cores, or None.

    More intra-op threads than the slot's cores would time-slice on them (or, unpinned,
    take another slot's cores), so such a level is reported, not measured.
    """
    if threads is None or slot_cpus is None or threads <= slot_cpus:
        return None
    return (f"threads {threads} is more than the {slot_cpus} core(s) of this slot; "
            f"use fewer slots (--parallel / --cpus-per-slot) to measure it")


def slot_cpus_from_env(environ: Mapping[str, str]) -> int | None:
    """The core count of the slot this process runs in (``SLOT_CPUS_VAR``), or None outside slots."""
    value = environ.get(SLOT_CPUS_VAR)
    try:
        return int(value) if value else None
    except ValueError:
        return None


def parse_gpu_ids(text: str) -> dict[str, str]:
    """``{uuid: index}`` from ``nvidia-smi --query-gpu=index,uuid --format=csv,noheader``."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0] and parts[1]:
            out[parts[1]] = parts[0]
    return out


def parse_compute_apps(text: str) -> list[tuple[str, int, str]]:
    """``(gpu uuid, pid, name)`` from ``nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name
    --format=csv,noheader``."""
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if len(parts) == 3 and parts[1].isdigit():
            out.append((parts[0], int(parts[1]), parts[2]))
    return out


def foreign_gpu_processes(plan: Sequence[Slot], gpu_ids: Mapping[str, str],
                          apps: Sequence[tuple[str, int, str]], own_pids: set[int] | frozenset = frozenset()) -> list[str]:
    """Warnings for processes that are not this search's and use a slot's GPU.

    Another process's kernels share the GPU with the slot's trials and slow them by an
    amount that changes while the search runs, so the user is told before it starts.

    Args:
        plan: The slots.
        gpu_ids: ``{uuid: index}`` (``parse_gpu_ids``); a slot's ``gpu`` may be either.
        apps: The compute processes (``parse_compute_apps``).
        own_pids: Processes of this search, not reported.
    """
    out = []
    for slot in plan:
        if slot.gpu is None:
            continue
        for uuid, pid, name in apps:
            if pid in own_pids:
                continue
            if slot.gpu in (uuid, gpu_ids.get(uuid)):
                out.append(f"slot {slot.index} ({slot.device}): process {pid} ({name}) is using this GPU; "
                           "its work slows the slot's trials unevenly, so stop it or leave this GPU out "
                           "(CUDA_VISIBLE_DEVICES)")
    return out


def gpu_busy_warnings(plan: Sequence[Slot]) -> list[str]:
    """``foreign_gpu_processes`` for this machine, read with ``nvidia-smi`` (none without it)."""
    smi = shutil.which("nvidia-smi")
    if not smi or all(slot.gpu is None for slot in plan):
        return []
    try:
        ids = subprocess.run([smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=False)
        apps = subprocess.run([smi, "--query-compute-apps=gpu_uuid,pid,process_name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if ids.returncode or apps.returncode:
        return []
    return foreign_gpu_processes(plan, parse_gpu_ids(ids.stdout), parse_compute_apps(apps.stdout), {os.getpid()})
