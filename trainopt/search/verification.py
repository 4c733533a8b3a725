"""``trainopt verify``: do recommended settings still hold here and now, for speed and for training?

A thin layer over the search's own pieces: fresh pair sessions of the settings against the
spec's baseline, judged by the final check's rule (``final_check``; the win holds unless
the pairs show the settings no faster than ``1 + min_speedup``), and the training check
(``TrainingCheck``) of the same settings. Nothing is reused from an earlier run: the trial
store is a new one in the verification's own folder.

Exit status (``Verification.ok``): the win holds and the training check says ``same`` (or
has nothing to judge).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainopt.contract.fingerprint import COMPARED_KEYS, differences
from trainopt.contract.protocol import TrialResult
from trainopt.decide import plan
from trainopt.decide.verdict import Decision
from trainopt.execute.executors import SessionExecutor
from trainopt.execute.runner import Runner
from trainopt.search.broker import TrialBroker
from trainopt.search.final_check import final_check
from trainopt.search.holdout import HeldOutSessions
from trainopt.search.progress import NullProgress
from trainopt.search.state import SearchState
from trainopt.search.store import TrialStore
from trainopt.search.training_check import TrainingCheck, not_checked

__all__ = ["verify", "HOLDING"]

# The speed verdicts of the fresh pairs that leave the win standing (not contradicted as well).
HOLDING = ("improved", "equivalent", "inconclusive")


def verify(spec: Any, settings: dict[str, Any], out_dir: Path, runner: Runner, store: TrialStore,
           executor: SessionExecutor, recorded: dict[str, Any] | None = None, progress: Any = None) -> dict[str, Any]:
    """Measure ``settings`` against ``spec``'s baseline in fresh pairs and check their training.

    Args:
        spec: The spec the settings were searched with (its baseline, workload, measure and check sections).
        settings: Every knob's value of the settings to verify.
        out_dir: Where the verification's trials and logs go.
        runner: Runs the training runs.
        store: A new, empty trial store.
        executor: Runs the pair sessions.
        recorded: What was recorded with the settings (best.yaml's provenance): its
            ``speedup``, ``speedup_ci`` and ``env`` are shown beside today's.
        progress: Receives progress events.

    Returns:
        The verification document: settings, speed (today's final check and the recorded
        figure), training (the training check), environment differences, and ``ok``.
    """
    progress = progress or NullProgress()
    recorded = recorded or {}
    base = dict(spec.baseline)
    state = SearchState.for_spec(spec, out_dir)
    # The final check and the training check read the baseline's settings from here; no one-shot
    # baseline trial runs: the pairs measure the baseline beside the settings.
    state.baseline = TrialResult(status="ok", settings=base)
    broker = TrialBroker(spec, out_dir, runner, store, state, progress, executor=executor)
    held_out = HeldOutSessions(broker, spec.measure)
    progress.stage("final", "fresh pairs of these settings against the baseline")
    # The margin is the claim: the win holds unless the pairs show these settings no faster than it.
    margin = Decision(knob="verify", stage="verify", from_value=None, to_value=None, verdict="improved", reason="",
                      speedup=None, ci=None, n_pairs=0, kept=True)
    state.final = final_check(broker, held_out, base, settings, decisions=[margin])
    speed = {k: v for k, v in state.final.items() if k != "settings"}
    holds = speed.get("verdict") == "unchanged" or (speed.get("contradicted") is False and speed.get("verdict") in HOLDING)
    if spec.check.training:
        # Exactly these settings: a verification reports what fails, it drops nothing.
        state.decisions = []
        check = TrainingCheck(broker, held_out, state, spec.check.training_steps, spec.seed)
        progress.stage("training", f"training check, {spec.check.training_steps} steps a run")
        training = check.run(settings)
    else:
        training = not_checked("check.training is false: the training was not checked")
    here = next((t.result.env for t in state.trials if t.result.env), {})
    measured = recorded.get("env") or {}
    keys = [k for k in COMPARED_KEYS if k in measured]
    env_diff = differences({k: measured[k] for k in keys}, {k: here.get(k) for k in keys}) if keys and here else []
    trained = training.get("verdict") in ("same", "not_needed", "not_checked")
    return {
        "kind": "trainopt-verification",
        "schema_version": 1,
        "name": spec.name,
        "settings": settings,
        "changed": {k: v for k, v in settings.items() if base.get(k) != v},
        "speed": speed,
        "speed_holds": holds,
        "recorded": {"speedup": recorded.get("speedup"), "speedup_ci": recorded.get("speedup_ci"),
                     "measured_at": recorded.get("measured_at")},
        "training_check": training,
        "env": here,
        "env_differences": env_diff,
        "ok": bool(holds and trained),
        "same_settings_as_baseline": plan.settings_hash(settings) == plan.settings_hash(base),
    }
