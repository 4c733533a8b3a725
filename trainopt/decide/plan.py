"""What to try and in which order: pure functions over settings.

The order follows the training-speed checklist (batch size, precision, layout, input
pipeline, host overhead, backend flags, compilation) unless the spec asks for its own
order; the baseline's bottleneck (``bottleneck.diagnose``) moves the stages that act on it
to the front: the input pipeline when the step waits for data, host overhead and
compilation when the host is the limit, because a faster model step changes little while
something else bounds the step.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from typing import Any, Mapping, Sequence

from trainopt.decide import bottleneck as bottlenecks
from trainopt.knobs import catalog as knobs

__all__ = [
    "knob_order",
    "candidates",
    "settings_hash",
    "with_knob",
    "remaining_trials",
    "remaining_in_knob",
    "confirmation_left",
    "loader_gain_bound",
    "expected_to_confirm_nothing",
    "kept_states",
    "start_state",
    "search_remaining",
    "typical_batch_probes",
    "memory_bound",
    "arm_kind",
    "KINDS",
    "PROCESS_COUNT",
    "prior_cost",
    "arm_cost",
    "ArmCosts",
]


def knob_order(search: Mapping[str, Any], order: str = "guide", bottleneck: str = "compute") -> list[str]:
    """The knobs of ``search`` in the order they are tried.

    With the ``guide`` order, the stages the bottleneck puts first
    (``bottleneck.FIRST_STAGES``) come first, in that order; the other stages follow in
    the checklist's order (``catalog.STAGES``); within a stage, knobs keep the order written.

    Args:
        search: The spec's search section (knob -> candidates), in the order written.
        order: ``guide`` (checklist stages) or ``as_written``.
        bottleneck: The baseline's verdict (``bottleneck.VERDICTS``); guide order only.
    """
    names = list(search)
    if order == "as_written":
        return names
    first = bottlenecks.FIRST_STAGES.get(bottleneck, ())
    rest = [stage for stage in knobs.STAGES if stage not in first]
    stage_rank = {stage: i for i, stage in enumerate((*first, *rest))}
    return sorted(names, key=lambda n: (stage_rank[knobs.KNOBS[n].stage], names.index(n)))


# The measured loader wait is doubled before it bounds a loader change (``loader_gain_bound``):
# a share of a few windows, measured in one process, is itself uncertain.
LOADER_WAIT_SAFETY = 2.0


def loader_gain_bound(knob: str, incumbent: Mapping[str, Any], data_wait_fraction: float | None) -> float | None:
    """The most a change of ``knob`` can speed up ``incumbent``, when its input pipeline bounds it.

    Loader workers can only take the loading off the training loop: a step cannot get
    shorter than it is minus the time the loop spends fetching its batch (everything
    ``next()`` on the loader costs, which is what ``data_wait_fraction`` measures). From
    ``num_workers`` 0 that bounds the speedup by ``1 / (1 - w)`` for a wait share ``w``,
    taken here at ``LOADER_WAIT_SAFETY`` times the measured share. Other loader knobs act
    where a window need not see it (worker restarts at epoch boundaries, pinned copies
    outside ``next()``), so they get no bound.

    Returns:
        The bound, or None where there is none.
    """
    if knob != "num_workers" or incumbent.get("num_workers") != 0 or data_wait_fraction is None:
        return None
    w = min(0.99, LOADER_WAIT_SAFETY * max(0.0, float(data_wait_fraction)))
    return 1.0 / (1.0 - w)


# CPU instructions that make bf16 matmuls and convolutions fast (without them PyTorch emulates
# bf16: the demo's bf16 arms screened at 0.055-0.09x in 19 runs on two CPUs without them).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def expected_to_confirm_nothing(knob: str, device_type: str | None, cpu_flags: Sequence[str] | None,
                                values: Sequence[Any]) -> bool:
    """Whether a knob's screen is expected to select nothing here (for the ETA only).

    Reduced precision on a CPU without bf16 instructions: bf16 is emulated there and fp16
    has no fast kernels, so every candidate screens far below the incumbent. Nothing is
    decided from this; the screen still measures every candidate.
    """
    if knob != "amp" or device_type != "cpu" or cpu_flags is None:
        return False
    return not set(BF16_CPU_FLAGS) & set(cpu_flags) and all(v in ("off", "bf16", "fp16") for v in values)


def with_knob(settings: Mapping[str, Any], name: str, value: Any) -> dict[str, Any]:
    """A copy of ``settings`` with one knob changed."""
    out = dict(settings)
    out[name] = value
    return out


def candidates(incumbent: Mapping[str, Any], name: str, values: Sequence[Any]) -> list[dict[str, Any]]:
    """One settings dict per candidate value that differs from the incumbent's."""
    return [with_knob(incumbent, name, v) for v in values if v != incumbent.get(name)]


