"""The batch-size stage: real memory probes, then throughput candidates through a ``KnobStage``."""

from __future__ import annotations

from typing import Any

from trainopt.contract.distributed import grad_accum_for
from trainopt.decide import batch as batch_mod
from trainopt.decide import plan
from trainopt.search.errors import SearchFailed
from trainopt.search.knob_stage import KnobStage

__all__ = ["run_batch_stage", "lr_hint"]


def lr_hint(old: int, new: int, effective_batch: int | None, grad_accum: int) -> str:
    """What a batch-size change means for the learning rate."""
    if effective_batch is None:
        return (
            f"batch_size changed {old} -> {new}, which changes the optimisation: with the linear scaling "
            f"rule, multiply the learning rate by {new / old:g} (and consider a warm-up), or set "
            f"limits.effective_batch to keep batch_size x grad_accum (x ranks) fixed"
        )
    return f"effective batch kept at {effective_batch} (grad_accum {grad_accum}): no learning-rate change needed"


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
    finder = batch_mod.BatchSizeSearch(start=incumbent["batch_size"], maximum=maximum, margin=bs.margin,
                                       max_first=not plan.memory_bound(stage.broker.device_type, spec.limits.memory_gb))
    probes = []
    largest: dict[str, Any] | None = None
    while (size := finder.next_probe()) is not None:
        settings = plan.with_knob(incumbent, "batch_size", size)
        r = stage.broker.trial(settings, stage="batch", knob="batch_size", role="probe", tag=str(size), mode="probe")
        # Any failure counts as "does not fit": a size that crashed or hung is never
        # worth adopting, and the probe's status says why it was ruled out.
        finder.record(size, r.ok)
        probes.append({"size": size, "fits": r.ok, "status": r.status, "peak_memory_bytes": r.peak_memory_bytes, "error": r.error})
        # Every probe batch is made of the largest sampled items; the biggest probe's figures say which.
        items = getattr(r, "probe_items", None)
        if items and (largest is None or size >= largest["batch_size"]):
            largest = {**items, "batch_size": size}
    safe = finder.safe_maximum
    batch_info.clear()
    batch_info.update(
        start=incumbent["batch_size"], limit=maximum, max_fitting=finder.largest_fitting, safe_max=safe, margin=bs.margin, probes=probes
    )
    if largest is not None:
        batch_info["probe_items"] = largest
    if safe is None:
        raise SearchFailed(f"not even batch_size {probes[-1]['size']} fits in memory; lower the model size or raise limits.memory_gb")
    cands = []
    for size in batch_mod.throughput_candidates(incumbent["batch_size"], safe, bs.max_candidates, eff, spec.world_size):
        settings = plan.with_knob(incumbent, "batch_size", size)
        if eff is not None:
            # batch_size is per rank: grad_accum keeps batch_size x grad_accum x ranks at the effective batch.
            settings["grad_accum"] = grad_accum_for(eff, size, spec.world_size)
        cands.append(settings)
    if not cands:
        return incumbent
    adopted = stage.screen_and_decide(incumbent, cands, "batch_size", "batch")
    if adopted is not incumbent:
        batch_info["lr_hint"] = lr_hint(incumbent["batch_size"], adopted["batch_size"], eff, adopted["grad_accum"])
    return adopted
