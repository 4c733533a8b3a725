"""Trial storage on an Optuna study: every trial, its settings and its measurement.

This is the only module that imports Optuna. Each trial has a deterministic ``key``
(what it measures and why); the search asks ``lookup(key)`` before running anything,
so re-running an interrupted search reuses every finished trial and redoes at most the
one that was in flight. Trials are created with ``ask`` and closed with ``tell``, so
several worker processes could later share one study through an RDB URL.

The study lives wherever its SQLAlchemy URL points: an SQLite file in the output folder
by default, or a PostgreSQL database (``--storage postgresql+psycopg2://...``) that
optuna-dashboard can read while the search runs. A URL that cannot be used is a
``StorageError`` naming the URL with its password masked and how to fix it.

So that Optuna's own tools (``trials_dataframe``, parameter importances, optuna-dashboard)
can read the study, every finished trial carries the knobs the search varies as params,
each with one distribution for the whole study (``param_space``); what a trial is for
(its key, role, knob, session and result) stays in user attributes. Optuna's own best
trial is the fastest arm measured, which is not the recommendation: that is kept in the
study's user attributes (``record_recommendation``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any, Mapping

import optuna
import sqlalchemy.exc
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    IntDistribution,
    distribution_to_json,
    json_to_distribution,
)
from optuna.trial import TrialState
from sqlalchemy.engine import make_url

from trainopt.contract.protocol import SCHEMA_VERSION, TrialResult
from trainopt.decide.plan import settings_hash
from trainopt.errors import UserError
from trainopt.knobs.catalog import format_value

__all__ = [
    "TrialStore",
    "SpecChangedError",
    "StorageError",
    "StoreLost",
    "StudyBusy",
    "default_storage_url",
    "masked_url",
    "open_storage",
    "param_space",
    "param_value",
    "storage_problem",
    "study_lock_key",
]

optuna.logging.set_verbosity(optuna.logging.WARNING)
logging.getLogger("optuna").setLevel(logging.WARNING)


class SpecChangedError(UserError):
    """The stored search was made from a different spec."""


class StorageError(UserError):
    """The trial store's URL is malformed, its driver is missing or its database cannot be reached."""


class StudyBusy(StorageError):
    """Another search holds the same study (same spec name, same store)."""


class StoreLost(StorageError):
    """The connection to the trial store failed during the search; finished trials are kept there."""


ALLOWED = (
    "sqlite:///PATH (the default: trials.db in the output folder) or "
    "postgresql+psycopg2://USER:PASSWORD@HOST[:PORT]/DATABASE (a socket folder as ?host=/DIR)"
)
POSTGRES_EXTRA = 'pip install "trainopt[postgres]"'
# Seconds to wait for a database server: an unreachable host should fail the search
# at once with a message, not hang for the operating system's TCP timeout.
CONNECT_TIMEOUT_S = 10

# The password between "scheme://user:" and the last "@", and a ``password=`` query value.
# Greedy to the last "@" so a password with an unescaped "@" is masked whole; masking
# too much is harmless, showing a password is not.
_USERINFO_PASSWORD = re.compile(r"^([^:/@?]*://[^:/@?]*):.*@(?=[^@]*$)")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&]*", re.IGNORECASE)


# The study user attribute that keeps the params' distributions, so a resumed search gives
# its new trials the same ones as the first run gave its trials.
SPACE_ATTR = "param_space"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def param_space(spec: Any) -> dict[str, BaseDistribution]:
    """The Optuna distribution of every knob the search varies, fixed for the study's life.

    Optuna refuses a param whose categorical choices differ from the ones an earlier trial
    of the study stored under that name, so each distribution must cover every value the
    search can give the knob before the first trial runs:

    * a listed knob: one categorical over the baseline's value and the spec's candidates;
      integers stay numbers (sorted), any other knob's values are the text YAML writes
      (``true``, ``null``, ``bf16``), so a column never mixes types;
    * ``batch_size``: the sizes come from memory probes, unknown in advance, so an integer
      range from 1 to ``search.batch_size.max`` (no probe or candidate exceeds it);
    * ``grad_accum`` when ``limits.effective_batch`` ties it to ``batch_size``: an integer
      range from 1 to the effective batch.

    Knobs the search never changes are left out: a constant explains nothing.

    Args:
        spec: The validated spec (``baseline``, ``search``, ``limits``, ``batch_search``).
    """
    baseline = dict(spec.baseline)
    space: dict[str, BaseDistribution] = {}
    for name, candidates in spec.search.items():
        if name == "batch_size":
            space[name] = IntDistribution(1, max(int(spec.batch_search.max), int(baseline[name])))
            continue
        values: list[Any] = []
        for value in [baseline.get(name), *candidates]:
            if value not in values:
                values.append(value)
        if all(_is_int(v) for v in values):
            space[name] = CategoricalDistribution(sorted(values))
        else:
            space[name] = CategoricalDistribution([format_value(v) for v in values])
    effective = spec.limits.effective_batch
    if "batch_size" in spec.search and effective is not None:
        space["grad_accum"] = IntDistribution(1, max(int(effective), int(baseline.get("grad_accum") or 1)))
    return space