def settings_hash(settings: Mapping[str, Any]) -> str:
    """A short, stable content hash of a settings dict (trial identity)."""
    return hashlib.sha256(json.dumps(dict(settings), sort_keys=True, default=str).encode()).hexdigest()[:12]


# Memory probes a batch-size stage usually takes (growth by doubling, then bisection)
# when nothing else is known; ``typical_batch_probes`` counts them from the spec.
TYPICAL_BATCH_PROBES = 8
# Bisection probes after the first out-of-memory (5 % tolerance on multiples of 8: 4-5).
TYPICAL_BISECTION_PROBES = 4


def memory_bound(device_type: str | None, memory_gb: float | None) -> bool:
    """Whether a batch-size probe can fail for memory below the spec's maximum.

    On a GPU, or under ``limits.memory_gb``, memory is what bounds the batch; on a CPU
    without a cap the host's RAM is far above what the batch sizes worth trying need, so
    the batch stage probes the maximum first (``BatchSizeSearch.max_first``).
    """
    return device_type == "cuda" or memory_gb is not None


def typical_batch_probes(start: int, maximum: int, memory_bound: bool) -> int:
    """Probes the batch-size stage will likely run: the maximum alone where memory is not
    the bound; else doubling from ``start`` to ``maximum`` plus the typical bisection.

    Args:
        start: The baseline's batch size.
        maximum: The spec's ``search.batch_size.max``.
        memory_bound: Whether a probe can fail for memory before the maximum (``memory_bound()``).
    """
    from trainopt.decide.batch import BatchSizeSearch

    search = BatchSizeSearch(start=start, maximum=maximum, max_first=not memory_bound)
    while (size := search.next_probe()) is not None:
        search.record(size, True)
    return len(search.probes) + (TYPICAL_BISECTION_PROBES if memory_bound else 0)


# For the ETA, before a knob's screen: confirmations per knob (the screen selects at most
# two, the second is confirmed only when the first is not improved, and a screen often
# drops every candidate), and the share of knobs whose change is kept (each kept change
# adds its held-out pairs). Both from nine demo searches in benchmarks/RESULTS.md on two
# machine types (runs B-E, with bf16 units: 14 confirmations in 16 knob stages, 8 kept;
# runs H-L, without: 15 in 20, 5 kept): 29 confirmations in 36 knob stages, 13 kept.
# After the screen the stage says how many it selected; of the three screens in runs B-E
# that selected two, all three confirmed both, so the second is counted at three quarters,
# and a knob that selected a candidate keeps a change about half the time.
TYPICAL_CONFIRMATIONS = 0.8
TYPICAL_KEPT_SHARE = 0.36
SECOND_CONFIRMATION_SHARE = 0.75
KEPT_AFTER_SELECTION = 0.5
# A confirmation that went on past a look goes on past the next one too about this often:
# of the 28 confirmations that went past their first look in the demo runs H-T (looks at 6,
# 9 and 14 pairs), 11 stopped at 9 and 17 ran to 14.
CONTINUE_SHARE = 0.6

