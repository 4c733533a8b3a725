"""One-knob-at-a-time search: baseline, then per knob screen -> confirm -> adopt, then a final check.

Each step asks for trials by a deterministic key; the store answers from finished trials
first, so an interrupted search resumes by simply running again. The search itself never
imports torch: trials run through a ``Runner`` and come back as ``TrialResult``.
"""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainopt import batch as batch_mod
from trainopt import knobs, plan, stats
from trainopt.distributed import grad_accum_for
from trainopt.progress import NullProgress
from trainopt.protocol import TrialRequest, TrialResult
from trainopt.runner import Runner
from trainopt.spec import Spec
from trainopt.store import TrialStore

__all__ = ["Search", "SearchFailed", "Decision"]


class SearchFailed(Exception):
    """The search cannot go on (for example, the baseline itself fails)."""


@dataclass
class Decision:
    """The verdict on changing one knob from the incumbent's value to a candidate's."""

    knob: str
    stage: str
    from_value: Any
    to_value: Any
    verdict: str
    reason: str = ""
    speedup: float | None = None
    ci: list[float] | None = None
    n_pairs: int = 0
    coverage: float | None = None
    screen_speedup: float | None = None
    before_samples_per_s: float | None = None
    after_samples_per_s: float | None = None
    before_peak_memory_bytes: int | None = None
    after_peak_memory_bytes: int | None = None
    kept: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median(values: list[float]) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


@dataclass
class _Confirmation:
    interval: stats.PairedInterval | None
    verdict: str
    reason: str
    candidate: list[TrialResult]
    incumbent: list[TrialResult]


