"""The final check of the search's settings against the original baseline, and the warnings it raises."""

from __future__ import annotations

import math
from typing import Any

from trainopt.decide import plan
from trainopt.decide.recommendation import (
    check_claim,
    claim_sentence,
    claimed_speedup,
    final_pairs,
    pooled_pair_sd,
)
from trainopt.decide.sequential import holdout_estimate, holdout_pairs
from trainopt.decide.stability import final_disagreement
from trainopt.search.broker import TrialBroker
from trainopt.search.figures import median_rate
from trainopt.search.holdout import HeldOutSessions
from trainopt.search.state import SearchState
from trainopt.stats import intervals as stats

__all__ = ["final_check", "final_warnings", "planned_pairs"]


def planned_pairs(measure: Any, decisions: list[Any]) -> int:
    """Pairs of the final check, fixed before any is measured (the ETA counts the same).

    One kept change: the final check measures exactly the comparison its confirmation
    decided, at the held-out count. Several: enough pairs that a combination which lost
    their gains shows (``recommendation.final_pairs``).
    """
    n = max(measure.pairs, holdout_pairs(measure.confidence, measure.interval))
    kept = [d for d in decisions if d.kept]
    if len(kept) >= 2:
        n = final_pairs(claimed_speedup(kept), pooled_pair_sd(decisions), n, max(n, measure.max_pairs))
    return n


def final_check(broker: TrialBroker, held_out: HeldOutSessions, base: dict[str, Any], incumbent: dict[str, Any],
                decisions: list[Any] | None = None) -> dict[str, Any]:
    """The final settings against the original baseline: a fixed number of fresh pair sessions.

    No early stop and no selection act on these pairs, so the plain interval over them
    has its nominal coverage and the speedup is unbiased; the verdict applies the same
    boundaries as every change (``stats.verdict``) and only describes them. What decides
    is ``contradicted``: whether the pairs contradict what the kept changes claim together
    (``recommendation.check_claim``); the recommendation keeps every kept change unless
    they do. Their number is fixed before any is measured: ``max(pairs, 6)``, and with
    two or more kept changes enough to catch a combination no faster than the baseline
    in 90 % of searches at the pair noise the confirmations measured
    (``recommendation.final_pairs``, at most ``max_pairs``). Each pair runs with no other
    session beside it. The last kept change's held-out pairs are such pairs already and
    are used first (``HeldOutSessions.reusable``).

    Args:
        broker: Runs the sessions; its spec and state give the measure settings and the baseline trial.
        held_out: The held-out sessions measured so far.
        base: The baseline settings.
        incumbent: The settings the search ended with.
        decisions: The decisions whose kept changes ``incumbent`` holds (default: every
            decision; fewer when the training check dropped some).

    Returns:
        The ``final`` section of the search's state.
    """
    baseline_rate = broker.state.baseline.samples_per_s
    if plan.settings_hash(base) == plan.settings_hash(incumbent):
        return {
            "settings": incumbent,
            "verdict": "unchanged",
            "reason": "no change was confirmed as an improvement; the baseline stays",
            "speedup": 1.0,
            "ci": None,
            "n_pairs": 0,
            "samples_per_s": baseline_rate,
            "baseline_samples_per_s": baseline_rate,
        }
    m = broker.spec.measure
    decisions = broker.state.decisions if decisions is None else decisions
    kept = [d for d in decisions if d.kept]
    claim = claimed_speedup(kept, 1.0 + m.min_speedup)
    n = planned_pairs(m, decisions)
    reused, unstable, label = held_out.reusable(base, incumbent)
    pairs = reused[:n]
    more = n - len(pairs)
    if more:
        nxt = broker.pair_sessions(base, incumbent, stage="final", knob="final", role="final",
                                   planned=lambda i: more, exclusive=True)
        pairs += [nxt(i) for i in range(more)]
    cand = [p.candidate for p in pairs]
    inc = [p.incumbent for p in pairs]
    out = {"settings": incumbent, "ci": None, "speedup": None, "n_pairs": 0, "contradicted": True,
           "samples_per_s": median_rate(cand), "baseline_samples_per_s": median_rate(inc),
           "baseline_arms_samples_per_s": [r.samples_per_s for r in inc if r.ok and r.samples_per_s]}
    failed_cand = next((r for r in cand if not r.ok), None)
    failed_inc = next((r for r in inc if not r.ok), None)
    if failed_cand is not None:
        return {**out, "verdict": failed_cand.status, "reason": f"candidate trial {failed_cand.status}: {failed_cand.error}"}
    if failed_inc is not None:
        return {**out, "verdict": "inconclusive",
                "reason": f"incumbent trial {failed_inc.status} during the final check: {failed_inc.error}"}
    logs = [math.log(c.samples_per_s / i.samples_per_s) for c, i in zip(cand, inc)]
    iv = holdout_estimate(logs, m.confidence, m.interval)
    check = check_claim(logs, claim)
    reason = f"{iv.speedup:.3f}x [{iv.low:.3f}, {iv.high:.3f}] over {iv.n} fresh pairs"
    claim_text = claim_sentence(check.to_dict(), single=len(kept) == 1)
    reason += f"; {claim_text}"
    if reused:
        reason += f" ({label}{f'; and {more} more' if more else ''})"
        out["reused_pairs"] = n - more
    if unstable:
        out["unstable"] = "; ".join(unstable)
    return {**out, "verdict": stats.verdict(iv, m.min_speedup), "reason": reason,
            "speedup": iv.speedup, "ci": [iv.low, iv.high], "n_pairs": iv.n,
            "contradicted": check.contradicted, "claim_check": check.to_dict(), "claim_text": claim_text}


def final_warnings(state: SearchState, first_screen_rate: float | None) -> list[str]:
    """Warnings for the report: the final check against earlier measurements, unstable verdicts.

    Args:
        state: The search's state, its final check done.
        first_screen_rate: The incumbent arm's throughput in the first screen session
            (None when no screen ran).
    """
    warnings = []
    kept = [d.to_dict() for d in state.decisions if d.kept]
    # Like with like: the baseline trial is a one-shot fresh process, the final check's
    # arms are forked from the launcher, and the two differed by 1.2-1.5x in four quiet
    # demo runs of five, on two machine types. The first screen
    # session's incumbent arm holds the baseline settings (nothing is adopted before a
    # screen) and is measured the way the final check's arms are.
    if first_screen_rate:
        text = final_disagreement(state.final, kept, first_screen_rate, baseline_label="the first screen session")
    else:
        text = final_disagreement(state.final, kept, state.baseline.samples_per_s if state.baseline else None)
    if text:
        warnings.append(text)
    from trainopt.decide import machine

    noise = state.guard.noise_by_stage() if state.guard is not None else {}
    warnings += machine.warnings(state.machine.to_dict() if state.machine is not None else None, noise,
                                 [d.knob for d in state.decisions if d.kept])
    marked = [d for d in state.decisions if d.extra.get("unstable")]
    if marked or state.final.get("unstable"):
        what = ", ".join(f"{d.knob}={d.to_value}" for d in marked) + (" the final check" if state.final.get("unstable") else "")
        warnings.append(
            f"the machine was unstable while measuring {what.strip(', ')} and stayed so after re-measuring; "
            "those verdicts are marked and may be wrong - run the search again on a quieter machine"
        )
    return warnings