# What one session arm costs against a plain arm, by its settings. A compiled arm compiles
# in every process (from the warm cache): in demo runs I and J (2026-12-05) a pair with one
# compiled arm took 8.6-10.6 s against 4.6-6.0 s for a plain pair of the same batch size, so
# the compiled arm cost about 2.6 plain ones (2.4-2.8 over runs H-M). Once compile is kept,
# every later arm compiles.
COMPILED_ARM_COST = 2.6
# What the other kinds of trial cost, in plain confirmation arms; per search the median
# wall of each kind over the median plain confirmation arm's share, six demo searches (runs
# H-M, benchmarks/eta_replay.py): the baseline, a one-shot fresh process with its own full
# warm-up, 1.9-2.6; a batch probe 1.4-2.2; a screen arm 1.0-2.2 (larger batches and slow
# candidates take longer over their warm-up steps); the one-shot cold-compile trial 14-16
# from a cold compiler cache (3.7-4.4 from a warm one, for a search run again). The diagnosis
# trial of the recommended settings after the final check is a one-shot fresh process with a
# profiled window, like the baseline trial, and is priced as one. A training-check run is a
# one-shot fresh process too, without the timed windows but with its 40 steps: priced as a
# probe until the search has timed one (``ArmCosts`` learns each kind's price).
ROLE_COST = {"baseline": 2.4, "diagnosis": 2.4, "probe": 1.8, "screen": 1.4, "training": 1.8}
COLD_COMPILE_COST = 14.0


def arm_kind(settings: Mapping[str, Any] | None = None, role: str = "") -> str:
    """Which kind of trial process the ETA prices: ``cold-compile``, or the role's kind
    (``baseline``, ``diagnosis``, ``probe``, ``screen``; ``plain`` for the arms of
    confirmation, held-out and final-check sessions) with ``+compiled`` for a compiled one."""
    if role == "cold-compile":
        return "cold-compile"
    base = role if role in ROLE_COST else "plain"
    return base + ("+compiled" if settings and settings.get("compile", "off") != "off" else "")


# Every kind ``arm_kind`` names; ``PROCESS_COUNT`` prices each at one process, so that
# ``search_remaining`` with it counts trial processes instead of plain arms.
KINDS = ("cold-compile",) + tuple(f"{base}{c}" for base in ("plain", *ROLE_COST) for c in ("", "+compiled"))
PROCESS_COUNT = {kind: 1.0 for kind in KINDS}


def prior_cost(kind: str) -> float:
    """What a kind of trial process costs in plain arms before this search measured any:
    the demo's figures above (``ROLE_COST``, ``COMPILED_ARM_COST``, ``COLD_COMPILE_COST``)."""
    if kind == "cold-compile":
        return COLD_COMPILE_COST
    base, _, compiled = kind.partition("+")
    return max(COMPILED_ARM_COST if compiled else 1.0, ROLE_COST.get(base, 1.0))


def arm_cost(settings: Mapping[str, Any] | None = None, role: str = "",
             costs: Mapping[str, float] | None = None) -> float:
    """What one trial process costs, in plain session arms (for the ETA).

    Args:
        settings: The trial's settings (a compiled arm costs more).
        role: The trial's role: ``cold-compile`` for the one-shot cold-compile trial,
            the roles in ``ROLE_COST`` for the others that cost more than a plain arm.
        costs: Prices by ``arm_kind`` learned from this search (``ArmCosts.costs``); a
            kind it does not name is priced at its ``prior_cost``.
    """
    kind = arm_kind(settings, role)
    if costs is not None and kind in costs:
        return float(costs[kind])
    return prior_cost(kind)


# How many measured trials the prior price of a kind is worth: after n trials of a kind its
# price is (PRIOR_WEIGHT * prior + n * measured mean) / (PRIOR_WEIGHT + n). One: the priors
# come from one CPU, and a GPU's start-up and compile costs put the kinds 2-3x apart from it.
PRIOR_WEIGHT = 1.0
# A kind that has no measured trials of its own but one that costs alike: the diagnosis trial
# of the recommended settings is a one-shot fresh process with a profiled window, as the
# baseline trial is (it runs last, so it is never measured before it is priced).
LIKE = {"diagnosis": "baseline", "diagnosis+compiled": "baseline+compiled"}


