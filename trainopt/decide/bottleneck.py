"""What limits a training step, with the figure that decided it, and which knobs that puts first.

A profiled window splits the step's wall time into phases (``trainopt.stats.phases``);
this module reads those shares as the training-speed guide does: first the input pipeline
(does the step wait for data?), then synchronization (does the host block on reads of
device values?), then, on an accelerator, whether the device is busy at all (if it idles
while the host launches work, the host is the limit), and only then compute. Each verdict
moves the checklist stages that act on it to the front of the knob order; the checklist
order stays among the rest. Pure functions over plain data.
"""

from __future__ import annotations

from typing import Any, Mapping

from trainopt.stats.phases import PHASES

__all__ = [
    "INPUT_BOUND_THRESHOLD",
    "SYNC_BOUND_THRESHOLD",
    "HOST_BOUND_BUSY",
    "VERDICTS",
    "FIRST_STAGES",
    "LABELS",
    "diagnose",
    "shares_text",
]

# Above this share of step time spent in ``next()`` on the loader, training is input-bound:
# a faster model step changes little while a quarter of every step waits for data.
INPUT_BOUND_THRESHOLD = 0.25
# Above this share spent reading the loss on the host, the step is bound by synchronization:
# every read drains the device's queue, so the host cannot run ahead.
SYNC_BOUND_THRESHOLD = 0.20
# On an accelerator, below this busy share of wall time the device idles while the host
# launches work (small kernels, Python overhead): the host is the limit.
HOST_BOUND_BUSY = 0.60

VERDICTS = ("input", "sync", "host", "compute", "unknown")

# The checklist stages each verdict moves to the front, in this order.
FIRST_STAGES: dict[str, tuple[str, ...]] = {
    "input": ("input",),
    "sync": ("host", "compile"),
    "host": ("host", "compile"),
    "compute": ("batch", "precision"),
    "unknown": (),
}

# The verdict in two words, for summaries that give the reason beside it.
LABELS = {
    "input": "input-bound",
    "sync": "sync-bound",
    "host": "host-bound",
    "compute": "compute-bound",
    "unknown": "bottleneck unknown",
}

_WORDS = {
    "input": "input-bound: the step waits for data; input-pipeline knobs are tried first",
    "sync": "sync-bound: the host blocks on reads of device values; sync_every, optimizer_impl and compile are tried early",
    "host": "host-bound: the device idles while the host launches work; sync_every, optimizer_impl and compile are tried early",
    "compute": "compute-bound: the model's own math is the limit; batch size and precision are tried first",
}


def _pct(x: float) -> str:
    return f"{100 * x:.0f} %"


def diagnose(
    breakdown: Mapping[str, Any] | None,
    data_wait_fraction: float | None = None,
) -> dict[str, Any]:
    """The bottleneck of a measured configuration, with the figure behind it.

    Args:
        breakdown: The profiled window's figures (``shares`` per phase, ``device_type``,
            ``device_busy`` on an accelerator), or None where none was taken.
        data_wait_fraction: The loader wait share of the timed windows; decides alone
            when there is no breakdown (a result from a trial without the profiled window).

    Returns:
        ``bottleneck`` (one of ``VERDICTS``), ``reason`` (the deciding figure against its
        threshold), ``text`` (the verdict in words), ``data_wait_fraction``, and
        ``breakdown`` (as given).
    """
    out: dict[str, Any] = {"data_wait_fraction": data_wait_fraction, "breakdown": dict(breakdown) if breakdown else None}
    shares = (breakdown or {}).get("shares") or {}
    wait = shares.get("data_wait", data_wait_fraction)
    if wait is None:
        out.update(bottleneck="unknown", reason="no measurement of where the step's time goes",
                   text="no measurement of loader wait time")
        return out
    if wait > INPUT_BOUND_THRESHOLD:
        verdict, reason = "input", f"data_wait {_pct(wait)} of each step > {_pct(INPUT_BOUND_THRESHOLD)}"
    elif shares.get("loss_read", 0.0) > SYNC_BOUND_THRESHOLD:
        verdict, reason = "sync", f"loss_read {_pct(shares['loss_read'])} of each step > {_pct(SYNC_BOUND_THRESHOLD)}"
    elif (breakdown or {}).get("device_busy") is not None and breakdown["device_busy"] < HOST_BOUND_BUSY:
        verdict = "host"
        reason = f"device busy {_pct(breakdown['device_busy'])} of wall time < {_pct(HOST_BOUND_BUSY)}"
    elif shares:
        compute = sum(shares.get(p, 0.0) for p in ("forward", "backward", "optimizer"))
        verdict = "compute"
        reason = f"forward + backward + optimizer {_pct(compute)} of each step; data_wait {_pct(wait)}"
        if (breakdown or {}).get("device_busy") is not None:
            reason += f", device busy {_pct(breakdown['device_busy'])}"
    else:
        verdict, reason = "compute", f"only {_pct(wait)} of each step waits for the DataLoader"
    out.update(bottleneck=verdict, reason=reason, text=f"{_WORDS[verdict]} ({reason})")
    return out


def shares_text(breakdown: Mapping[str, Any] | None) -> str | None:
    """Each phase's share of a profiled step, in the order the phases run: ``data_wait 12 %, forward 40 %, ...``.

    Phases the breakdown does not name are left out; None without a breakdown or shares.
    """
    shares = (breakdown or {}).get("shares") or {}
    if not shares:
        return None
    names = [p for p in PHASES if p in shares] + [p for p in shares if p not in PHASES]
    return ", ".join(f"{p} {_pct(float(shares[p]))}" for p in names if shares[p] is not None)
