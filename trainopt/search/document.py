"""The results document of a search: everything it found, as one versioned, JSON-ready dict.

The document is made from the search's plain ``SearchState`` alone, never from the search
object, so a partial, resumed or hand-built state gives one too. ``results.json`` holds it,
and every other output (``trials.csv``, ``best.yaml``, the reports) is made from it
(``outputs.results``).

Schema (``schema_version`` 1)::

    kind: "trainopt-results"; schema_version: 1; trainopt_version; name; spec_fingerprint
    complete: bool               # false while running or after an interruption
    missing: [knob, ...]         # knobs not decided yet (partial results)
    started_at, updated_at: ISO 8601; elapsed_s
    diagnosis: {bottleneck: input|sync|host|compute|unknown, reason, text, data_wait_fraction,
                breakdown}   # the baseline's bottleneck (trainopt/decide/bottleneck.py);
                             # breakdown: the baseline trial's profiled window (steps, wall_s,
                             # seconds and shares per phase, device_type, device_busy, ...) or
                             # null (no profiled window: the verdict then rests on
                             # data_wait_fraction alone)
    final_diagnosis: same shape as diagnosis, for the recommended settings when they are not
                     the baseline's (one diagnosed trial after the final check, role
                     "diagnosis"); null otherwise, before it ran, or when it failed
    final_diagnosis_error: why that diagnosis trial failed, or null
    run_costs: {budget, step_time_s, checkpoint?: {cost_s, every_steps, share,
                every_steps_for_budget, within_budget}, evaluation?: {..., eval_batches}}
                or null      # the spec's run_costs at the baseline's step time
                             # (trainopt/decide/run_costs.py); null without a measurement
    search_order: [knob, ...]
    baseline: {settings, samples_per_s, step_time_s, data_wait_fraction, peak_memory_bytes, workload}
                                 # workload: what the baseline trial trained (the loss form, the
                                 # optimizer it built), or null (trainopt/trial/workload_record.py)
    best: {settings, samples_per_s, source, reason, n_pairs}
                                 # the recommended settings: source is final-check,
                                 # first-kept-change or baseline (see trainopt/decide/recommendation.py)
    speedup, speedup_ci: [low, high] | null   # of best against the baseline (null while partial
                                 # and nothing is confirmed)
    final: {verdict, reason, n_pairs, speedup, ci, samples_per_s, baseline_samples_per_s,
            contradicted, claim_check: {claim, upper, level, contradicted, n_pairs},
            claim_text, reused_pairs?, unstable?}
                                 # the final check of the final settings, whatever its verdict;
                                 # claim_text: the contradiction test in plain words;
                                 # reused_pairs: how many of its pairs are the only kept
                                 # change's held-out pairs (the same comparison)
    training_check: {verdict: same|worse|diverged|inconclusive|not_needed|not_checked, reason,
                     steps, tail_steps, settings, rounds: [{settings, reference, twin, recommended,
                     verdict, reason, tail_steps, reference_tail, twin_tail, candidate_tail,
                     twin_gap, noise_floor, yardstick, tolerance, alone?: [...]}],
                     dropped: [{knob, value, reason}], final_checks?: [...], batch_change?}
                     | null      # each run: {settings, order_seed, status, error, losses,
                                 # scaler_skipped}; dropped knobs are left out of best even
                                 # though their speed verdicts stand; final_checks: the final
                                 # checks that dropping replaced (trainopt/search/training_check.py)
    decisions: [{knob, stage, from, to, verdict, reason, speedup, ci, n_pairs, screen_speedup,
                 before_samples_per_s, after_samples_per_s, before_peak_memory_bytes,
                 after_peak_memory_bytes, kept, extra}]
    trials: [{id, key, stage, knob, role, tag, mode, settings, status, samples_per_s,
              peak_memory_bytes, step_time_s, data_wait_fraction, windows, steady_from,
              steady, compile_s, warmup_s, wall_s, error, log}]
    batch_size: {start, limit, max_fitting, safe_max, margin, probes: [{size, fits, status,
                 peak_memory_bytes, pass}], lr_hint, probe_items?, edge_probe?, second_pass?}
                                 # edge_probe: {size, fits, status, peak_memory_bytes, after}: the
                                 # incumbent at the first pass's out-of-memory size after a kept change;
                                 # second_pass: {start, probed_from, limit, max_fitting, safe_max, margin,
                                 # probes (pass 2), freed_by, adopted} when that size fitted
                                 # probe_items: each probe batch held the largest items of a
                                 # sample: {sampled, dataset_len, largest, median, smallest,
                                 # in_batch, unit, batch_size} (of the largest probe)
    env: fingerprint of the machine (from the baseline trial)
    measure: the measurement settings used; counts: {trials_run, trials_reused}
    worth: {basis: run|per_steps, run, steps, samples, samples_per_step, baseline_step_s,
            baseline_hours, recommended_hours, saved_hours, search_hours, paid_back_after_steps,
            money: {currency, device_hour_cost, baseline, recommended, saved, search} | null, note}
                                 # the production run (the spec's run block; without one, 1,000
                                 # baseline steps) at the baseline and the recommended settings;
                                 # ranges are {estimate, low, high} from the speedup's interval
                                 # (trainopt/decide/run_costs.py); null without a baseline figure
    time_budget: {budget_s, not_tried: [{knob, stage, reason, eta_s, left_s}]} | null
                                 # stages the budget left out (measure.time_budget or --time-budget)
    error_rates: {scope, knobs, per_knob, search, text}   # the chance of adopting a change
                                 # without effect, per knob and for the whole search
                                 # (measure.error_scope; trainopt/decide/sequential.py)
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import Any

from trainopt.decide import plan
from trainopt.decide.recommendation import recommend
from trainopt.decide.run_costs import advise, run_worth, samples_per_step
from trainopt.decide.sequential import false_adoption
from trainopt.search.state import SearchState, TrialRecord
from trainopt.version import __version__

__all__ = ["RESULTS_SCHEMA_VERSION", "build_results"]

RESULTS_SCHEMA_VERSION = 1


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds")


def _trial_row(t: TrialRecord, out_dir: Path) -> dict[str, Any]:
    r = t.result
    log = r.log_path
    if log:
        try:
            log = os.path.relpath(log, out_dir)
        except ValueError:
            pass
    return {
        "id": t.id,
        "key": t.key,
        "stage": t.stage,
        "knob": t.knob,
        "role": t.role,
        "tag": t.tag,
        "mode": t.mode,
        "settings": r.settings,
        "status": r.status,
        "samples_per_s": r.samples_per_s,
        "peak_memory_bytes": r.peak_memory_bytes,
        "step_time_s": r.step_time_s,
        "data_wait_fraction": r.data_wait_fraction,
        "windows": r.windows,
        "steady_from": r.steady_from,
        "steady": r.steady,
        "compile_s": r.compile_s,
        "warmup_s": r.warmup_s,
        "wall_s": r.wall_s,
        "error": r.error,
        "log": log,
        "session": r.session,
        "slot": r.env.get("slot"),
        "node": r.env.get("node"),
        "device": r.env.get("device"),
    }


def build_results(state: SearchState, complete: bool) -> dict[str, Any]:
    """The results document for a search's state (partial or complete)."""
    base = state.baseline
    final = state.final or {}
    rec = recommend(
        base.settings if base else state.baseline_settings, base.samples_per_s if base else None, state.decisions, final,
        dropped=state.dropped_knobs(),
    )
    missing = [k for k in (state.order or state.planned_knobs) if k not in state.done_knobs]
    if not complete and not final:
        missing.append("final check")
    elif not complete and not state.training_check:
        missing.append("training check")
    elif (not complete and state.final_diagnosis is None and state.final_diagnosis_error is None
          and plan.settings_hash(rec.settings) != plan.settings_hash(base.settings if base else state.baseline_settings)):
        # Past the final check, the recommended settings' diagnosis trial is still owed.
        missing.append("final diagnosis")
    decisions = []
    for d in state.decisions:
        row = d.to_dict()
        row["from"] = row.pop("from_value")
        row["to"] = row.pop("to_value")
        decisions.append(row)
    return {
        "kind": "trainopt-results",
        "schema_version": RESULTS_SCHEMA_VERSION,
        "trainopt_version": __version__,
        "name": state.name,
        "spec_fingerprint": state.spec_fingerprint,
        "complete": complete,
        "missing": [] if complete else missing,
        "started_at": dt.datetime.fromtimestamp(state.started).astimezone().isoformat(timespec="seconds"),
        "updated_at": _now(),
        "elapsed_s": time.time() - state.started,
        "diagnosis": state.diagnosis,
        "final_diagnosis": state.final_diagnosis,
        "final_diagnosis_error": state.final_diagnosis_error,
        "run_costs": advise(base.run_costs, state.run_costs, base.step_time_s) if base is not None else None,
        "search_order": state.order,
        "baseline": None
        if base is None
        else {
            "settings": base.settings,
            "status": base.status,
            "samples_per_s": base.samples_per_s,
            "step_time_s": base.step_time_s,
            "data_wait_fraction": base.data_wait_fraction,
            "peak_memory_bytes": base.peak_memory_bytes,
            "error": base.error,
            "workload": base.workload,
        },
        "best": {
            "settings": rec.settings,
            "samples_per_s": rec.samples_per_s,
            "source": rec.source,
            "reason": rec.reason,
            "n_pairs": rec.n_pairs,
        },
        "speedup": rec.speedup,
        "speedup_ci": rec.ci,
        "final": {k: v for k, v in final.items() if k != "settings"},
        "training_check": state.training_check or None,
        "decisions": decisions,
        "trials": [_trial_row(t, state.out_dir) for t in state.trials],
        "batch_size": state.batch_info,
        "env": base.env if base else {},
        "measure": state.measure,
        "error_rates": _error_rates(state),
        "counts": {"trials_run": state.ran, "trials_reused": state.reused},
        "sessions": _sessions_summary(state),
        "stability": state.guard.to_dict() if state.guard is not None else None,
        "machine": state.machine.to_dict() if state.machine is not None else None,
        "warnings": list(state.warnings),
        **_worth_and_budget(state, rec),
    }