class ArmCosts:
    """What each kind of trial process costs in this search, learned from its own trials.

    A plain arm (a confirmation, held-out or final-check session arm without compile) is
    the unit. Its price in seconds is the median of the recent ``RECENT`` arms, each of
    them converted to plain arms by its kind's price at the time; recent, because a
    trial's cost follows the incumbent (a larger batch adopted makes every later arm
    dearer), the median so that one very slow arm does not set the price of the rest.

    Every other kind (``arm_kind``) starts at its ``prior_cost`` and moves to the mean of
    the ratios measured in this search as its trials finish (``PRIOR_WEIGHT``). A ratio is
    a trial's wall time over the plain arms' price of that time (the median of the recent
    plain arms; trials that finished before any plain arm are measured against the first
    ones). A session is observed as a whole: its arms ran side by side, so its wall time
    is known only for all of them together. Where its arms are of several kinds, the
    cheaper kinds are taken at their current prices and what is left is the dearest
    kind's (a compiled arm beside a plain one).
    """

    RECENT = 16

    def __init__(self) -> None:
        self._ratios: dict[str, list[float]] = {}
        self._plain: list[float] = []
        self._walls: list[float] = []
        self._pending: list[tuple[tuple[str, ...], float]] = []

    def cost(self, kind: str) -> float:
        """The price of one process of ``kind`` in plain arms (1 for a plain arm)."""
        if kind == "plain":
            return 1.0
        prior = prior_cost(kind)
        measured = self._ratios.get(kind) or self._ratios.get(LIKE.get(kind, ""), [])
        return (PRIOR_WEIGHT * prior + sum(measured)) / (PRIOR_WEIGHT + len(measured))

    def costs(self) -> dict[str, float]:
        """The price of every kind measured so far, for ``arm_cost``'s ``costs``."""
        kinds = set(self._ratios) | {k for k, v in LIKE.items() if v in self._ratios}
        return {k: self.cost(k) for k in kinds}

    def measured(self, kind: str) -> int:
        """How many trials of ``kind`` its price has learned from."""
        return len(self._ratios.get(kind, ()))

    def unit(self) -> float | None:
        """Seconds per plain arm now, or None before any trial finished."""
        return statistics.median(self._walls[-self.RECENT:]) if self._walls else None

    def observe(self, kinds: Sequence[str], wall_s: float) -> None:
        """One trial (one kind) or one session (a kind per arm) took ``wall_s`` seconds."""
        kinds = tuple(kinds)
        if not kinds or not wall_s or wall_s <= 0:
            return
        per_arm = wall_s / sum(self.cost(k) for k in kinds)
        self._walls.extend([per_arm] * len(kinds))
        if all(k == "plain" for k in kinds):
            self._plain.extend([wall_s / len(kinds)] * len(kinds))
            pending, self._pending = self._pending, []
            for old in pending:
                self._learn(*old)
        elif self._plain:
            self._learn(kinds, wall_s)
        else:
            self._pending.append((kinds, wall_s))

    def observe_priced(self, wall_s: float, cost: float) -> None:
        """A trial of unknown kind that took ``wall_s`` and was priced at ``cost`` plain arms:
        it sets the plain arm's price only."""
        if wall_s and wall_s > 0 and cost > 0:
            self._walls.append(wall_s / cost)

    def _learn(self, kinds: tuple[str, ...], wall_s: float) -> None:
        ref = statistics.median(self._plain[-self.RECENT:])
        dearest = max(kinds, key=lambda k: (k != "plain", self.cost(k)))
        known = sum(self.cost(k) * ref for k in kinds if k != dearest)
        count = sum(1 for k in kinds if k == dearest)
        # A session faster than its cheaper arms' prices leaves nothing for the dearest: its
        # ratio is floored at a tenth of its prior rather than at zero or below.
        ratio = max(0.1 * prior_cost(dearest), (wall_s - known) / count / ref)
        self._ratios.setdefault(dearest, []).append(ratio)


