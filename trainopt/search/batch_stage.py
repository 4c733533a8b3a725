"""The batch-size stage: real memory probes, then throughput candidates through a ``KnobStage``.

A second pass repeats both from the final incumbent when the first stopped at a memory
edge, a change was kept later, and a probe shows that edge fits now (``second_pass_reason``).
"""

from __future__ import annotations

from typing import Any

from trainopt.contract.distributed import grad_accum_for
from trainopt.decide import batch as batch_mod
from trainopt.decide import plan
from trainopt.search.errors import SearchFailed
from trainopt.search.knob_stage import KnobStage

__all__ = ["run_batch_stage", "lr_hint", "second_pass_reason", "run_second_batch_pass"]


def lr_hint(old: int, new: int, effective_batch: int | None, grad_accum: int) -> str:
    """What a batch-size change means for the learning rate."""
    if effective_batch is None:
        return (
            f"batch_size changed {old} -> {new}, which changes the optimisation: with the linear scaling "
            f"rule, multiply the learning rate by {new / old:g} (and consider a warm-up), or set "
            f"limits.effective_batch to keep batch_size x grad_accum (x ranks) fixed"
        )
    return f"effective batch kept at {effective_batch} (grad_accum {grad_accum}): no learning-rate change needed"


def _probe(spec: Any, stage: KnobStage, incumbent: dict[str, Any], maximum: int, max_first: bool,
           batch_pass: int) -> tuple[batch_mod.BatchSizeSearch, list[dict[str, Any]], dict[str, Any] | None]:
    """Probe the largest batch that fits from ``incumbent``: the finder, the probes, the largest probe's items."""
    finder = batch_mod.BatchSizeSearch(start=incumbent["batch_size"], maximum=maximum, margin=spec.batch_search.margin,
                                       max_first=max_first)
    probes = []
    largest: dict[str, Any] | None = None
    while (size := finder.next_probe()) is not None:
        settings = plan.with_knob(incumbent, "batch_size", size)
        # The second pass's probes hold other settings (the change that freed memory): their keys differ.
        r = stage.broker.trial(settings, stage="batch", knob="batch_size", role="probe", tag=str(size), mode="probe")
        # Any failure counts as "does not fit": a size that crashed or hung is never
        # worth adopting, and the probe's status says why it was ruled out.
        finder.record(size, r.ok)
        probes.append({"size": size, "fits": r.ok, "status": r.status, "peak_memory_bytes": r.peak_memory_bytes, "error": r.error,
                       "pass": batch_pass})
        # Every probe batch is made of the largest sampled items; the biggest probe's figures say which.
        items = getattr(r, "probe_items", None)
        if items and (largest is None or size >= largest["batch_size"]):
            largest = {**items, "batch_size": size}
    return finder, probes, largest


def _candidates(spec: Any, incumbent: dict[str, Any], safe: int) -> list[dict[str, Any]]:
    """The throughput candidates above the incumbent's batch size up to ``safe`` (grad_accum kept in step)."""
    eff = spec.limits.effective_batch
    cands = []
    for size in batch_mod.throughput_candidates(incumbent["batch_size"], safe, spec.batch_search.max_candidates, eff, spec.world_size):
        settings = plan.with_knob(incumbent, "batch_size", size)
        if eff is not None:
            # batch_size is per rank: grad_accum keeps batch_size x grad_accum x ranks at the effective batch.
            settings["grad_accum"] = grad_accum_for(eff, size, spec.world_size)
        cands.append(settings)
    return cands


def run_batch_stage(spec: Any, stage: KnobStage, incumbent: dict[str, Any], dataset_len: int | None, batch_info: dict[str, Any]) -> dict[str, Any]:
    """Find the largest batch that fits, then adopt the fastest confirmed size up to it.

    Args:
        spec: The validated spec (batch search settings and limits).
        stage: Screens and confirms the throughput candidates.
        incumbent: The incumbent settings.
        dataset_len: The data set's length (no batch is larger), when known.
        batch_info: Filled with the probes and figures (the search state's ``batch_info``).

    Returns:
        The new incumbent.
    """
    bs = spec.batch_search
    eff = spec.limits.effective_batch
    maximum = min(bs.max, dataset_len) if dataset_len else bs.max
    finder, probes, largest = _probe(spec, stage, incumbent, maximum,
                                     not plan.memory_bound(stage.broker.device_type, spec.limits.memory_gb), 1)
    safe = finder.safe_maximum
    batch_info.clear()
    batch_info.update(
        start=incumbent["batch_size"], limit=maximum, max_fitting=finder.largest_fitting, safe_max=safe, margin=bs.margin, probes=probes
    )
    if largest is not None:
        batch_info["probe_items"] = largest
    if safe is None:
        raise SearchFailed(f"not even batch_size {probes[-1]['size']} fits in memory; lower the model size or raise limits.memory_gb")
    cands = _candidates(spec, incumbent, safe)
    if not cands:
        return incumbent
    adopted = stage.screen_and_decide(incumbent, cands, "batch_size", "batch")
    if adopted is not incumbent:
        batch_info["lr_hint"] = lr_hint(incumbent["batch_size"], adopted["batch_size"], eff, adopted["grad_accum"])
    return adopted


