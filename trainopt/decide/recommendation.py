"""Which settings a search recommends (``best`` in results.json and best.yaml), and why.

Only settings that a confirmation showed ``improved`` over the *original baseline* are
recommended. Two confirmations compare against the baseline itself: the final check
(the final settings against the baseline) and the first kept change (whose incumbent
was still the baseline). Later kept changes were each confirmed against an incumbent
that already held earlier changes, so their settings were never compared with the
baseline until the final check. Hence, in order:

1. ``final-check``: the final check said ``improved``: the final settings.
2. ``first-kept-change``: otherwise the baseline plus the first kept change, unless
   those are exactly the settings the final check measured and it contradicts their
   confirmation (``regressed``, ``equivalent``, a failure, or an estimate at or below 1).
   When the final check measured exactly those settings and found them faster but not
   surely by the margin (``inconclusive`` with its estimate above 1), it measured the
   confirmed comparison again with fewer pairs and agrees with it in direction: the
   confirmed change stands, and the reason says so. Requiring that check's own interval
   to clear 1 would drop most real +10 % wins: over 6 pairs the exact interval reaches
   from about the smallest pair to the largest, and at this machine's pair noise that
   reaches below 1 in about half the searches (``benchmarks/search_verdicts.py``,
   column ``recommended``). For a search still running this is the best confirmed so far.
3. ``baseline``: otherwise the baseline.

Pure: plain data in, plain data out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from trainopt.decide import plan
from trainopt.decide.verdict import Decision

__all__ = ["SOURCES", "Recommendation", "recommend", "settings_after"]

SOURCES = ("final-check", "first-kept-change", "baseline")


@dataclass(frozen=True)
class Recommendation:
    """The recommended settings with the evidence behind them.

    Attributes:
        settings: Every knob's value.
        source: One of ``SOURCES``: which confirmation backs these settings.
        reason: One sentence saying why these settings and not others.
        samples_per_s: Their median throughput in that confirmation (the baseline's own when
            ``source`` is ``baseline``; None when not measured yet).
        speedup: Their speedup over the baseline (1.0 for the baseline).
        ci: The interval of that speedup, or None.
        n_pairs: Pairs behind the interval.
    """

    settings: dict[str, Any]
    source: str
    reason: str
    samples_per_s: float | None
    speedup: float | None
    ci: list[float] | None
    n_pairs: int


def settings_after(baseline: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """The baseline with one decision's change applied (grad_accum too for a batch change)."""
    out = plan.with_knob(baseline, decision.knob, decision.to_value)
    if "grad_accum" in decision.extra:
        out["grad_accum"] = decision.extra["grad_accum"]
    return out


def _pairs(d: Decision) -> int:
    """Pairs behind a kept change's reported speedup: its held-out pairs when it has them
    (the figure comes from those), else the pairs that decided it."""
    held = d.extra.get("holdout") if isinstance(d.extra, dict) else None
    return int(held["n_pairs"]) if held and held.get("n_pairs") else d.n_pairs


def _change(d: Decision) -> str:
    ci = f" [{d.ci[0]:.3f}, {d.ci[1]:.3f}]" if d.ci else ""
    held = " held-out" if isinstance(d.extra, dict) and d.extra.get("holdout") else ""
    speed = f", {d.speedup:.3f}x{ci} over {_pairs(d)}{held} pairs" if d.speedup is not None else ""
    return f"{d.knob} {d.from_value} -> {d.to_value}{speed}"


def recommend(
    baseline: Mapping[str, Any], baseline_samples_per_s: float | None, decisions: Sequence[Decision], final: Mapping[str, Any]
) -> Recommendation:
    """Choose the recommended settings by the rule in this module's docstring.

    Args:
        baseline: The baseline's settings.
        baseline_samples_per_s: The baseline's throughput (None before it is measured).
        decisions: Every decision so far, in order.
        final: The final check (``settings``, ``verdict``, ``reason``, ``speedup``, ``ci``,
            ``n_pairs``, ``samples_per_s``), or empty while the search is still running.
    """
    verdict = final.get("verdict")
    if verdict == "improved":
        return Recommendation(
            dict(final["settings"]), "final-check", f"the final check confirmed these settings against the baseline: {final.get('reason')}",
            final.get("samples_per_s"), final.get("speedup"), final.get("ci"), final.get("n_pairs") or 0,
        )
    kept = [d for d in decisions if d.kept]
    checked_and_failed = ""
    if final and verdict != "unchanged":
        checked_and_failed = f"the final check of the combined settings said {verdict} ({final.get('reason')})"
    if kept:
        first = kept[0]
        candidate = settings_after(baseline, first)
        tested_by_final = bool(final) and plan.settings_hash(candidate) == plan.settings_hash(final.get("settings") or {})
        estimate = final.get("speedup") if final else None
        agrees = tested_by_final and verdict == "inconclusive" and estimate is not None and estimate > 1.0
        if agrees:
            return Recommendation(
                candidate, "first-kept-change",
                f"these settings were confirmed against the baseline ({_change(first)}); the final check "
                f"{'(its held-out pairs) measured that comparison' if final.get('reused_pairs') else 'measured the same comparison again'} "
                f"and found them faster, though not surely by the margin ({final.get('reason')})",
                first.after_samples_per_s, first.speedup, first.ci, _pairs(first),
            )
        if not tested_by_final:
            lead = f"{checked_and_failed}; " if checked_and_failed else ("the final check has not run yet; " if not final else "")
            return Recommendation(
                candidate, "first-kept-change",
                f"{lead}these are the last settings confirmed against the baseline: {_change(first)}",
                first.after_samples_per_s, first.speedup, first.ci, _pairs(first),
            )
    if checked_and_failed:
        reason = f"{checked_and_failed}; no other settings were confirmed against the baseline, so the baseline stays"
    elif final:
        reason = final.get("reason") or "no change was confirmed as an improvement; the baseline stays"
    else:
        reason = "no change has been confirmed as an improvement yet; the baseline stays"
    return Recommendation(dict(baseline), "baseline", reason, baseline_samples_per_s, 1.0 if final else None, None, 0)