def remaining_trials(knob_names: Sequence[str], search: Mapping[str, Any], *, confirm_pairs: int, holdout_pairs: int,
                     final_pairs: float, batch_candidates: int, skip: Sequence[str] = (),
                     incumbent: Mapping[str, Any] | None = None, baseline: Mapping[str, Any] | None = None,
                     batch_probes: int = TYPICAL_BATCH_PROBES, state: tuple[float, float, float] | None = None,
                     screen_only: Sequence[str] = (), costs: Mapping[str, float] | None = None) -> float:
    """A rough count of the trial processes left (probes and session arms), for the ETA.

    Per knob: the screen session (incumbent and candidates), the typical number of
    confirmations at ``confirm_pairs`` two-arm sessions each, the held-out pairs of a kept
    change at the typical share; then the final check's pairs. Each arm is weighted by
    ``arm_cost``: a compiled arm (every arm once compile is kept, a compile candidate
    before) counts as more than one, and the compile stage adds its cold-compile trial
    per compiled candidate.

    Args:
        knob_names: The knobs not decided yet.
        search: The spec's search section (knob -> candidates).
        confirm_pairs: Pairs a confirmation typically takes (the rule's first look that can decide).
        holdout_pairs: Fresh pairs measured after an improved verdict.
        final_pairs: Pairs of the final check (may be a fraction: an expected count).
        batch_candidates: Throughput candidates of the batch-size stage.
        skip: Knobs that run nothing (none of their values applies on this device).
        incumbent: The settings now adopted (default: nothing compiled).
        baseline: The baseline's settings, the final check's other arm (default: not compiled).
        batch_probes: Memory probes of the batch-size stage (``typical_batch_probes``).
        state: Where the held-out sessions stand before these knobs (``kept_states``);
            default: none kept yet when ``incumbent`` is the baseline, else settled.
        screen_only: Knobs expected to confirm nothing (``loader_gain_bound`` below the margin,
            ``expected_to_confirm_nothing``).
        costs: Prices learned from this search (``arm_cost``); default: the priors.
    """
    remaining = 0.0
    inc = arm_cost(incumbent, costs=costs)
    compiled = {"compile": "default"}
    if state is None:
        state = start_state(incumbent, baseline)
    # After a kept change, held-out sessions also run the baseline (the final check's arm);
    # the first kept change measures none of its own until later (``search.holdout``).
    third = arm_cost(baseline, costs=costs) if baseline is not None else 0.0
    for name in knob_names:
        if name in skip:
            continue
        if name == "batch_size":
            cands = batch_candidates
            remaining += batch_probes * arm_cost(incumbent, "probe", costs)
        else:
            cands = max(1, len(search[name]) - 1)
        cand = arm_cost(compiled, costs=costs) if name == "compile" else inc
        keep = 0.0 if name in screen_only else TYPICAL_KEPT_SHARE
        confirmations = 0.0 if name in screen_only else min(float(cands), TYPICAL_CONFIRMATIONS)
        screen = arm_cost(incumbent, "screen", costs)
        held_now = state[1] + state[2]
        remaining += (screen + cands * (arm_cost(compiled, "screen", costs) if name == "compile" else screen)
                      + confirmations * confirm_pairs * (inc + cand) + keep * held_now * holdout_pairs * (inc + cand + third))
        state = kept_states(state, [keep])[-1]
        if name == "compile":
            remaining += arm_cost(compiled, "cold-compile", costs) * sum(1 for v in search[name] if v != "off")
    final = inc + (TYPICAL_KEPT_SHARE * (arm_cost(compiled, costs=costs) - inc) if "compile" in knob_names and "compile" not in skip else 0.0)
    return remaining + final_pairs * (arm_cost(baseline, costs=costs) + final)


def start_state(incumbent: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None,
                pending: bool = False) -> tuple[float, float, float]:
    """Where the held-out sessions stand now, as ``kept_states`` counts them.

    Args:
        incumbent: The settings adopted so far (None: unknown, taken as settled).
        baseline: The baseline's settings.
        pending: The first kept change's held-out pairs are still owed.
    """
    if incumbent is not None and baseline is not None and settings_hash(incumbent) == settings_hash(baseline):
        return (1.0, 0.0, 0.0)
    return (0.0, 1.0, 0.0) if pending else (0.0, 0.0, 1.0)


