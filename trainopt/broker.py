"""The trial broker: every trial the search asks for goes through here.

A trial is identified by a deterministic key (what it measures and why); the broker
answers from the store when that key has finished before, records a knob that cannot
apply on this device as ``not_applicable`` without running it, and otherwise runs it
through the ``Runner``. Every trial used is noted in the ``SearchState``.
"""

from __future__ import annotations

import random
import zlib
from pathlib import Path
from typing import Any, Callable

from trainopt import knobs, plan
from trainopt.confirmation import Pair
from trainopt.protocol import TrialRequest, TrialResult
from trainopt.runner import Runner
from trainopt.state import SearchState, TrialRecord
from trainopt.store import TrialStore

__all__ = ["TrialBroker", "trial_key"]


def trial_key(settings: dict[str, Any], role: str, knob: str, tag: str) -> str:
    """The identity of a trial: why it runs (role, knob, tag) and what (the settings' hash)."""
    return f"{role}/{knob}/{tag}/{plan.settings_hash(settings)}"


class TrialBroker:
    """Keys, caches and runs trials.

    Args:
        spec: The validated spec.
        out_dir: The output folder (trial requests, results and logs go here).
        runner: Runs one trial.
        store: Finished trials, looked up by key.
        state: Where every trial used is noted, with the run/reused counts.
        progress: Receives trial events.
    """

    def __init__(self, spec: Any, out_dir: Path, runner: Runner, store: TrialStore, state: SearchState, progress: Any):
        self.spec = spec
        self.resolved = spec.resolved()
        self.out_dir = Path(out_dir)
        self.runner = runner
        self.store = store
        self.state = state
        self.progress = progress
        # Known once the baseline has run; until then every knob is taken as applicable.
        self.device_type: str | None = None
        # Ranks per data-parallel trial, or None for single-process trials (see knobs.not_applicable_reason).
        self.world_size: int | None = spec.world_size if spec.distributed else None

    def trial(self, settings: dict[str, Any], *, stage: str, knob: str, role: str, tag: str, mode: str = "measure") -> TrialResult:
        """Run (or reuse) one trial identified by what it measures and why."""
        key = trial_key(settings, role, knob, tag)
        meta = {"stage": stage, "knob": knob, "role": role, "tag": tag, "mode": mode}
        cached = self.store.lookup(key)
        if cached is not None:
            self.state.reused += 1
            self._note(key, meta, cached)
            self.progress.trial_reused()
            return cached
        reason = knobs.not_applicable_reason(settings, self.device_type, self.world_size) if self.device_type else None
        handle = self.store.begin(key, meta)
        if reason:
            result = TrialResult(status="not_applicable", settings=settings, mode=mode, error=reason)
        else:
            result = self._run(settings, key, handle.number, stage=stage, knob=knob, role=role, mode=mode)
        self.store.finish(handle, key, meta, result)
        self._note(key, meta, result)
        return result

    def _run(self, settings: dict[str, Any], key: str, number: int, *, stage: str, knob: str, role: str, mode: str) -> TrialResult:
        trial_dir = self.out_dir / "trials"
        trial_dir.mkdir(parents=True, exist_ok=True)
        name = f"{number:04d}-{role}-{knob}"
        request = TrialRequest(
            spec=self.resolved,
            source_dir=str(self.spec.source_dir()),
            settings=settings,
            mode=mode,
            result_path=str(trial_dir / f"{name}.result.json"),
            memory_gb=self.spec.limits.memory_gb,
            trial_id=key,
        )
        detail = f"{knob}={settings[knob]}" if knob in settings else ""
        self.progress.trial_started(stage=stage, knob=knob, role=role, detail=detail)
        result = self.runner.run(request, self.out_dir / "logs" / f"{name}.log", self.spec.measure.trial_timeout_s)
        self.state.ran += 1
        self.progress.trial_finished(result)
        return result

    def _note(self, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        self.state.trials.append(TrialRecord(id=len(self.state.trials), key=key, result=result, **meta))

    def pairs(self, incumbent: dict[str, Any], candidate: dict[str, Any], *, stage: str, knob: str) -> Callable[[int], Pair]:
        """A ``next_pair`` for ``confirmation.confirm``: fresh pairs, order inside each randomised.

        The order is drawn from a seed fixed by the two settings, so a resumed search asks
        for the same keys in the same order and finds them in the store. If the first trial
        of a pair fails, the second is not run.
        """
        base = f"{plan.settings_hash(incumbent)}-vs-{plan.settings_hash(candidate)}"
        rng = random.Random(zlib.crc32(f"{self.spec.measure.seed}/{knob}/{base}".encode()))

        def next_pair(i: int) -> Pair:
            order = ("candidate", "incumbent") if rng.random() < 0.5 else ("incumbent", "candidate")
            got: dict[str, TrialResult] = {}
            for who in order:
                settings = candidate if who == "candidate" else incumbent
                got[who] = self.trial(settings, stage=stage, knob=knob, role="confirm", tag=f"{base}/pair{i}/{who}")
                if not got[who].ok:
                    break
            return Pair(candidate=got.get("candidate"), incumbent=got.get("incumbent"))

        return next_pair