def _worth_and_budget(state: SearchState, rec: Any) -> dict[str, Any]:
    """The document's ``worth`` (what the speedup is worth on the production run) and ``time_budget``."""
    base = state.baseline
    worth = None
    if base is not None and base.ok:
        per_step = samples_per_step(base.settings or {}, state.world_size)
        rate = (state.final or {}).get("baseline_samples_per_s") or base.samples_per_s
        worth = run_worth(state.run, baseline_samples_per_s=rate, samples_per_step=per_step, dataset_len=base.dataset_len,
                          speedup=rec.speedup, ci=rec.ci, search_s=time.time() - state.started)
    budget = None
    if state.time_budget_s is not None:
        budget = {"budget_s": state.time_budget_s, "not_tried": list(state.not_tried)}
    return {"worth": worth, "time_budget": budget}


def _error_rates(state: SearchState) -> dict[str, Any]:
    """The chance of adopting a change without effect, per knob and for the whole search, in numbers and words."""
    m = state.measure
    # A second batch pass, where the search may run one, is a family of its own.
    rates = false_adoption(m.get("confidence", 0.95), len(state.planned_knobs) + state.extra_families, m.get("error_scope", "knob"))
    per, whole, k = rates["per_knob"], rates["search"], rates["knobs"]
    rates["text"] = (
        f"a change without effect (no faster than 1 + min_speedup) is adopted with probability at most {per:.2%} per knob, "
        f"so a search of {k} knob{'s' if k != 1 else ''} adopts one or more with probability at most {whole:.1%} "
        f"(measure.error_scope: {rates['scope']}"
        + ("; error_scope: search splits the budget over the knobs to bound the whole search)" if rates["scope"] == "knob" else ")")
        + ", for pair noise symmetric about the true speedup. Each speedup shown is the typical pair's "
        "(a Hodges-Lehmann estimate): where a few pairs run much slower than the rest, the gain in mean "
        "throughput can be lower"
    )
    return rates


def _sessions_summary(state: SearchState) -> dict[str, Any]:
    """How the sessions were measured: how many live-interleaved, how many fell back, and why."""
    seen: dict[str, dict[str, Any]] = {}
    for t in state.trials:
        info = t.result.session
        if info:
            seen.setdefault(info["id"], info)
    notes = sorted({i["note"] for i in seen.values() if i.get("note")})
    return {
        "interleaved": sum(1 for i in seen.values() if i.get("mode") == "interleaved"),
        "sequential": sum(1 for i in seen.values() if i.get("mode") == "sequential"),
        "notes": notes,
    }