def kept_states(start: tuple[float, float, float], keeps: Sequence[float]) -> list[tuple[float, float, float]]:
    """How likely each held-out situation is before each knob and after the last.

    The three situations: no change kept; one kept, whose held-out pairs are still owed (a
    later kept change's held-out sessions measure it, else it measures its own at the end);
    held-out pairs settled. A knob keeps a change with its probability in ``keeps``.

    Returns:
        ``len(keeps) + 1`` triples of probabilities, the first ``start``.
    """
    out = [start]
    for q in keeps:
        none, owed, settled = out[-1]
        out.append((none * (1 - q), owed * (1 - q) + none * q, settled + owed * q))
    return out


def held_out_third_arm(incumbent: Mapping[str, Any] | None, baseline: Mapping[str, Any] | None,
                       costs: Mapping[str, float] | None = None) -> float:
    """The cost of the baseline arm a held-out session adds once a change is kept (0 before)."""
    if incumbent is None or baseline is None or settings_hash(incumbent) == settings_hash(baseline):
        return 0.0
    return arm_cost(baseline, costs=costs)


def confirmation_left(measured: int, next_look: int, looks: Sequence[int]) -> float:
    """Pairs a confirmation is still expected to take once its rule went on past a look.

    Every pair up to ``next_look`` is certain (the rule cannot stop before it); each later
    look is reached at ``CONTINUE_SHARE`` of the one before.

    Args:
        measured: Pairs measured so far.
        next_look: The rule's next look (``SequentialRule.next_look``).
        looks: The rule's look sizes, in order.
    """
    left, reach, last = float(max(0, next_look - measured)), 1.0, next_look
    for n in sorted(looks):
        if n > last:
            reach *= CONTINUE_SHARE
            left += reach * (n - last)
            last = n
    return left


def remaining_in_knob(selected: int, *, confirm_pairs: int, holdout_pairs: int, pair_cost: float = 2.0,
                      third_arm: float = 0.0, held_now: float = 1.0,
                      confirming: tuple[int, int, int, Sequence[int]] | None = None) -> float:
    """Trial processes a knob still runs after its screen selected ``selected`` candidates.

    The first is confirmed; a second only when the first is not improved (taken as
    ``SECOND_CONFIRMATION_SHARE`` of the time); a kept change adds its held-out sessions
    (taken as ``KEPT_AFTER_SELECTION``). ``pair_cost`` is a pair's two arms by ``arm_cost``;
    ``third_arm`` the baseline arm of each held-out session (``held_out_third_arm``);
    ``held_now`` the chance that a kept change measures its held-out sessions now (0 for
    the first kept change, which measures them later or never: ``kept_states``).
    ``confirming`` is ``(index, measured, next_look, looks)`` while a confirmation runs:
    which of the selected candidates it confirms (0 or 1), how many pairs it measured, and
    its rule's next look and look sizes; its pairs are then counted by ``confirmation_left``.
    """
    if selected <= 0:
        return 0.0
    held = KEPT_AFTER_SELECTION * held_now * holdout_pairs * (pair_cost + third_arm)
    if confirming is not None:
        index, measured, next_look, looks = confirming
        later = SECOND_CONFIRMATION_SHARE * (selected - 1 - index) if index == 0 else 0.0
        return pair_cost * (confirmation_left(measured, next_look, looks) + later * confirm_pairs) + held
    confirmations = 1.0 + SECOND_CONFIRMATION_SHARE * (selected - 1)
    return pair_cost * confirmations * confirm_pairs + held


