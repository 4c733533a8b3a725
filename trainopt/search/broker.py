"""The trial broker: every trial and session the search asks for goes through here.

A trial is identified by a deterministic key (what it measures and why); the broker
answers from the store when that key has finished before, records a knob that cannot
apply on this device as ``not_applicable`` without running it, and otherwise runs it
through the ``Runner`` (the baseline, the memory probes). Sessions (screens, confirmation
and held-out pairs, the final check) go to the ``SessionExecutor``, each arm keyed and
stored like a trial, and are judged by the stability guard. Every trial used is noted in
the ``SearchState``.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.session import SessionResult
from trainopt.decide import plan
from trainopt.decide.confirmation import Pair
from trainopt.execute.executors import SessionExecutor, SessionJob, record_local
from trainopt.execute.runner import Runner
from trainopt.knobs import catalog as knobs
from trainopt.search.state import SearchState, TrialRecord
from trainopt.search.store import TrialStore

__all__ = ["TrialBroker", "SessionAsk", "trial_key", "KEEP_ROLES"]

# Sessions whose pairs are data for a verdict or a reported figure: the guard marks them but
# never re-runs them (see ``TrialBroker.sessions``). A screen only chooses what to confirm.
KEEP_ROLES = ("confirm", "holdout", "final")


@dataclass(frozen=True)
class SessionAsk:
    """A session the search wants: its arms (arm 0 is the incumbent) and why.

    Attributes:
        arms: Settings of every arm, the incumbent first.
        stage: The search stage.
        knob: The knob being decided.
        role: ``screen``, ``confirm``, ``holdout`` or ``final``.
        tag: Identifies the session within its role and knob (part of every arm's key).
    """

    arms: list[dict[str, Any]]
    stage: str
    knob: str
    role: str
    tag: str

    def keys(self) -> list[str]:
        return [trial_key(s, self.role, self.knob, f"{self.tag}/arm{i}") for i, s in enumerate(self.arms)]


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

    def __init__(self, spec: Any, out_dir: Path, runner: Runner, store: TrialStore, state: SearchState, progress: Any,
                 executor: SessionExecutor | None = None, guard: Any = None):
        self.executor = executor
        # The stability guard (``stability.StabilityGuard``), or None to take every session as it comes.
        self.guard = guard
        # Why sessions stayed unstable after every retry, in order (the stages mark their verdicts).
        self.unstable: list[str] = []
        # The machine check (``execute.machine_probe.MachineProbe``), sampled after every batch
        # of sessions; None: not sampled (simulations, tests).
        self.machine: Any = None
        # How to wait for the machine to settle (a simulated clock in tests).
        self.sleep: Callable[[float], None] = time.sleep
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

    def trial(self, settings: dict[str, Any], *, stage: str, knob: str, role: str, tag: str, mode: str = "measure",
              diagnose: bool = False, training: dict[str, Any] | None = None) -> TrialResult:
        """Run (or reuse) one trial identified by what it measures and why.

        With ``diagnose`` the trial also profiles where a step's time goes after its timed
        windows (``TrialRequest.diagnose``). It is not part of the key: the timed windows
        are the same either way, and a stored trial without a breakdown is reused as it is.
        ``training`` goes with a ``train`` trial (``TrialRequest.training``); the caller puts
        what it holds into ``tag``, so it is part of the key.
        """
        key = trial_key(settings, role, knob, tag)
        meta = {"stage": stage, "knob": knob, "role": role, "tag": tag, "mode": mode}
        cached = self.store.lookup(key)
        if cached is not None:
            self.state.reused += 1
            self._note(key, meta, cached)
            self.progress.trial_reused(plan.arm_cost(settings, role))
            return cached
        reason = knobs.not_applicable_reason(settings, self.device_type, self.world_size) if self.device_type else None
        handle = self.store.begin(key, meta)
        if reason:
            result = TrialResult(status="not_applicable", settings=settings, mode=mode, error=reason)
        else:
            result = self._run(settings, key, handle.number, stage=stage, knob=knob, role=role, mode=mode, diagnose=diagnose,
                               training=training)
        self.store.finish(handle, key, meta, result)
        self._note(key, meta, result)
        return result

    def _request(self, settings: dict[str, Any], key: str, name: str, mode: str, diagnose: bool = False,
                 training: dict[str, Any] | None = None) -> TrialRequest:
        trial_dir = self.out_dir / "trials"
        trial_dir.mkdir(parents=True, exist_ok=True)
        return TrialRequest(
            spec=self.resolved,
            source_dir=str(self.spec.source_dir()),
            settings=settings,
            mode=mode,
            result_path=str(trial_dir / f"{name}.result.json"),
            memory_gb=self.spec.limits.memory_gb,
            trial_id=key,
            diagnose=diagnose,
            training=training,
        )

    def _run(self, settings: dict[str, Any], key: str, number: int, *, stage: str, knob: str, role: str, mode: str,
             diagnose: bool = False, training: dict[str, Any] | None = None) -> TrialResult:
        name = f"{number:04d}-{role}-{knob}"
        request = self._request(settings, key, name, mode, diagnose, training)
        detail = f"{knob}={settings[knob]}" if knob in settings else ""
        self.progress.trial_started(stage=stage, knob=knob, role=role, detail=detail)
        result = self.runner.run(request, self.out_dir / "logs" / f"{name}.log", self.spec.measure.trial_timeout_s)
        # Outside every slot: on this machine, alone, unpinned (the report shows where each trial ran).
        record_local(result)
        self.state.ran += 1
        self.progress.trial_finished(result, cost=plan.arm_cost(settings, role))
        return result

    def sessions(self, asks: list[SessionAsk], exclusive: bool = False) -> list[SessionResult]:
        """Measure (or reuse) several independent sessions; one result per ask, in order.

        A session is reused only when every one of its arms finished before: its arms were
        measured side by side, so a half-stored session is measured again as a whole.
        Sessions that run are handed to the executor together, so that an executor with
        several slots runs them at once.

        With a stability guard, every session is judged by the incumbent's level and the
        window noise. A screen session measured while the machine shifted is measured
        again (as a new session with its own keys, so a resumed search replays the same
        attempts) after the guard's settling time, at most ``max_retries`` times; a
        session still unstable then is used, and its reason is appended to ``unstable``.
        A session whose pair is data for a verdict (``KEEP_ROLES``) is never re-run: the
        judgement reads the incumbent arm only, and that arm's offset is part of the
        pair's log-ratio, so dropping the pairs it flags would keep a biased sample (with
        +0.15 log offsets in 10 % of processes, 8 % false ``improved`` at the margin
        instead of 0.5 %). Such a session is kept and marked, and the next sessions wait
        the settling time, which chooses no data.

        Args:
            asks: The sessions.
            exclusive: Run each with no other session beside it (the final check).
        """
        ran_before = self.state.ran
        results = self._sessions_once(asks, exclusive)
        if self.machine is not None and self.state.ran > ran_before:
            self.machine.sample(time.time() - self.state.started)
        if self.guard is None:
            return results
        from trainopt.decide.stability import observe

        pending = list(range(len(asks)))
        current = list(asks)
        retry = 0
        settle = False
        while pending:
            again = []
            for j in pending:
                ask, res = current[j], results[j]
                info = res.arms[0].session or {}
                t_s = info.get("finished_s", time.time() - self.state.started)
                obs = observe(res, 0, t_s=t_s, stage=ask.stage, knob=ask.knob, role=ask.role,
                              settings_hash=plan.settings_hash(ask.arms[0]))
                check = self.guard.check(obs)
                final = check.stable or retry >= self.guard.max_retries or ask.role in KEEP_ROLES
                self.guard.record(obs, check, retry=retry, final=final)
                if not final:
                    again.append(j)
                elif not check.stable:
                    self.unstable.append(f"{ask.role} session of {ask.knob}: {check.reason}")
                    # Nothing to wait for on a replay (every session came from the store).
                    settle = settle or (ask.role in KEEP_ROLES and self.state.ran > ran_before)
            if not again:
                if settle:
                    # The pairs are kept as measured; only the sessions to come wait for the machine.
                    self.progress.stage(asks[0].stage, f"machine unstable; waiting {self.guard.settle_s:g} s before the next pair")
                    self.sleep(self.guard.settle_s)
                break
            retry += 1
            for j in again:
                current[j] = SessionAsk(current[j].arms, current[j].stage, current[j].knob, current[j].role,
                                        f"{asks[j].tag}/retry{retry}")
            if any(self.store.lookup(k) is None for j in again for k in current[j].keys()):
                # Let the machine settle before measuring again (nothing to wait for on a replay).
                self.progress.stage(asks[again[0]].stage, f"machine unstable; measuring again in {self.guard.settle_s:g} s")
                self.sleep(self.guard.settle_s)
            for j, res in zip(again, self._sessions_once([current[j] for j in again], exclusive)):
                results[j] = res
            pending = again
        return results

    def _sessions_once(self, asks: list[SessionAsk], exclusive: bool) -> list[SessionResult]:
        results: list[SessionResult | None] = [None] * len(asks)
        todo: list[tuple[int, SessionAsk]] = []
        for j, ask in enumerate(asks):
            cached = [self.store.lookup(k) for k in ask.keys()]
            if all(c is not None for c in cached):
                for key, r, settings in zip(ask.keys(), cached, ask.arms):
                    self.state.reused += 1
                    self._note(key, self._meta(ask, r), r)
                    self.progress.trial_reused(plan.arm_cost(settings, ask.role))
                info = cached[0].session or {}
                results[j] = SessionResult(arms=cached, mode=info.get("mode", "sequential"), rounds=info.get("rounds", 0),
                                           note=info.get("note", ""))
            else:
                todo.append((j, ask))
        for (j, _), result in zip(todo, self._run_sessions([a for _, a in todo], exclusive)):
            results[j] = result
        return results

    def _run_sessions(self, asks: list[SessionAsk], exclusive: bool) -> list[SessionResult]:
        if not asks:
            return []
        if getattr(self.executor, "slots", 1) <= 1:
            # One slot: one session at a time, each stored as soon as it ends (progress shows
            # it, and an interrupted search keeps it).
            return [r for ask in asks for r in self._run_batch([ask], exclusive)]
        return self._run_batch(asks, exclusive)

    def _run_batch(self, asks: list[SessionAsk], exclusive: bool) -> list[SessionResult]:
        handles, jobs = [], []
        for ask in asks:
            hs, requests, logs = [], [], []
            for key, settings in zip(ask.keys(), ask.arms):
                h = self.store.begin(key, self._meta(ask, None))
                name = f"{h.number:04d}-{ask.role}-{ask.knob}"
                hs.append(h)
                requests.append(self._request(settings, key, name, "measure"))
                logs.append(self.out_dir / "logs" / f"{name}.log")
            seed = zlib.crc32(f"{self.spec.measure.seed}/{'|'.join(ask.keys())}".encode())
            handles.append(hs)
            jobs.append(SessionJob(requests, logs, self.spec.measure.trial_timeout_s, seed))
            self.progress.trial_started(stage=ask.stage, knob=ask.knob, role=ask.role, detail=self._detail(ask), arms=len(ask.arms))
        t0 = time.monotonic()
        out = self.executor.run_many(jobs, exclusive=exclusive)
        # The ETA prices an arm in the search's own wall time: sessions that ran side by side
        # on several slots share the time they took, so each arm costs its share of the batch,
        # by its weight (a compiled arm takes longer than a plain one beside it).
        per_cost = (time.monotonic() - t0) / max(1e-9, sum(plan.arm_cost(s, a.role) for a in asks for s in a.arms))
        for ask, hs, result in zip(asks, handles, out):
            for i, (key, h, arm) in enumerate(zip(ask.keys(), hs, result.arms)):
                cost = plan.arm_cost(ask.arms[i], ask.role)
                arm.session = {"id": f"{ask.role}/{ask.knob}/{ask.tag}", "arm": i, "arms": len(result.arms), "mode": result.mode,
                               "note": result.note, "rounds": result.rounds, "finished_s": round(time.time() - self.state.started, 3)}
                meta = self._meta(ask, arm)
                self.store.finish(h, key, meta, arm)
                self._note(key, meta, arm)
                self.state.ran += 1
                self.progress.trial_finished(arm, wall_s=per_cost * cost, cost=cost)
        return out

    @staticmethod
    def _detail(ask: SessionAsk) -> str:
        arms = ask.arms
        # A held-out session's third arm is the baseline (``HeldOutSessions``).
        third = ask.role == "holdout" and len(arms) == 3
        values = [str(s.get(ask.knob)) for s in (arms[:2] if third else arms) if ask.knob in s]
        return (f"{ask.knob}=" + " vs ".join(values) + (", and the baseline" if third else "")) if values else ""

    @staticmethod
    def _meta(ask: SessionAsk, result: TrialResult | None) -> dict[str, Any]:
        return {"stage": ask.stage, "knob": ask.knob, "role": ask.role, "tag": ask.tag, "mode": "measure"}

    def pair_sessions(self, incumbent: dict[str, Any], candidate: dict[str, Any], *, stage: str, knob: str, role: str,
                      planned: Callable[[int], int], exclusive: bool = False,
                      extra: dict[str, Any] | None = None) -> Callable[[int], Pair]:
        """A ``next_pair`` for ``confirmation.confirm`` from fresh two-arm sessions [incumbent, candidate].

        Asked for pair ``i``, it measures every pair up to ``planned(i)`` at once (the
        rule's next look: the rule cannot stop before it, so those pairs are needed
        anyway), which lets an executor with several slots run them side by side.

        With ``extra`` every session has a third arm of those settings (the baseline in a
        held-out session, so the same sessions also compare the candidate with it); the
        sessions measured so far are in ``next_pair.sessions`` by pair index.
        """
        base = f"{plan.settings_hash(incumbent)}-vs-{plan.settings_hash(candidate)}"
        if extra is not None:
            base += f"-and-{plan.settings_hash(extra)}"
        arms = [incumbent, candidate, *([extra] if extra is not None else [])]
        got: dict[int, SessionResult] = {}

        def next_pair(i: int) -> Pair:
            if i not in got:
                upto = max(i + 1, planned(i))
                asks = [SessionAsk(arms, stage, knob, role, f"{base}/pair{k}") for k in range(i, upto)]
                for k, result in zip(range(i, upto), self.sessions(asks, exclusive=exclusive)):
                    got[k] = result
            s = got[i]
            return Pair(candidate=s.arms[1], incumbent=s.arms[0])

        next_pair.sessions = got  # type: ignore[attr-defined]
        return next_pair

    def _note(self, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        self.state.trials.append(TrialRecord(id=len(self.state.trials), key=key, result=result, **meta))