class Search:
    """Orchestrates one search over a spec.

    Args:
        spec: The validated spec.
        out_dir: The output folder (trial logs and result files go here).
        runner: Runs one trial (a subprocess in production).
        store: Where finished trials are kept and looked up.
        progress: Receives progress events (stage, knob, trial, ETA).
        on_checkpoint: Called with the partial results after every decision, so that a
            search stopped at any moment leaves readable results behind.
    """

    def __init__(
        self,
        spec: Spec,
        out_dir: Path,
        runner: Runner,
        store: TrialStore,
        progress: Any = None,
        on_checkpoint: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.spec = spec
        self.cfg = spec.measure
        self.out_dir = Path(out_dir)
        self.runner = runner
        self.store = store
        self.progress = progress or NullProgress()
        self.on_checkpoint = on_checkpoint
        self.resolved = spec.resolved()
        self.device_type: str | None = None
        # Ranks per data-parallel trial, or None for single-process trials (see knobs.not_applicable_reason).
        self._world = spec.world_size if spec.distributed else None
        self.decisions: list[Decision] = []
        self.trials: list[dict[str, Any]] = []
        self.batch_info: dict[str, Any] = {}
        self.diagnosis: dict[str, Any] = {}
        self.baseline: TrialResult | None = None
        self.final: dict[str, Any] = {}
        self.started = time.time()
        self.reused = 0
        self.ran = 0
        self.order: list[str] = []
        self.done_knobs: list[str] = []

    # ---- trials -------------------------------------------------------------------

    def trial(self, settings: dict[str, Any], *, stage: str, knob: str, role: str, tag: str, mode: str = "measure") -> TrialResult:
        """Run (or reuse) one trial identified by what it measures and why."""
        key = f"{role}/{knob}/{tag}/{plan.settings_hash(settings)}"
        meta = {"stage": stage, "knob": knob, "role": role, "tag": tag, "mode": mode}
        cached = self.store.lookup(key)
        if cached is not None:
            self.reused += 1
            self._note_trial(key, meta, cached)
            self.progress.trial_reused()
            return cached
        reason = knobs.not_applicable_reason(settings, self.device_type, self._world) if self.device_type else None
        handle = self.store.begin(key, meta)
        number = handle.number
        if reason:
            result = TrialResult(status="not_applicable", settings=settings, mode=mode, error=reason)
        else:
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
            self.progress.trial_started(stage=stage, knob=knob, role=role, detail=_describe(settings, knob))
            timeout = self.cfg.trial_timeout_s
            result = self.runner.run(request, self.out_dir / "logs" / f"{name}.log", timeout)
            self.ran += 1
            self.progress.trial_finished(result)
        self.store.finish(handle, key, meta, result)
        self._note_trial(key, meta, result)
        return result

    def _note_trial(self, key: str, meta: dict[str, Any], result: TrialResult) -> None:
        self.trials.append({"id": len(self.trials), "key": key, **meta, "result": result})

    # ---- confirmation ---------------------------------------------------------------

    def confirm(self, incumbent: dict[str, Any], candidate: dict[str, Any], *, stage: str, knob: str) -> _Confirmation:
        """Fresh, interleaved pairs of incumbent and candidate until a verdict is reached.

        Screening figures are never reused here: the candidate was chosen *because* its
        screen looked good, and reusing that run would bias the verdict upwards.
        """
        base = f"{plan.settings_hash(incumbent)}-vs-{plan.settings_hash(candidate)}"
        rng = random.Random(zlib.crc32(f"{self.cfg.seed}/{knob}/{base}".encode()))
        cand_runs: list[TrialResult] = []
        inc_runs: list[TrialResult] = []
        interval = None
        i = 0
        while True:
            order = ("candidate", "incumbent") if rng.random() < 0.5 else ("incumbent", "candidate")
            pair: dict[str, TrialResult] = {}
            for who in order:
                settings = candidate if who == "candidate" else incumbent
                pair[who] = self.trial(settings, stage=stage, knob=knob, role="confirm", tag=f"{base}/pair{i}/{who}")
                if not pair[who].ok:
                    break
            i += 1
            cand, inc = pair.get("candidate"), pair.get("incumbent")
            if cand is not None and not cand.ok:
                return _Confirmation(None, cand.status, f"candidate trial {cand.status}: {cand.error}", cand_runs + [cand], inc_runs)
            if inc is not None and not inc.ok:
                return _Confirmation(None, "inconclusive", f"incumbent trial {inc.status} during confirmation: {inc.error}", cand_runs, inc_runs + [inc])
            cand_runs.append(cand)
            inc_runs.append(inc)
            if i < self.cfg.pairs:
                continue
            interval = stats.paired_interval(
                [r.samples_per_s for r in cand_runs], [r.samples_per_s for r in inc_runs], self.cfg.confidence, self.cfg.interval
            )
            if not stats.needs_more_pairs(interval, self.cfg.min_speedup, self.cfg.max_pairs):
                break
        v = stats.verdict(interval, self.cfg.min_speedup)
        extra = f" after adding pairs up to {interval.n}" if interval.n > self.cfg.pairs else ""
        reason = f"{interval.speedup:.3f}x [{interval.low:.3f}, {interval.high:.3f}] over {interval.n} pairs{extra}"
        return _Confirmation(interval, v, reason, cand_runs, inc_runs)

    # ---- stages -------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        """Run the whole search and return the results document."""
        base_settings = dict(self.spec.baseline)
        self.progress.stage("baseline", "measuring the baseline")
        self.baseline = self.trial(base_settings, stage="baseline", knob="baseline", role="baseline", tag="0")
        if not self.baseline.ok:
            self._checkpoint(complete=False)
            raise SearchFailed(
                f"the baseline trial failed ({self.baseline.status}: {self.baseline.error}); "
                f"fix the spec's baseline or workload and run again (log: {self.baseline.log_path})"
            )
        self.device_type = self.baseline.env.get("device_type", "cpu")
        self.diagnosis = plan.diagnose(self.baseline.data_wait_fraction)
        self.order = plan.knob_order(self.spec.search, self.spec.search_order, self.diagnosis["bottleneck"])
        incumbent = base_settings
        self._update_eta(0)
        for index, name in enumerate(self.order):
            stage = knobs.KNOBS[name].stage
            self.progress.stage(stage, name)
            if name == "batch_size":
                incumbent = self._batch_stage(incumbent)
            else:
                incumbent = self._knob_stage(incumbent, name, stage, self.spec.search[name])
            self.done_knobs.append(name)
            self._update_eta(index + 1)
            self._checkpoint(complete=False)
        self.progress.stage("final", "final check against the baseline")
        self._final_check(base_settings, incumbent)
        return self._checkpoint(complete=True)

    def _update_eta(self, knobs_done: int) -> None:
        remaining = 0
        for name in self.order[knobs_done:]:
            if name == "batch_size":
                remaining += 8 + self.spec.batch_search.max_candidates + 2 * self.cfg.pairs
            else:
                remaining += 1 + len(self.spec.search[name]) + 2 * self.cfg.pairs
        remaining += 2 * self.cfg.pairs
        self.progress.set_remaining(remaining)

    def _screen(self, incumbent: dict[str, Any], cands: list[dict[str, Any]], stage: str, knob: str):
        """One fresh run of the incumbent and of each candidate; point speedups only."""
        ref = self.trial(incumbent, stage=stage, knob=knob, role="screen", tag="incumbent")
        if not ref.ok:
            raise SearchFailed(
                f"the incumbent failed while screening {knob} ({ref.status}: {ref.error}); log: {ref.log_path}"
            )
        screens = []
        for settings in cands:
            r = self.trial(settings, stage=stage, knob=knob, role="screen", tag="candidate")
            sp = (r.samples_per_s / ref.samples_per_s) if r.ok and r.samples_per_s else None
            screens.append((settings, r, sp))
        return ref, screens

    def _decide(self, incumbent: dict[str, Any], knob: str, stage: str, ref: TrialResult, screens) -> dict[str, Any]:
        """Turn screens into decisions, confirm the most promising, adopt it if improved."""
        threshold = 1.0 + self.cfg.min_speedup
        viable = [(s, r, sp) for s, r, sp in screens if sp is not None]
        best = max(viable, key=lambda t: t[2]) if viable else None
        adopted = incumbent
        for settings, r, sp in screens:
            d = Decision(
                knob=knob,
                stage=stage,
                from_value=incumbent[knob],
                to_value=settings[knob],
                verdict="",
                screen_speedup=sp,
                before_samples_per_s=ref.samples_per_s,
                after_samples_per_s=r.samples_per_s,
                before_peak_memory_bytes=ref.peak_memory_bytes,
                after_peak_memory_bytes=r.peak_memory_bytes,
            )
            if knob == "batch_size":
                d.extra["grad_accum"] = settings["grad_accum"]
            if not r.ok:
                d.verdict, d.reason = r.status, r.error or r.status
            elif best is None or settings is not best[0] or sp <= threshold:
                d.verdict = "screened-out"
                d.reason = f"screened at {sp:.3f}x; " + (
                    f"below the {threshold:.2f}x needed to confirm" if sp <= threshold else "another candidate screened faster"
                )
            else:
                conf = self.confirm(incumbent, settings, stage=stage, knob=knob)
                d.verdict, d.reason = conf.verdict, conf.reason
                if conf.interval is not None:
                    iv = conf.interval
                    d.speedup, d.ci, d.n_pairs, d.coverage = iv.speedup, [iv.low, iv.high], iv.n, iv.coverage
                    d.before_samples_per_s = _median([x.samples_per_s for x in conf.incumbent])
                    d.after_samples_per_s = _median([x.samples_per_s for x in conf.candidate])
                    d.before_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in conf.incumbent) or None
                    d.after_peak_memory_bytes = max((x.peak_memory_bytes or 0) for x in conf.candidate) or None
                if knob == "compile" and conf.interval is not None:
                    self._judge_compile(d, conf, r)
                if d.verdict == "improved":
                    d.kept = True
                    adopted = settings
            self.decisions.append(d)
        return adopted

    def _judge_compile(self, d: Decision, conf: _Confirmation, screen: TrialResult) -> None:
        """Compile counts as improved only if its per-step gain repays the compile time.

        The compile time charged is the largest seen (normally the screen's, which ran
        with a cold compiler cache): later trials reuse the on-disk cache, but the first
        production run on a new machine pays the cold cost.
        """
        compile_s = max([x.compile_s or 0.0 for x in [screen, *conf.candidate]])
        step_inc = _median([x.step_time_s for x in conf.incumbent])
        low = conf.interval.low
        gain = step_inc * (1.0 - 1.0 / low) if (step_inc and low > 1.0) else 0.0
        break_even = compile_s / gain if gain > 0 else None
        d.extra.update(compile_s=compile_s, break_even_steps=break_even, run_length_steps=self.spec.run_length_steps)
        if d.verdict == "improved" and (break_even is None or break_even > self.spec.run_length_steps):
            d.verdict = "inconclusive"
            d.reason += (
                f"; compile takes {compile_s:.1f} s and repays it only after "
                f"{'never' if break_even is None else f'{break_even:,.0f}'} steps, beyond run_length_steps "
                f"{self.spec.run_length_steps:,}"
            )

    def _knob_stage(self, incumbent: dict[str, Any], knob: str, stage: str, values: list[Any]) -> dict[str, Any]:
        cands = plan.candidates(incumbent, knob, values)
        runnable = []
        for settings in cands:
            reason = knobs.not_applicable_reason(settings, self.device_type, self._world)
            if reason:
                # Recorded, not run: a no-op on this device would only measure noise.
                self.trial(settings, stage=stage, knob=knob, role="screen", tag="candidate")
                self.decisions.append(
                    Decision(knob=knob, stage=stage, from_value=incumbent[knob], to_value=settings[knob], verdict="not_applicable", reason=reason)
                )
            else:
                runnable.append(settings)
        if not runnable:
            return incumbent
        ref, screens = self._screen(incumbent, runnable, stage, knob)
        return self._decide(incumbent, knob, stage, ref, screens)

    def _batch_stage(self, incumbent: dict[str, Any]) -> dict[str, Any]:
        bs = self.spec.batch_search
        eff = self.spec.limits.effective_batch
        maximum = bs.max
        if self.baseline and self.baseline.dataset_len:
            maximum = min(maximum, self.baseline.dataset_len)
        search = batch_mod.BatchSizeSearch(start=incumbent["batch_size"], maximum=maximum, margin=bs.margin)
        probes = []
        while (size := search.next_probe()) is not None:
            settings = plan.with_knob(incumbent, "batch_size", size)
            r = self.trial(settings, stage="batch", knob="batch_size", role="probe", tag=str(size), mode="probe")
            # Any failure counts as "does not fit": a size that crashed or hung is never
            # worth adopting, and the probe's status says why it was ruled out.
            search.record(size, r.ok)
            probes.append(
                {"size": size, "fits": r.ok, "status": r.status, "peak_memory_bytes": r.peak_memory_bytes, "error": r.error}
            )
        safe = search.safe_maximum
        self.batch_info = {
            "start": incumbent["batch_size"],
            "limit": maximum,
            "max_fitting": search.largest_fitting,
            "safe_max": safe,
            "margin": bs.margin,
            "probes": probes,
        }
        if safe is None:
            raise SearchFailed(
                f"not even batch_size {probes[-1]['size']} fits in memory; lower the model size or raise limits.memory_gb"
            )
        sizes = batch_mod.throughput_candidates(incumbent["batch_size"], safe, bs.max_candidates, eff, self.spec.world_size)
        cands = []
        for size in sizes:
            settings = plan.with_knob(incumbent, "batch_size", size)
            if eff is not None:
                settings["grad_accum"] = grad_accum_for(eff, size, self.spec.world_size)
            cands.append(settings)
        if not cands:
            return incumbent
        ref, screens = self._screen(incumbent, cands, "batch", "batch_size")
        adopted = self._decide(incumbent, "batch_size", "batch", ref, screens)
        if adopted is not incumbent:
            old, new = incumbent["batch_size"], adopted["batch_size"]
            if eff is None:
                self.batch_info["lr_hint"] = (
                    f"batch_size changed {old} -> {new}, which changes the optimisation: with the linear scaling "
                    f"rule, multiply the learning rate by {new / old:g} (and consider a warm-up), or set "
                    f"limits.effective_batch to keep batch_size x grad_accum fixed"
                )
            else:
                self.batch_info["lr_hint"] = f"effective batch kept at {eff} (grad_accum {adopted['grad_accum']}): no learning-rate change needed"
        return adopted

    def _final_check(self, base: dict[str, Any], incumbent: dict[str, Any]) -> None:
        if plan.settings_hash(base) == plan.settings_hash(incumbent):
            self.final = {
                "settings": incumbent,
                "verdict": "unchanged",
                "reason": "no change was confirmed as an improvement; the baseline stays",
                "speedup": 1.0,
                "ci": None,
                "n_pairs": 0,
                "samples_per_s": self.baseline.samples_per_s,
                "baseline_samples_per_s": self.baseline.samples_per_s,
            }
            return
        conf = self.confirm(base, incumbent, stage="final", knob="final")
        iv = conf.interval
        self.final = {
            "settings": incumbent,
            "verdict": conf.verdict,
            "reason": conf.reason,
            "speedup": iv.speedup if iv else None,
            "ci": [iv.low, iv.high] if iv else None,
            "n_pairs": iv.n if iv else 0,
            "samples_per_s": _median([x.samples_per_s for x in conf.candidate]),
            "baseline_samples_per_s": _median([x.samples_per_s for x in conf.incumbent]),
        }

    # ---- results ------------------------------------------------------------------

    def _checkpoint(self, complete: bool) -> dict[str, Any]:
        from trainopt.results import build_results

        doc = build_results(self, complete=complete)
        if self.on_checkpoint:
            self.on_checkpoint(doc)
        return doc


def _describe(settings: dict[str, Any], knob: str) -> str:
    if knob in settings:
        return f"{knob}={settings[knob]}"
    return ""