def search_remaining(order: Sequence[str], knobs_done: int, search: Mapping[str, Any], *, confirm_pairs: int,
                     holdout_pairs: int, final_pairs: int, batch_candidates: int, skip: Sequence[str] = (),
                     incumbent: Mapping[str, Any] | None = None, baseline: Mapping[str, Any] | None = None,
                     selected: int | None = None, reusable: int = 0, batch_probes: int = TYPICAL_BATCH_PROBES,
                     pending: bool = False, screen_only: Sequence[str] = (),
                     confirming: tuple[int, int, int, Sequence[int]] | None = None,
                     costs: Mapping[str, float] | None = None) -> float:
    """Trial processes left in the whole search, in plain arms: what the progress ETA counts down.

    The final check is counted as far as it is expected: the last kept change's held-out
    sessions are its pairs, so it measures only the pairs it has beyond those (none by
    default), and only when some change is kept. The first kept change measures its
    held-out sessions at the end, and only if no later change is kept (``kept_states``).
    Each knob still to decide keeps a change at ``TYPICAL_KEPT_SHARE`` (the current one,
    after its screen selected some, at ``KEPT_AFTER_SELECTION``). The one-shot diagnosis
    trial of the recommended settings after the final check runs only when they differ from
    the baseline, so it is counted at the chance that some change is kept.

    Args:
        order: The search order of the knobs.
        knobs_done: Knobs decided so far.
        search: The spec's search section.
        confirm_pairs: Pairs a confirmation typically takes.
        holdout_pairs: Fresh pairs measured after an improved verdict.
        final_pairs: Pairs of the final check.
        batch_candidates: Throughput candidates of the batch-size stage.
        skip: Knobs that run nothing on this device.
        incumbent: The settings adopted so far.
        baseline: The baseline's settings.
        selected: After the current knob's screen: how many candidates it selected for
            confirmation (the rest of that knob is then counted from it).
        reusable: Pairs of the baseline against the incumbent from the last kept change's
            held-out sessions, which the final check reuses if no later knob keeps another.
        batch_probes: Memory probes of the batch-size stage.
        pending: The first kept change's held-out pairs are still owed.
        screen_only: Knobs expected to confirm nothing (``loader_gain_bound`` below the margin,
            ``expected_to_confirm_nothing``).
        confirming: While the current knob confirms a candidate (``remaining_in_knob``).
        costs: Prices learned from this search (``ArmCosts.costs``); default: the priors.
            With every kind at 1 the figure is a count of trial processes.
    """
    later = [k for k in order[knobs_done + (1 if selected is not None else 0):] if k not in skip]
    keeps = [0.0 if k in screen_only else TYPICAL_KEPT_SHARE for k in later]
    if selected is not None:
        # The current knob comes first.
        keeps.insert(0, KEPT_AFTER_SELECTION if selected > 0 else 0.0)
    start = start_state(incumbent, baseline, pending)
    states = kept_states(start, keeps)
    end = states[-1]
    none = math.prod(1.0 - p for p in keeps)
    # A later kept change's held-out sessions bring the final check's pairs with them; the
    # first kept change's, owed to the end when no later one is kept, are its pairs too.
    beyond = max(0, final_pairs - holdout_pairs)
    settled_before = start[2] * none
    final = (end[1] * final_pairs + settled_before * (final_pairs - min(reusable, final_pairs))
             + (end[2] - settled_before) * beyond)
    remaining = remaining_trials(
        later, search, confirm_pairs=confirm_pairs, holdout_pairs=holdout_pairs, final_pairs=final,
        batch_candidates=batch_candidates, incumbent=incumbent, baseline=baseline, batch_probes=batch_probes,
        state=states[1] if selected is not None else start, screen_only=screen_only, costs=costs,
    )
    # Settings other than the baseline's are recommended only after a kept change.
    remaining += (1.0 - end[0]) * arm_cost(incumbent, "diagnosis", costs)
    if selected is not None:
        knob = order[knobs_done]
        inc = arm_cost(incumbent, costs=costs)
        cand = arm_cost({"compile": "default"}, costs=costs) if knob == "compile" else inc
        remaining += remaining_in_knob(selected, confirm_pairs=confirm_pairs, holdout_pairs=holdout_pairs, pair_cost=inc + cand,
                                       third_arm=held_out_third_arm(incumbent, baseline, costs), held_now=start[1] + start[2],
                                       confirming=confirming)
    return remaining
