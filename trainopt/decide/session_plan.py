"""How a session runs its arms and reads them: pure decisions over plain data.

The order the arms are started in and take their windows in, when the arms cannot live
side by side and the session measures them one at a time instead, which arms stop early
(the early cut), how long a window may take, which modules the fork server imports
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
    "FIRST_WINDOW_FAST",
    "CUT_ROLES",
    "session_role",
    "cuttable_arms",
    "hopeless_arms",
    "arm_preload",
]

# Share of the device's memory the arms' peaks may fill together: the caching allocator
# and the CUDA context need room beyond what max_memory_reserved shows.
CUDA_HEADROOM = 0.9
# Share of the host's RAM the arms' peak resident sets may fill together: paused arms stay
# resident, and a session that pushes the machine into swap measures the swap, not the arms.
RAM_HEADROOM = 0.7
# An arm far slower than the arm it is compared with (arm 0, the incumbent) measures no
# further windows: no later window can lift it to a win (the search's screen gate is 0.98),
# and a slow arm's windows are the session's most expensive ones (bf16 on a CPU without
# bf16 units: 0.08x). The cut is a ratio of the two arms' own windows, so it means the
# same at any speed, and it is judged so that one odd window cannot make it: a first-round
# window can run 1.5x its later ones on a busy machine (FIRST_WINDOW_FAST). After one
# round an arm is cut only below HOPELESS / FIRST_WINDOW_FAST (1/3) of the incumbent's
# first window; from the second round on, when even its fastest window stays below
# HOPELESS of the incumbent's slowest, so neither side's odd first window decides.
HOPELESS = 1 / 2
FIRST_WINDOW_FAST = 1.5
# Only these sessions may cut an arm: a screen only chooses what to confirm, and an arm cut
# there is screened out by the figure that cut it. Every other session's arms (confirmation
# pairs, held-out sessions with their baseline arm, the final check) give figures that a
# comparison needs in full. A session whose arms carry no role (run directly, outside a
# search) is treated like a screen.
CUT_ROLES = ("screen", "")


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


def session_role(trial_id: str) -> str:
    """The role a search's arm runs in, from its trial id (``role/knob/tag/settings-hash``); ``""`` when it has none."""
    parts = (trial_id or "").split("/")
    return parts[0] if len(parts) >= 4 else ""


def cuttable_arms(trial_ids: Sequence[str], settings: Sequence[dict[str, Any]]) -> list[bool]:
    """Which arms of a session the early cut may retire.

    Never arm 0 (what the others are compared with), never a copy of it (the same
    settings: a copy of the incumbent is never hopeless, whatever a window of it says), and
    only in a session whose role is in ``CUT_ROLES``: every arm of a confirmation, held-out
    or final-check session gives a figure a comparison needs.

    Args:
        trial_ids: Each arm's ``TrialRequest.trial_id``.
        settings: Each arm's settings.
    """
    if not trial_ids or any(session_role(t) not in CUT_ROLES for t in trial_ids):
        return [False] * len(trial_ids)
    return [i > 0 and s != settings[0] for i, s in enumerate(settings)]


def hopeless_arms(windows: Sequence[Sequence[float]], cuttable: Sequence[bool] | None = None,
                  floor: float = HOPELESS, first_fast: float = FIRST_WINDOW_FAST) -> list[int]:
    """Arms that stop measuring: far slower than arm 0 on every window so far.

    With one window each, an arm is hopeless below ``floor / first_fast`` of arm 0's
    window (a first window can run ``first_fast`` times fast); with two or more, when its
    fastest window is below ``floor`` of arm 0's slowest.

    Args:
        windows: Each arm's window throughputs so far (arm 0: the incumbent).
        cuttable: Which arms may be retired (``cuttable_arms``); None: every arm but 0.
        floor: The share of the incumbent's rate below which an arm is hopeless.
        first_fast: How much faster than its later ones a first window can run.
    """
    if not windows or not windows[0]:
        # Nothing to compare with: every arm measures on.
        return []
    reference = windows[0]
    out = []
    for i, w in enumerate(windows):
        if i == 0 or not w or (cuttable is not None and not cuttable[i]):
            continue
        if len(w) == 1 or len(reference) == 1:
            hopeless = max(w) < floor / first_fast * min(reference)
        else:
            hopeless = max(w) < floor * min(reference)
        if hopeless:
            out.append(i)
    return out


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