def param_value(distribution: BaseDistribution, value: Any) -> Any:
    """``value`` as the param of ``distribution`` stores it, or None when it lies outside it.

    Args:
        distribution: The knob's distribution from ``param_space``.
        value: The knob's value in a trial's settings.
    """
    if isinstance(distribution, IntDistribution):
        return value if _is_int(value) and distribution.low <= value <= distribution.high else None
    if isinstance(distribution, CategoricalDistribution):
        if all(_is_int(c) for c in distribution.choices):
            return value if _is_int(value) and value in distribution.choices else None
        shown = format_value(value)
        return shown if shown in distribution.choices else None
    return None


def default_storage_url(out_dir: Path) -> str:
    """An SQLite file inside the output folder."""
    return f"sqlite:///{(Path(out_dir) / 'trials.db').resolve()}"


def masked_url(url: str) -> str:
    """``url`` as typed, with any password replaced by ``***`` (also for a URL that does not parse)."""
    return _QUERY_PASSWORD.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1:***@", url))


def _first_line(exc: BaseException) -> str:
    """The driver's own first line of an error (SQLAlchemy wraps it as ``exc.orig``)."""
    inner = getattr(exc, "orig", None) or exc
    text = str(inner).strip().splitlines()
    return text[0].strip() if text else type(inner).__name__


def _driver_hint(url: str, missing: str) -> str:
    """How to install the database driver module ``missing`` that ``url`` needs."""
    if missing.split(".")[0] == "psycopg2":
        return POSTGRES_EXTRA
    if missing.split(".")[0] == "psycopg":
        # SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which the extra does not install.
        return f"write the URL as postgresql+psycopg2://... and {POSTGRES_EXTRA}, or pip install psycopg"
    return f"pip install {missing.split('.')[0]} (the driver named after '+' in the URL)"


def _missing_module(exc: BaseException) -> str | None:
    """The module whose import failed somewhere in ``exc``'s chain, if any."""
    seen = exc
    while seen is not None:
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            return seen.name
        seen = seen.__cause__ or seen.__context__
    return None


def storage_problem(url: str, exc: BaseException) -> str:
    """The user's message for an error raised while opening the store at ``url``.

    Args:
        url: The storage URL as given (shown with its password masked).
        exc: What SQLAlchemy, the driver or Optuna raised.
    """
    shown = masked_url(url)
    if isinstance(exc, sqlalchemy.exc.NoSuchModuleError):
        return f"--storage {shown}: unknown database or driver; use {ALLOWED}"
    if isinstance(exc, sqlalchemy.exc.ArgumentError):
        return f"--storage {shown}: not a database URL; use {ALLOWED}"
    if isinstance(exc, ImportError):
        missing = _missing_module(exc) or "the database driver"
        return f"--storage {shown}: the driver {missing!r} is not installed; {_driver_hint(url, missing)}"
    if isinstance(exc, sqlalchemy.exc.OperationalError) and url.startswith("sqlite"):
        return f"--storage {shown}: cannot open: {_first_line(exc)}; check that its folder exists and is writable"
    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return (
            f"--storage {shown}: cannot connect: {_first_line(exc)}; check that the server is running and that the "
            f"host, port, user, password and database exist (PostgreSQL: createdb DATABASE), or leave out --storage "
            f"to keep the trials in the output folder"
        )
    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
        return f"--storage {shown}: the database refused the trial store: {_first_line(exc)}; check the user's rights on it"
    # Optuna's RuntimeError for a study schema written by another Optuna version says how to upgrade it.
    return f"--storage {shown}: {_first_line(exc)}"


