"""The machine check: is the machine busy, is the noise normal, may an arm be cut early.

Like a benchmark tool's system check, the search looks at the machine before it measures
and while it does: how much CPU other processes take (read from /proc at the edges, in
``execute.machine_probe``), the load average, and each trial's own CPU time against its
wall time and threads. This module only judges that evidence; it reads nothing itself.

A session cancels load that hits all its arms alike, but a machine whose cores are taken
by other processes measures contention, not the settings: a `nice -n 19` busy loop beside
two torch threads on two cores made a run 13x slower, with window noise of 21-42 % where a
quiet machine shows a few per cent. So the search warns before its first trial when the
machine is busy, records every sample in ``results.json``, calls the noise ``noisy`` (with
the figure) rather than ``steady`` when it leaves its normal band, and never cuts an arm
after one window while the machine is busy or the incumbent's own windows spread widely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

__all__ = [
    "Load",
    "MachineCheck",
    "other_load",
    "judge",
    "cpu_share",
    "noise_label",
    "cut_allowed",
    "BUSY_SHARE",
    "NORMAL_NOISE",
    "CUT_SPREAD",
    "STARVED_SHARE",
    "warnings",
    "starved_arms",
    "held_back",
]

# Other processes using more than this share of the machine's CPUs make it busy: on two
# cores, a fifth of a core is already a neighbour that takes a torch thread's core now and then.
BUSY_SHARE = 0.10
# The median window noise of a stage above which its sessions are "noisy", not "steady":
# a quiet machine's windows scatter by a few per cent (1-2 % on a GPU, 3-7 % on the demo's
# CPU, up to 15 % beside loader workers); a busy one's by 21-42 %.
NORMAL_NOISE = 0.15
# No arm is cut after its first window when the incumbent's own windows so far (or in the
# sessions before) spread by more than this ratio: its first window then says little.
CUT_SPREAD = 2.0
# An arm that ran on less than this share of one core over its windows was starved by other
# processes (``starved_arms``).
STARVED_SHARE = 0.8


@dataclass(frozen=True)
class Load:
    """What other processes did to the machine over one interval.

    Attributes:
        cpus: CPUs of the machine.
        others: CPUs' worth of time other processes used (1.0: one whole core).
        top: ``[(name, cpus), ...]``: the processes that used most, largest first.
        load1: The 1-minute load average at the end, or None.
        interval_s: How long the interval was.
    """

    cpus: int
    others: float
    top: list[tuple[str, float]] = field(default_factory=list)
    load1: float | None = None
    interval_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "others": round(self.others, 3), "top": [[n, round(c, 3)] for n, c in self.top],
                "load1": self.load1, "interval_s": round(self.interval_s, 3)}


@dataclass(frozen=True)
class MachineCheck:
    """The judgement of one sample.

    Attributes:
        busy: Other processes take enough of the machine to distort the measurements.
        reason: Empty when quiet; else what is busy, with the numbers and the top processes.
    """

    busy: bool
    reason: str = ""


def other_load(before: dict[str, Any], after: dict[str, Any], own: Sequence[int] = (), top: int = 3) -> Load:
    """The load of other processes between two snapshots.

    Args:
        before: A snapshot: ``{"t": seconds, "cpus": n, "hz": ticks per second,
            "procs": {pid: (name, ticks)}, "load1": float}`` (``execute.machine_probe``).
        after: A later snapshot.
        own: Process ids that are the search's (itself and its trials): not "others".
        top: How many of the busiest other processes to name.
    """
    dt = max(1e-9, float(after["t"]) - float(before["t"]))
    hz = float(after.get("hz") or 100.0)
    mine = {int(p) for p in own}
    used: dict[str, float] = {}
    for pid, (name, ticks) in after.get("procs", {}).items():
        if int(pid) in mine:
            continue
        prev = before.get("procs", {}).get(pid)
        # A process that started within the interval counts from zero; one whose pid was reused keeps its own count.
        start = prev[1] if prev is not None and prev[0] == name and prev[1] <= ticks else 0
        cpus = (ticks - start) / hz / dt
        if cpus > 0:
            used[name] = used.get(name, 0.0) + cpus
    ranked = sorted(used.items(), key=lambda kv: -kv[1])
    return Load(cpus=int(after.get("cpus") or 1), others=sum(used.values()), top=ranked[:top],
                load1=after.get("load1"), interval_s=dt)


def judge(load: Load, *, before_search: bool = False) -> MachineCheck:
    """Whether the machine is busy over this sample: other processes used more than ``BUSY_SHARE`` of its CPUs.

    The 1-minute load average is reported beside it but decides nothing: it trails by a
    minute, so a search started right after another (a ``trainopt verify`` after its search)
    would be called busy by the one before it, while the CPU time of this very sample says
    what runs now.

    Args:
        load: The sample.
        before_search: Whether it was taken before the search's first trial (named in the reason).
    """
    if load.others <= BUSY_SHARE * load.cpus:
        return MachineCheck(busy=False, reason="")
    names = ", ".join(f"{n} {c:.2f}" for n, c in load.top)
    reason = f"other processes used {load.others:.2f} of {load.cpus} CPUs" + (f" ({names})" if names else "")
    if load.load1 is not None:
        reason += f"; load average {load.load1:.2f} on {load.cpus} CPUs"
    return MachineCheck(busy=True, reason=reason)


def cpu_share(cpu_s: float | None, wall_s: float | None, threads: int | None) -> float | None:
    """The share of the CPU time a trial could use (wall time x its threads) that it got; None when unknown."""
    if not cpu_s or not wall_s or not threads or wall_s <= 0 or threads <= 0:
        return None
    return min(1.0, float(cpu_s) / (float(wall_s) * int(threads)))


def noise_label(noise_by_stage: dict[str, float], unstable_verdicts: int = 0) -> str:
    """``steady``, ``noisy (window noise N %)`` or ``N unstable`` for the report's stability card.

    ``steady`` only when every stage's median window noise is within ``NORMAL_NOISE``.
    """
    if unstable_verdicts:
        return f"{unstable_verdicts} unstable"
    values = [v for v in noise_by_stage.values() if isinstance(v, (int, float)) and math.isfinite(v)]
    worst = max(values, default=0.0)
    if worst > NORMAL_NOISE:
        return f"noisy (window noise up to {worst:.0%})"
    return "steady"


def cut_allowed(incumbent_windows: Sequence[float], busy: bool, usual_spread: float | None = None) -> bool:
    """Whether the early cut may act on the windows so far.

    Never while the machine is busy, nor when the incumbent's windows so far (or, after one
    window, its usual spread in earlier sessions, ``usual_spread`` as max/min) spread by more
    than ``CUT_SPREAD``: a single window then says little about an arm.
    """
    if busy:
        return False
    ws = [w for w in incumbent_windows if isinstance(w, (int, float)) and w > 0]
    spread = max(ws) / min(ws) if len(ws) >= 2 else (usual_spread or 1.0)
    return spread <= CUT_SPREAD


def warnings(machine: dict[str, Any] | None, noise_by_stage: dict[str, float] | None = None,
             kept_knobs: Sequence[str] = ()) -> list[str]:
    """The report's warnings from the machine check (``MachineProbe.to_dict``) and the window noise.

    Args:
        machine: The results document's ``machine`` section, or None when not sampled.
        noise_by_stage: The stability record's median window noise per stage.
        kept_knobs: The knobs whose change was kept: a ``threads`` change kept while the
            machine was busy may only reflect threads waiting on shared cores.
    """
    out = []
    machine = machine or {}
    before = machine.get("before") or {}
    if before.get("busy"):
        out.append(f"the machine was busy before the search started ({before.get('reason')}); every figure measures "
                   f"contention as well as the settings: run again on a quiet machine (or with --wait-for-quiet)")
    during = machine.get("during") or []
    busy = [p for p in during if p.get("busy")]
    if busy:
        worst = max(busy, key=lambda p: p.get("others") or 0)
        out.append(f"the machine was busy in {len(busy)} of {len(during)} samples during the search "
                   f"(at worst: {worst.get('reason')})")
    if (before.get("busy") or busy) and "threads" in kept_knobs:
        out.append("a threads change was kept while the machine was busy: fewer threads can win only because "
                   "other processes took cores; check it on a quiet machine before adopting it")
    label = noise_label(noise_by_stage or {})
    if label != "steady":
        out.append(f"sessions were {label}, above the {NORMAL_NOISE:.0%} a steady machine shows: "
                   f"differences of a few per cent are hard to see on it")
    return out


def starved_arms(arms: Sequence[tuple[Sequence[dict[str, Any]], int | None]]) -> str:
    """A session note naming the arms that ran on less than ``STARVED_SHARE`` of a core, or ``""``.

    A CPU-bound arm that loads its own data keeps at least one thread running all through its
    windows; several intra-op threads need not keep every core busy (small operations run on
    one, idle threads sleep), so the share is judged against one core, not ``threads``: an
    arm short of even one core waited for cores other processes held. (An arm whose threads
    spin-wait for a shared core burns CPU time and is not caught here; the load from /proc
    shows it.) The caller passes only arms that load their own data on a CPU: an arm with
    loader workers waits for them, an accelerator arm for its device.

    Args:
        arms: Per arm, its window reports (``elapsed_s``, ``cpu_s``) and its torch threads
            (None when unknown), for the message; an arm not to judge gets no windows.
    """
    out = []
    for i, (windows, threads) in enumerate(arms):
        ws = [w for w in windows if isinstance(w.get("cpu_s"), (int, float)) and isinstance(w.get("elapsed_s"), (int, float))]
        share = cpu_share(sum(w["cpu_s"] for w in ws), sum(w["elapsed_s"] for w in ws), 1) if ws else None
        if share is not None and share < STARVED_SHARE:
            out.append(f"arm {i} ran on {share:.0%} of a core" + (f" ({threads} thread{'s' if threads != 1 else ''})" if threads else ""))
    return ("; ".join(out) + " over its windows: other processes held the cores") if out else ""


def held_back(knob: str, busy: bool) -> str | None:
    """Why a confirmed change is not adopted because of the machine, or None.

    A ``threads`` change confirmed while the machine is busy is not adopted: with other
    processes holding cores, a thread count can win only because its threads wait less for a
    shared core (one busy loop made two threads on two cores 13x slower, one thread
    unchanged), and that says nothing of a quiet production machine.
    """
    if knob == "threads" and busy:
        return ("not adopted: the machine was busy while it was confirmed, and a threads change can win only because "
                "other processes held cores; run the search again on a quiet machine")
    return None