def second_pass_reason(spec: Any, stage: KnobStage, incumbent: dict[str, Any], batch_info: dict[str, Any],
                       later: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Why a second batch pass is due, measured: the kept change and the probe that shows memory freed, or None.

    Due when the first pass stopped at a memory edge (a probe ran out of memory), a change
    was kept after it, and one probe of the incumbent at that edge now fits. The probe is
    recorded in ``batch_info["edge_probe"]`` either way.
    """
    if not batch_info or batch_info.get("second_pass") or batch_info.get("edge_probe"):
        return None
    edge = batch_mod.memory_edge(batch_info.get("probes") or [])
    change = batch_mod.freeing_change(later)
    if edge is None or change is None or incumbent["batch_size"] >= edge:
        return None
    settings = plan.with_knob(incumbent, "batch_size", edge)
    r = stage.broker.trial(settings, stage="batch", knob="batch_size", role="probe", tag=f"edge-{edge}", mode="probe")
    batch_info["edge_probe"] = {"size": edge, "fits": r.ok, "status": r.status, "peak_memory_bytes": r.peak_memory_bytes,
                                "error": r.error, "after": change}
    return {**change, "edge": edge, "edge_peak_memory_bytes": r.peak_memory_bytes} if r.ok else None


def run_second_batch_pass(spec: Any, stage: KnobStage, incumbent: dict[str, Any], dataset_len: int | None,
                          batch_info: dict[str, Any], freed: dict[str, Any]) -> dict[str, Any]:
    """Probe the largest fitting batch again from the new incumbent, then screen and confirm the larger sizes.

    The first pass's edge fits now (``second_pass_reason``), so the probes start there.

    The same probes and the same screen-and-confirm rule as the first pass; its decisions are
    marked ``extra.batch_pass = 2`` and its figures go into ``batch_info["second_pass"]``.

    Args:
        spec: The validated spec.
        stage: Screens and confirms the candidates.
        incumbent: The incumbent now (the change that freed memory among its settings).
        dataset_len: The data set's length, when known.
        batch_info: The search state's ``batch_info`` (the first pass's figures).
        freed: The kept change that freed memory and the edge that now fits (``second_pass_reason``).

    Returns:
        The new incumbent.
    """
    bs = spec.batch_search
    eff = spec.limits.effective_batch
    maximum = min(bs.max, dataset_len) if dataset_len else bs.max
    # From the edge that now fits: the ladder above it, then bisection; the incumbent's size fits.
    finder, probes, _ = _probe(spec, stage, plan.with_knob(incumbent, "batch_size", freed["edge"]), maximum, False, 2)
    safe = finder.safe_maximum
    info: dict[str, Any] = {"start": incumbent["batch_size"], "probed_from": freed["edge"], "limit": maximum, "max_fitting": finder.largest_fitting,
                            "safe_max": safe, "margin": bs.margin, "probes": probes, "freed_by": freed, "adopted": None}
    batch_info["second_pass"] = info
    cands = _candidates(spec, incumbent, safe) if safe is not None else []
    if not cands:
        return incumbent
    n0 = len(stage.decisions)
    adopted = stage.screen_and_decide(incumbent, cands, "batch_size", "batch")
    for d in stage.decisions[n0:]:
        d.extra["batch_pass"] = 2
    if adopted is not incumbent:
        info["adopted"] = adopted["batch_size"]
        # The hint is about the whole change from the spec's batch size.
        batch_info["lr_hint"] = lr_hint(batch_info.get("start") or incumbent["batch_size"], adopted["batch_size"], eff,
                                        adopted["grad_accum"])
    return adopted