def study_lock_key(study_name: str) -> int:
    """A signed 64-bit key for the study's PostgreSQL advisory lock (stable across processes)."""
    digest = hashlib.sha256(f"trainopt-study/{study_name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class _StudyLock:
    """Held by one search for as long as it uses a study, so two searches never share one.

    PostgreSQL: a session-level advisory lock on a connection of its own; the server drops
    it when that connection ends, so a search killed by ``kill -9`` (or a crashed machine)
    leaves no stale lock. SQLite: an ``flock`` on a file beside the database, released by
    the kernel when the process dies. Other databases: no lock (the output folder's lock
    still keeps two searches out of one folder). Within one process the lock is shared
    (counted): a process opening the same study twice, as a resumed search in a test
    does, is still one search.
    """

    _held: dict[tuple[str, str], list[Any]] = {}

    def __init__(self, storage: optuna.storages.RDBStorage, url: str, study_name: str):
        parsed = make_url(url)
        self._id = (parsed.render_as_string(hide_password=True), study_name)
        self._released = False
        held = self._held.get(self._id)
        if held is not None:
            held[1] += 1
            return
        busy = (f"another trainopt search is using the study {study_name!r} in {masked_url(url)}; wait for it to "
                f"finish, or give this spec another name (its 'name' field) or another --storage")
        handle: Any = None
        backend = parsed.get_backend_name()
        if backend == "postgresql":
            conn = storage.engine.connect()
            got = conn.execute(sqlalchemy.text("select pg_try_advisory_lock(:k)"), {"k": study_lock_key(study_name)}).scalar()
            # Outside any transaction from here on: the connection only holds the lock.
            conn.commit()
            if not got:
                conn.close()
                raise StudyBusy(busy)
            handle = conn
        elif backend == "sqlite" and parsed.database and parsed.database != ":memory:":
            fh = open(f"{parsed.database}.{hashlib.sha256(study_name.encode()).hexdigest()[:12]}.lock", "a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                fh.close()
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise StudyBusy(busy) from None
                raise
            handle = fh
        self._held[self._id] = [handle, 1]

    def check(self) -> None:
        """Raise if the lock was lost: its PostgreSQL connection ended under it.

        A server restart (or an administrator's ``pg_terminate_backend``) ends the lock's
        session and so the lock, while Optuna's own pool reconnects as if nothing happened;
        without this check another search could then take the study and retire this one's
        running trials as stale.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: The lock's connection is gone.
        """
        held = self._held.get(self._id)
        conn = held[0] if held is not None else None
        if isinstance(conn, sqlalchemy.engine.Connection):
            conn.execute(sqlalchemy.text("select 1"))
            conn.commit()

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        held = self._held[self._id]
        held[1] -= 1
        if held[1]:
            return
        del self._held[self._id]
        try:
            if held[0] is not None:
                held[0].close()  # PostgreSQL: ends the session, and with it the advisory lock
        except (sqlalchemy.exc.SQLAlchemyError, OSError):
            pass  # the server already dropped it


def _lost_lock(url: str, study_name: str, exc: BaseException) -> StoreLost:
    return StoreLost(
        f"--storage {masked_url(url)}: lost the hold on the study {study_name!r} during the search: the database "
        f"connection that held it ended ({_first_line(exc)}), for example in a server restart, so another search "
        f"could take the study; this search stops here, and every trial that finished before is kept there: run "
        f"the same command again to resume"
    )


def _lost(url: str, exc: BaseException) -> StoreLost:
    return StoreLost(
        f"--storage {masked_url(url)}: lost the connection to the trial store during the search "
        f"({_first_line(exc)}); every trial that finished before is kept there: once the database is back, "
        f"run the same command again to resume"
    )


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """Connect to the Optuna storage at ``url``, creating its tables if needed.

    Raises:
        StorageError: Malformed URL, unknown database, missing driver, unreachable server,
            or refused access.
    """
    engine_kwargs: dict[str, Any] = {}
    try:
        parsed = make_url(url)
        if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
            engine_kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, ImportError, RuntimeError) as exc:
        raise StorageError(storage_problem(url, exc)) from None


class TrialStore:
    """Trials of one search, kept in an Optuna study.

    Args:
        url: An Optuna RDB storage URL.
        study_name: The search's name (one study per search).
        spec_fingerprint: Content hash of the resolved spec; a stored study made from
            another spec is refused unless ``fresh``.
        fresh: Delete any stored study of that name and start over.
        space: The params' distributions (``param_space(spec)``). A study keeps the space
            it was first given, so every trial's params stay valid together; a study made
            without one (as every study was before params were stored) takes this one from
            its next trial on. None with no stored space: trials get no params.
    """

    def __init__(self, url: str, study_name: str, spec_fingerprint: str, fresh: bool = False,
                 space: Mapping[str, BaseDistribution] | None = None):
        self.url = url
        self.study_name = study_name
        storage = open_storage(url)
        self.storage = storage
        # Before anything is changed: a second search must not retire the first's running
        # trials as stale, nor delete its study with --fresh.
        try:
            self._lock = _StudyLock(storage, url, study_name)
        except (sqlalchemy.exc.SQLAlchemyError, OSError) as exc:
            raise StorageError(storage_problem(url, exc)) from None
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
                f"the stored search {study_name!r} in {masked_url(url)} was made from a different spec "
                f"(stored {stored}, now {spec_fingerprint}); its trials were measured and decided under that spec, "
                f"and reusing them under another one (a larger measure.max_pairs, another confidence, margin or "
                f"error_scope) would extend confirmations after their data were seen, which voids their error bound; "
                f"use --fresh to start over, or another --out "
                f"(with --storage: another spec name or another --storage)"
            )
        self.space = self._space(space)
        self.stale = self._retire_stale()
        self._done: dict[str, TrialResult] = {}
        self._records: list[dict[str, Any]] = []
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (TrialState.COMPLETE, TrialState.FAIL) and "result" in t.user_attrs and not t.user_attrs.get("stale"):
                self._remember(t.user_attrs, t.number)

    def _space(self, given: Mapping[str, BaseDistribution] | None) -> dict[str, BaseDistribution]:
        """The study's stored space, or ``given`` stored now when it has none."""
        stored = self.study.user_attrs.get(SPACE_ATTR)
        if isinstance(stored, dict):
            try:
                return {name: json_to_distribution(text) for name, text in stored.items()}
            except (ValueError, TypeError, KeyError):
                pass  # unreadable: the trials' own distributions still guard the study
        if not given:
            return {}
        self.study.set_user_attr(SPACE_ATTR, {name: distribution_to_json(d) for name, d in given.items()})
        return dict(given)

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

    def _check_lock(self) -> None:
        try:
            self._lock.check()
        except sqlalchemy.exc.SQLAlchemyError as exc:
            try:
                with self.storage.engine.connect() as conn:
                    conn.execute(sqlalchemy.text("select 1"))
            except sqlalchemy.exc.SQLAlchemyError as down:
                raise _lost(self.url, down) from None  # the whole server is gone, not just the lock
            raise _lost_lock(self.url, self.study_name, exc) from None

    def begin(self, key: str, meta: dict[str, Any]) -> optuna.trial.Trial:
        """Open a trial (state RUNNING) before its process starts.

        Raises:
            StoreLost: The database cannot be reached any more, or the study's lock was lost.
        """
        self._check_lock()
        try:
            trial = self.study.ask()
            trial.set_user_attr("key", key)
            trial.set_user_attr("meta", json.dumps(meta, default=str))
            # One attribute per field as well, so a dashboard shows and filters by them.
            for field in ("role", "knob", "stage"):
                if meta.get(field) is not None:
                    trial.set_user_attr(field, str(meta[field]))
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            raise _lost(self.url, exc) from None
        return trial

    def finish(self, trial: optuna.trial.Trial, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        """Close a trial with its result: COMPLETE with throughput, or FAIL with its status.

        Raises:
            StoreLost: The database cannot be reached any more, or the study's lock was lost
                (the result is not kept).
        """
        self._check_lock()
        payload = json.dumps(result.to_dict(), default=str)
        try:
            trial.set_user_attr("result", payload)
            trial.set_user_attr("status", result.status)
            session = (result.session or {}).get("id")
            if session:
                trial.set_user_attr("session", str(session))
            self._set_params(trial, result.settings or {})
            if result.ok and result.samples_per_s is not None:
                self.study.tell(trial, result.samples_per_s)
            else:
                self.study.tell(trial, state=TrialState.FAIL)
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            raise _lost(self.url, exc) from None
        self._remember({"key": key, "meta": json.dumps(meta, default=str), "result": payload}, trial.number)

    def _set_params(self, trial: optuna.trial.Trial, settings: Mapping[str, Any]) -> None:
        """The trial's knobs as params; a value outside the study's space is left out, not forced."""
        for name, distribution in self.space.items():
            if name not in settings:
                continue
            value = param_value(distribution, settings[name])
            if value is None:
                continue
            self.storage.set_trial_param(trial._trial_id, name, distribution.to_internal_repr(value), distribution)

    def record_recommendation(self, best: Mapping[str, Any] | None) -> None:
        """Mark the recommended settings on the study, with the finished trials that measured them.

        Optuna's own best trial is the fastest arm any session measured, often a noisy draw
        of a change that was not kept; the recommendation is what ``best.yaml`` holds.

        Args:
            best: The results document's ``best`` (``settings``, ``source``, ...), or None.

        Raises:
            StoreLost: The database cannot be reached any more, or the study's lock was lost.
        """
        if not best or not best.get("settings"):
            return
        wanted = settings_hash(best["settings"])
        numbers = sorted(
            r["number"] for r in self._records
            if r["result"].ok and r["result"].samples_per_s is not None and settings_hash(r["result"].settings or {}) == wanted
        )
        self._check_lock()
        try:
            self.study.set_user_attr("recommended_settings", dict(best["settings"]))
            self.study.set_user_attr("recommended_source", best.get("source"))
            self.study.set_user_attr("recommended_trials", numbers)
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as exc:
            raise _lost(self.url, exc) from None

    def close(self) -> None:
        """Let other searches use the study (also happens when the process ends)."""
        self._lock.release()

    def records(self) -> list[dict[str, Any]]:
        """Every finished trial in the order it finished: number, key, meta fields and result."""
        return list(self._records)
