"""How a session runs its arms and reads them: pure decisions over plain data.

The order the arms are started in and take their windows in, when the arms cannot live
side by side and the session measures them one at a time instead, which arms stop after
their first window, how long a window may take, which modules the fork server imports
before forking an arm, and one arm's ``TrialResult`` from its messages. The session
runners (``trainopt.execute.session_runners``) carry these out; nothing here starts a
process or reads a clock.
"""

from __future__ import annotations

import random
from typing import Any, Sequence

from trainopt.contract.boundary import COMPILER_PRELOAD
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.knobs.kwargs import compile_mode
from trainopt.stats import intervals as stats

__all__ = [
    "round_orders",
    "sequential_order",
    "start_order",
    "fallback_reason",
    "window_timeout",
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


def sequential_order(n: int, seed: int) -> list[int]:
    """A seeded random order of ``n`` arms, for running them one after another."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order


def start_order(n: int, seed: int) -> list[int]:
    """The order in which a session forks and warms up its arms: a seeded permutation.

    Arm 0 is the incumbent, and a fixed start order would hand every candidate the same
    place in the fork server's fork sequence and the same turn in the warm-up (after the
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
    """Modules the fork server imports before forking this request's arm (the compiler for a compiled one)."""
    return COMPILER_PRELOAD if compile_mode({"compile": request.settings.get("compile", "off")})[0] else ()


def window_timeout(timeout_s: float, window_s: float) -> float:
    """How long one timed window may take before its arm counts as hung.

    Twenty times the calibrated window and at least 30 s (a loaded machine can slow a
    window many times over), never more than the trial timeout.
    """
    return min(timeout_s, max(30.0, 20.0 * window_s))


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
