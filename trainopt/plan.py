"""What to try and in which order: pure functions over settings.

The order follows the training-speed checklist (batch size, precision, layout, input
pipeline, host overhead, backend flags, compilation) unless the spec asks for its own
order; when the baseline is input-bound, the input-pipeline knobs go first, because a
faster model step changes nothing while the loader is the bottleneck.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping, Sequence

from trainopt import knobs

__all__ = [
    "INPUT_BOUND_THRESHOLD",
    "diagnose",
    "knob_order",
    "candidates",
    "settings_hash",
    "with_knob",
    "remaining_trials",
]

# Above this share of step time spent waiting for the loader, training is input-bound.
INPUT_BOUND_THRESHOLD = 0.25


def diagnose(data_wait_fraction: float | None) -> dict[str, Any]:
    """Say whether training is input-bound or compute-bound, with the figure behind it."""
    if data_wait_fraction is None:
        return {"bottleneck": "unknown", "data_wait_fraction": None, "text": "no measurement of loader wait time"}
    share = f"{data_wait_fraction:.0%}"
    if data_wait_fraction > INPUT_BOUND_THRESHOLD:
        return {
            "bottleneck": "input",
            "data_wait_fraction": data_wait_fraction,
            "text": f"input-bound: {share} of each step waits for the DataLoader; input-pipeline knobs are tried first",
        }
    return {
        "bottleneck": "compute",
        "data_wait_fraction": data_wait_fraction,
        "text": f"compute-bound: only {share} of each step waits for the DataLoader",
    }


def knob_order(search: Mapping[str, Any], order: str = "guide", bottleneck: str = "compute") -> list[str]:
    """The knobs of ``search`` in the order they are tried.

    Args:
        search: The spec's search section (knob -> candidates), in the order written.
        order: ``guide`` (checklist stages) or ``as_written``.
        bottleneck: From ``diagnose``; ``input`` moves input-pipeline knobs first (guide order only).
    """
    names = list(search)
    if order == "as_written":
        return names
    stage_rank = {stage: i for i, stage in enumerate(knobs.STAGES)}
    if bottleneck == "input":
        stage_rank["input"] = -1
    return sorted(names, key=lambda n: (stage_rank[knobs.KNOBS[n].stage], names.index(n)))


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


# Memory probes a batch-size stage usually takes (growth by doubling, then bisection).
TYPICAL_BATCH_PROBES = 8


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

# What one session arm costs against a plain arm, by its settings. A compiled arm compiles
# in every process (from the warm cache): in demo runs I and J (2026-12-05) a pair with one
# compiled arm took 8.6-10.6 s against 4.6-6.0 s for a plain pair of the same batch size, so
# the compiled arm cost about 2.6 plain ones. Once compile is kept, every later arm compiles.
COMPILED_ARM_COST = 2.6
# The one-shot cold-compile trial, in plain arms: 49-64 s from a cold compiler cache and
# 10 s from a warm one, against plain arms of about 2.7 s in those searches.
COLD_COMPILE_COST = 10.0


def arm_cost(settings: Mapping[str, Any] | None = None, role: str = "") -> float:
    """What one trial process costs, in plain session arms (for the ETA).

    Args:
        settings: The trial's settings (a compiled arm costs ``COMPILED_ARM_COST``).
        role: ``cold-compile`` for the one-shot cold-compile trial.
    """
    if role == "cold-compile":
        return COLD_COMPILE_COST
    return COMPILED_ARM_COST if settings and settings.get("compile", "off") != "off" else 1.0


def remaining_trials(knob_names: Sequence[str], search: Mapping[str, Any], *, confirm_pairs: int, holdout_pairs: int,
                     final_pairs: int, batch_candidates: int, skip: Sequence[str] = (),
                     incumbent: Mapping[str, Any] | None = None, baseline: Mapping[str, Any] | None = None) -> float:
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
        final_pairs: Pairs of the final check.
        batch_candidates: Throughput candidates of the batch-size stage.
        skip: Knobs that run nothing (none of their values applies on this device).
        incumbent: The settings now adopted (default: nothing compiled).
        baseline: The baseline's settings, the final check's other arm (default: not compiled).
    """
    remaining = 0.0
    inc = arm_cost(incumbent)
    compiled = {"compile": "default"}
    for name in knob_names:
        if name in skip:
            continue
        if name == "batch_size":
            cands = batch_candidates
            remaining += TYPICAL_BATCH_PROBES
        else:
            cands = max(1, len(search[name]) - 1)
        cand = arm_cost(compiled) if name == "compile" else inc
        confirmations = min(float(cands), TYPICAL_CONFIRMATIONS)
        remaining += inc + cands * cand + (confirmations * confirm_pairs + TYPICAL_KEPT_SHARE * holdout_pairs) * (inc + cand)
        if name == "compile":
            remaining += COLD_COMPILE_COST * sum(1 for v in search[name] if v != "off")
    final = inc + (TYPICAL_KEPT_SHARE * (arm_cost(compiled) - inc) if "compile" in knob_names and "compile" not in skip else 0.0)
    return remaining + final_pairs * (arm_cost(baseline) + final)


def remaining_in_knob(selected: int, *, confirm_pairs: int, holdout_pairs: int, pair_cost: float = 2.0) -> float:
    """Trial processes a knob still runs after its screen selected ``selected`` candidates.

    The first is confirmed; a second only when the first is not improved (taken as
    ``SECOND_CONFIRMATION_SHARE`` of the time); a kept change adds its held-out pairs
    (taken as ``KEPT_AFTER_SELECTION``). ``pair_cost`` is a pair's two arms by ``arm_cost``.
    """
    if selected <= 0:
        return 0.0
    confirmations = 1.0 + SECOND_CONFIRMATION_SHARE * (selected - 1)
    return pair_cost * (confirmations * confirm_pairs + KEPT_AFTER_SELECTION * holdout_pairs)
