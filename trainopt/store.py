"""Trial storage on an Optuna study: every trial, its settings and its measurement.

This is the only module that imports Optuna. Each trial has a deterministic ``key``
(what it measures and why); the search asks ``lookup(key)`` before running anything,
so re-running an interrupted search reuses every finished trial and redoes at most the
one that was in flight. Trials are created with ``ask`` and closed with ``tell``, so
several worker processes could later share one study through an RDB URL.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from trainopt.protocol import SCHEMA_VERSION, TrialResult

from trainopt.errors import UserError

__all__ = ["TrialStore", "SpecChangedError", "default_storage_url"]

optuna.logging.set_verbosity(optuna.logging.WARNING)
logging.getLogger("optuna").setLevel(logging.WARNING)


class SpecChangedError(UserError):
    """The stored search was made from a different spec."""


def default_storage_url(out_dir: Path) -> str:
    """An SQLite file inside the output folder."""
    return f"sqlite:///{(Path(out_dir) / 'trials.db').resolve()}"


class TrialStore:
    """Trials of one search, kept in an Optuna study.

    Args:
        url: An Optuna RDB storage URL.
        study_name: The search's name (one study per search).
        spec_fingerprint: Content hash of the resolved spec; a stored study made from
            another spec is refused unless ``fresh``.
        fresh: Delete any stored study of that name and start over.
    """

    def __init__(self, url: str, study_name: str, spec_fingerprint: str, fresh: bool = False):
        self.url = url
        self.study_name = study_name
        storage = optuna.storages.RDBStorage(url)
        self.storage = storage
        existing = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
        if study_name in existing and fresh:
            optuna.delete_study(study_name=study_name, storage=storage)
            existing.discard(study_name)
        self.study = optuna.create_study(storage=storage, study_name=study_name, direction="maximize", load_if_exists=True)
        stored = self.study.user_attrs.get("spec_fingerprint")
        if stored is None:
            self.study.set_user_attr("spec_fingerprint", spec_fingerprint)
            self.study.set_user_attr("schema_version", SCHEMA_VERSION)
        elif stored != spec_fingerprint:
            raise SpecChangedError(
                f"the stored search {study_name!r} in {url} was made from a different spec "
                f"(stored {stored}, now {spec_fingerprint}); use --fresh to start over or another --out"
            )
        self.stale = self._retire_stale()
        self._done: dict[str, TrialResult] = {}
        self._records: list[dict[str, Any]] = []
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and "result" in t.user_attrs and not t.user_attrs.get("stale"):
                self._remember(t.user_attrs, t.number)

    def _retire_stale(self) -> int:
        """Mark trials left RUNNING by a killed search as failed-and-stale.

        The caller holds the output folder's lock, so no live search owns them.
        """
        count = 0
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING)):
            self.storage.set_trial_user_attr(t._trial_id, "stale", True)
            self.study.tell(t.number, state=TrialState.FAIL, skip_if_finished=True)
            count += 1
        return count

    def _remember(self, attrs: dict[str, Any], number: int) -> None:
        result = TrialResult.from_dict(json.loads(attrs["result"]))
        key = attrs["key"]
        self._done[key] = result
        self._records.append({"number": number, "key": key, **json.loads(attrs.get("meta", "{}")), "result": result})

    def lookup(self, key: str) -> TrialResult | None:
        """The finished result stored under ``key``, or None."""
        return self._done.get(key)

    def begin(self, key: str, meta: dict[str, Any]) -> optuna.trial.Trial:
        """Open a trial (state RUNNING) before its process starts."""
        trial = self.study.ask()
        trial.set_user_attr("key", key)
        trial.set_user_attr("meta", json.dumps(meta, default=str))
        return trial

    def finish(self, trial: optuna.trial.Trial, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        """Close a trial with its result: COMPLETE with throughput, or FAIL with its status."""
        payload = json.dumps(result.to_dict(), default=str)
        trial.set_user_attr("result", payload)
        trial.set_user_attr("status", result.status)
        if result.ok and result.samples_per_s is not None:
            self.study.tell(trial, result.samples_per_s)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        self._remember({"key": key, "meta": json.dumps(meta, default=str), "result": payload}, trial.number)

    def records(self) -> list[dict[str, Any]]:
        """Every finished trial in the order it finished: number, key, meta fields and result."""
        return list(self._records)
