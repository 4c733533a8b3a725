"""The search's decisions, driven by a fake runner with a known throughput model.

The fake runner answers like real trials would (ok / oom / failure statuses, windows,
peak memory) from a formula over the settings plus seeded noise, so each rule of the
search — screen, confirm with fresh pairs, adopt, batch back-off, compile break-even,
resume from the store — is checked in milliseconds.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path

import pytest

from tests.conftest import tiny_spec_dict
from tests.fakes import training_result
from trainopt.contract.protocol import TrialRequest, TrialResult
from trainopt.contract.spec import spec_from_dict
from trainopt.search.search import Search, SearchFailed
from trainopt.search.store import SpecChangedError, TrialStore


class FakeRunner:
    """Throughput = base x effects(settings) x lognormal noise; OOM above ``fits_up_to``."""

    def __init__(self, effects=None, fits_up_to=10**9, noise=0.02, fail=None, compile_s=0.0, seed=0, final_factor=1.0,
                 late_roles=("final",), wait=0.05, trains=None):
        # final_factor scales the candidate's runs in the final check only (and in the
        # held-out pairs too with late_roles=("holdout", "final")): the settings measured
        # slower (or faster) against the baseline than the confirmations suggested.
        self.final_factor = final_factor
        self.late_roles = late_roles
        # The share of each step spent waiting for the DataLoader, at num_workers 0 (none with workers).
        self.wait = wait
        self.effects = effects or {}
        self.fits_up_to = fits_up_to
        self.noise = noise
        self.fail = fail or {}
        self.compile_s = compile_s
        self.rng = random.Random(seed)
        self.requests: list[TrialRequest] = []
        # Training-check runs: settings that train worse or turn non-finite (``tests.fakes.fake_losses``).
        self.trains = trains or {}

    def run(self, request: TrialRequest, log_path: Path, timeout_s: float) -> TrialResult:
        self.requests.append(request)
        s = request.settings
        env = {"device_type": "cpu", "device_name": "fake", "torch": "x"}
        if s["batch_size"] > self.fits_up_to:
            return TrialResult(status="oom", settings=s, mode=request.mode, error="fake OOM", env=env)
        for (knob, value), status in self.fail.items():
            if s.get(knob) == value:
                return TrialResult(status=status, settings=s, mode=request.mode, error=f"fake {status}", env=env)
        if request.mode == "probe":
            return TrialResult(status="ok", settings=s, mode="probe", peak_memory_bytes=s["batch_size"] * 2**20, env=env, dataset_len=4096)
        if request.mode == "train":
            return training_result(request, self.trains)
        speed = 1000.0
        for (knob, value), factor in self.effects.items():
            if s.get(knob) == value:
                speed *= factor
        if request.trial_id.split("/")[0] in self.late_roles and "/arm1/" in request.trial_id:
            speed *= self.final_factor
        speed *= math.exp(self.rng.gauss(0, self.noise))
        return TrialResult(
            status="ok", settings=s, mode="measure", samples_per_s=speed, windows=[speed] * 4,
            step_time_s=s["batch_size"] / speed, data_wait_fraction=self.wait if s["num_workers"] == 0 else 0.0,
            peak_memory_bytes=s["batch_size"] * 2**20,
            compile_s=self.compile_s if s["compile"] != "off" else None, env=env, dataset_len=4096,
        )


def make_search(tmp_path, runner, search, **measure):
    spec = spec_from_dict(tiny_spec_dict(search=search, measure={"pairs": 4, "max_pairs": 8, **measure}), "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    return Search(spec, tmp_path, runner, store), spec


def by_knob(doc, knob):
    return [d for d in doc["decisions"] if d["knob"] == knob]


def test_clear_win_is_confirmed_and_adopted_and_a_loss_is_not(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5, ("amp", "fp16"): 0.7})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16", "fp16"]})
    doc = search.run()
    amp = {d["to"]: d for d in by_knob(doc, "amp")}
    assert amp["bf16"]["verdict"] == "improved" and amp["bf16"]["kept"]
    assert amp["bf16"]["ci"][0] > 1.03 and amp["bf16"]["n_pairs"] >= 4
    assert amp["fp16"]["verdict"] == "screened-out" and not amp["fp16"]["kept"]
    assert doc["best"]["settings"]["amp"] == "bf16"
    assert doc["final"]["verdict"] == "improved" and doc["speedup"] == pytest.approx(1.5, rel=0.05)
    assert doc["best"]["source"] == "final-check"
    assert doc["complete"]


def test_confirmation_uses_fresh_trials_not_the_screen(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    roles = [t["role"] for t in doc["trials"] if t["knob"] == "amp"]
    assert roles.count("screen") == 2  # incumbent + candidate
    assert roles.count("confirm") == 2 * by_knob(doc, "amp")[0]["n_pairs"]
    keys = [t["key"] for t in doc["trials"]]
    assert len(keys) == len(set(keys))


def test_no_effect_is_never_adopted(tmp_path):
    runner = FakeRunner({}, noise=0.03, seed=3)
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1, 2]})
    doc = search.run()
    assert not any(d["kept"] for d in doc["decisions"])
    assert doc["final"]["verdict"] == "unchanged" and doc["speedup"] == 1.0


def test_failed_candidate_gets_its_status_as_verdict(tmp_path):
    runner = FakeRunner({("amp", "fp16"): 2.0}, fail={("amp", "fp16"): "nonfinite"})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "fp16"]})
    doc = search.run()
    (d,) = by_knob(doc, "amp")
    assert d["verdict"] == "nonfinite" and not d["kept"]
    assert doc["best"]["settings"]["amp"] == "off"


def test_not_applicable_is_recorded_without_running(tmp_path):
    runner = FakeRunner()
    search, _ = make_search(tmp_path, runner, {"pin_memory": [False, True], "cudnn_benchmark": [True]})
    doc = search.run()
    assert {d["verdict"] for d in doc["decisions"]} == {"not_applicable"}
    assert all(not r.settings["pin_memory"] and not r.settings["cudnn_benchmark"] for r in runner.requests)


def test_batch_stage_backs_off_from_oom_and_adopts_the_fastest_not_the_largest(tmp_path):
    # 64 is fastest; 128 and the largest fitting size are slower (as on CPUs with cache pressure).
    runner = FakeRunner({("batch_size", 64): 1.4, ("batch_size", 128): 1.1}, fits_up_to=300)
    search, _ = make_search(tmp_path, runner, {"batch_size": {"max": 1024}})
    doc = search.run()
    b = doc["batch_size"]
    # A CPU without a memory cap: the maximum is probed first; it fails, so the ladder follows.
    assert [p["size"] for p in b["probes"]] == [1024, 16, 32, 64, 128, 256, 512, 384, 320, 288, 304, 296]
    assert b["max_fitting"] == 296 and b["safe_max"] == 264
    assert [p["fits"] for p in b["probes"]][-2:] == [False, True]
    assert doc["best"]["settings"]["batch_size"] == 64
    assert "learning rate" in b["lr_hint"]


def test_batch_stage_on_an_uncapped_cpu_probes_only_the_maximum_when_it_fits(tmp_path):
    runner = FakeRunner({("batch_size", 256): 1.3})
    search, _ = make_search(tmp_path, runner, {"batch_size": {"max": 256}})
    doc = search.run()
    assert [p["size"] for p in doc["batch_size"]["probes"]] == [256]
    assert [r.settings["batch_size"] for r in runner.requests if r.mode == "probe"] == [256]
    assert doc["batch_size"]["max_fitting"] == doc["batch_size"]["safe_max"] == 256
    # Every power of two above the incumbent is still a candidate: memory grows with the batch.
    assert sorted({d["to"] for d in doc["decisions"] if d["knob"] == "batch_size"}) == [32, 64, 128, 256]


def test_under_a_memory_cap_the_batch_stage_doubles_from_the_incumbent(tmp_path):
    runner = FakeRunner()
    spec = spec_from_dict(tiny_spec_dict(search={"batch_size": {"max": 256}}, limits={"memory_gb": 4.0},
                                         measure={"pairs": 4, "max_pairs": 8}), "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path, runner, store).run()
    assert [p["size"] for p in doc["batch_size"]["probes"]] == [16, 32, 64, 128, 256]


def test_effective_batch_is_kept_with_grad_accum(tmp_path):
    runner = FakeRunner({("batch_size", 64): 1.4})
    spec = tiny_spec_dict(search={"batch_size": {"max": 128}}, limits={"effective_batch": 128},
                          baseline={"batch_size": 16, "grad_accum": 8}, measure={"pairs": 4, "max_pairs": 8})
    spec = spec_from_dict(spec, "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'x.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path, runner, store).run()
    best = doc["best"]["settings"]
    assert best["batch_size"] * best["grad_accum"] == 128
    assert all(r.settings["batch_size"] * r.settings["grad_accum"] == 128 for r in runner.requests if r.mode == "measure")


def test_compile_must_repay_its_compile_time_within_the_run_length(tmp_path):
    runner = FakeRunner({("compile", "default"): 1.3}, compile_s=5000.0)
    spec = tiny_spec_dict(search={"compile": ["off", "default"]}, run_length_steps=10, measure={"pairs": 4, "max_pairs": 8})
    spec = spec_from_dict(spec, "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'c.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path, runner, store).run()
    (d,) = by_knob(doc, "compile")
    assert not d["kept"] and "repays" in d["reason"]
    assert d["extra"]["break_even_steps"] > 10


def test_baseline_failure_stops_the_search(tmp_path):
    runner = FakeRunner(fail={("batch_size", 16): "error"})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    with pytest.raises(SearchFailed, match="baseline"):
        search.run()


def test_resume_reuses_every_finished_trial(tmp_path):
    effects = {("amp", "bf16"): 1.5, ("num_workers", 1): 1.2}
    first = FakeRunner(effects)
    search, spec = make_search(tmp_path, first, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    doc1 = search.run()
    again = FakeRunner(effects)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    doc2 = Search(spec, tmp_path, again, store).run()
    assert again.requests == []
    assert [d["verdict"] for d in doc2["decisions"]] == [d["verdict"] for d in doc1["decisions"]]
    assert doc2["counts"]["trials_reused"] == len(doc1["trials"])


def test_a_changed_spec_is_refused_by_the_store(tmp_path):
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    TrialStore(url, "tiny", "aaaa")
    with pytest.raises(SpecChangedError, match="--fresh"):
        TrialStore(url, "tiny", "bbbb")
    assert TrialStore(url, "tiny", "bbbb", fresh=True).records() == []


@pytest.mark.parametrize("change", [{"max_pairs": 16}, {"confidence": 0.8}, {"min_speedup": 0.01}, {"error_scope": "search"}])
def test_a_stored_search_run_again_with_another_pair_budget_is_refused_with_the_reason(tmp_path, change):
    # Extending a confirmation's budget after its pairs were seen voids its error bound:
    # the stored confirmations are not reused under the new budget.
    search, spec = make_search(tmp_path, FakeRunner({("amp", "bf16"): 1.5}), {"amp": ["off", "bf16"]})
    search.run()
    other = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={"pairs": 4, "max_pairs": 8, **change}),
                           "t.yaml", tmp_path)
    with pytest.raises(SpecChangedError, match="voids their error bound"):
        TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", other.name, other.fingerprint())


def _best_yaml(tmp_path, doc, spec):
    import yaml

    from trainopt.outputs.results import write_outputs

    write_outputs(tmp_path, doc, spec.resolved())
    return yaml.safe_load((tmp_path / "best.yaml").read_text())


def test_a_final_check_that_regresses_falls_back_to_the_first_confirmed_change(tmp_path):
    # bf16 and one loader worker each confirm, but the combination regresses against the baseline
    # in the held-out sessions of the loader worker, which are the final check.
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 1.2})
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    original = runner.run

    def slower_when_held_out(request, log_path, timeout_s):
        result = original(request, log_path, timeout_s)
        if request.trial_id.startswith("holdout/num_workers/") and "/arm1/" in request.trial_id:
            result.samples_per_s *= 0.5
        return result

    runner.run = slower_when_held_out
    doc = search.run()
    assert "held-out sessions of num_workers=1" in doc["final"]["reason"]
    assert [d["kept"] for d in doc["decisions"]] == [True, True]
    assert doc["final"]["verdict"] == "regressed"
    best = doc["best"]
    assert best["source"] == "first-kept-change"
    assert best["settings"] == {**spec.baseline, "amp": "bf16"}
    # The reason says what the final check did; its verdict and figures are its own line's.
    assert "the final check contradicts the kept changes together" in best["reason"] and "amp off -> bf16" in best["reason"]
    amp = by_knob(doc, "amp")[0]
    assert doc["speedup"] == amp["speedup"] and doc["speedup_ci"] == amp["ci"]
    written = _best_yaml(tmp_path, doc, spec)
    assert written["settings"] == best["settings"]
    assert written["provenance"]["settings_source"] == "first-kept-change"
    assert [k["knob"] for k in written["provenance"]["kept"]] == ["amp"]


@pytest.mark.parametrize("final_factor,verdict", [(0.5, "regressed"), (1 / 1.5, "equivalent")])
def test_a_final_check_that_does_not_confirm_the_only_change_keeps_the_baseline(tmp_path, final_factor, verdict):
    # The only kept change: the final check is its held-out pairs, which measured it slower.
    runner = FakeRunner({("amp", "bf16"): 1.5}, final_factor=final_factor, noise=0.005, late_roles=("holdout", "final"))
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    assert by_knob(doc, "amp")[0]["kept"]
    assert doc["final"]["verdict"] == verdict and doc["final"]["reused_pairs"] == 6
    assert doc["best"]["source"] == "baseline"
    assert doc["best"]["settings"] == spec.baseline
    assert doc["speedup"] == 1.0 and doc["speedup_ci"] is None
    assert doc["best"]["samples_per_s"] == doc["baseline"]["samples_per_s"]
    written = _best_yaml(tmp_path, doc, spec)
    assert written["settings"]["amp"] == "off"
    assert written["provenance"]["settings_source"] == "baseline"
    assert written["provenance"]["kept"] == []
    from trainopt.settings.export import render_export

    assert "bfloat16" not in render_export(tmp_path, "torch")


def test_a_failed_final_trial_falls_back_to_the_first_kept_change(tmp_path):
    # Two kept changes and a final check of 8 pairs: 6 from the held-out sessions, 2 of its own.
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 1.5})
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]}, pairs=8, max_pairs=16)
    original = runner.run

    def crash_in_final(request, log_path, timeout_s):
        if request.trial_id.startswith("final/final/") and request.settings["amp"] == "bf16":
            return TrialResult(status="crashed", settings=request.settings, error="fake crash", env={"device_type": "cpu"})
        return original(request, log_path, timeout_s)

    runner.run = crash_in_final
    doc = search.run()
    assert doc["final"]["verdict"] == "crashed"
    assert doc["best"]["source"] == "first-kept-change"
    assert (doc["best"]["settings"]["amp"], doc["best"]["settings"]["num_workers"]) == ("bf16", 0)


def test_the_only_kept_change_s_held_out_pairs_are_the_final_check(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 0.8})
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    doc = search.run()
    amp = by_knob(doc, "amp")[0]
    assert amp["kept"] and not by_knob(doc, "num_workers")[0]["kept"]
    roles = [t["role"] for t in doc["trials"]]
    assert "final" not in roles and roles.count("holdout") == 12
    final = doc["final"]
    assert (final["verdict"], final["n_pairs"], final["reused_pairs"]) == ("improved", 6, 6)
    # The same six pairs as the held-out estimate: the same figure and interval.
    assert final["speedup"] == pytest.approx(amp["speedup"]) and final["ci"] == pytest.approx(amp["ci"])
    assert "the held-out pairs of amp=bf16" in final["reason"]
    assert doc["best"]["settings"]["amp"] == "bf16" and doc["best"]["source"] == "final-check"
    # Resumed from the store, it runs nothing and comes to the same final check.
    again = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 0.8})
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    doc2 = Search(spec, tmp_path, again, store).run()
    assert again.requests == [] and doc2["final"]["speedup"] == final["speedup"]


def test_a_final_check_of_more_pairs_than_the_held_out_ones_adds_the_rest(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"]}, pairs=8, max_pairs=16)
    doc = search.run()
    final = doc["final"]
    assert (final["verdict"], final["n_pairs"], final["reused_pairs"]) == ("improved", 8, 6)
    assert [t["role"] for t in doc["trials"]].count("final") == 4 and "and 2 more" in final["reason"]


def test_after_two_kept_changes_the_final_check_is_the_baseline_arms_of_the_last_held_out_sessions(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 1.5}, noise=0.01)
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    doc = search.run()
    assert [d["kept"] for d in doc["decisions"]] == [True, True]
    holdout = [t for t in doc["trials"] if t["role"] == "holdout"]
    # amp, the first kept change, has no held-out sessions of its own: num_workers' six
    # three-arm ones (the baseline third) measure it too, against the baseline.
    assert [t["knob"] for t in holdout].count("amp") == 0 and [t["knob"] for t in holdout].count("num_workers") == 18
    amp = by_knob(doc, "amp")[0]
    assert amp["speedup"] == pytest.approx(1.5, rel=0.05) and amp["extra"]["holdout"]["n_pairs"] == 6
    assert "holdout_pending" not in amp["extra"]
    assert "incumbent and baseline arms of the held-out sessions of num_workers=1" in amp["reason"]
    assert amp["reason"].count("held-out estimate") == 1
    third = [t for t in holdout if t["knob"] == "num_workers" and t["settings"]["amp"] == "off"]
    assert len(third) == 6 and all(t["settings"] == spec.baseline for t in third)
    final = doc["final"]
    assert "final" not in [t["role"] for t in doc["trials"]]
    assert (final["verdict"], final["n_pairs"], final["reused_pairs"]) == ("improved", 6, 6)
    assert "baseline arms of the held-out sessions of num_workers=1" in final["reason"]
    # Both changes at 1.5x: the final settings run 2.25x the baseline in those sessions.
    assert final["speedup"] == pytest.approx(2.25, rel=0.05)
    nw = by_knob(doc, "num_workers")[0]
    assert nw["speedup"] == pytest.approx(1.5, rel=0.05) and nw["extra"]["holdout"]["n_pairs"] == 6
    # Resumed from the store, it runs nothing and comes to the same final check.
    again = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 1.5}, noise=0.01)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    doc2 = Search(spec, tmp_path, again, store).run()
    assert again.requests == [] and doc2["final"]["speedup"] == final["speedup"]


def test_loader_workers_are_not_confirmed_when_the_loader_wait_bounds_them_below_the_margin(tmp_path):
    # The incumbent waits 1 % of each step for its batches: workers can make it at most
    # 1/(1 - 0.02) = 1.0204x faster at twice that wait, below the 1.03x margin. The fake
    # screens them faster (as a noisy screen can): measured, but not confirmed.
    runner = FakeRunner({("num_workers", 2): 1.08}, wait=0.01)
    search, spec = make_search(tmp_path, runner, {"num_workers": [0, 2]})
    doc = search.run()
    (nw,) = by_knob(doc, "num_workers")
    assert nw["verdict"] == "screened-out" and not nw["kept"] and nw["screen_speedup"] > 1.03
    assert "waited for the DataLoader in 1.0% of each step" in nw["reason"] and "at most 1.020x" in nw["reason"]
    roles = {t["role"] for t in doc["trials"] if t["knob"] == "num_workers"}
    assert roles == {"screen"}
    # With a tenth of each step waiting, workers may win: confirmed as usual.
    (tmp_path / "slow").mkdir()
    runner = FakeRunner({("num_workers", 2): 1.08}, wait=0.10)
    search, _ = make_search(tmp_path / "slow", runner, {"num_workers": [0, 2]})
    (nw,) = by_knob(search.run(), "num_workers")
    assert nw["verdict"] == "improved" and nw["kept"]
    # min_speedup 0: no wait bounds a gain below a zero margin unless there is no wait at all.
    (tmp_path / "zero").mkdir()
    runner = FakeRunner({("num_workers", 2): 1.08}, wait=0.01)
    search, _ = make_search(tmp_path / "zero", runner, {"num_workers": [0, 2]}, min_speedup=0.0)
    (nw,) = by_knob(search.run(), "num_workers")
    assert nw["verdict"] == "improved"


def test_the_eta_is_told_where_a_confirmation_stands_at_each_look_it_goes_on_from(tmp_path):
    # A change right at the margin: the rule goes on past its looks to the budget.
    runner = FakeRunner({("amp", "bf16"): 1.03}, noise=0.02)
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    told, remaining = [], []
    original = search.stage.on_look
    search.stage.on_look = lambda *a: (told.append(a), original(*a))
    search.progress.set_remaining = remaining.append
    doc = search.run()
    (amp,) = by_knob(doc, "amp")
    looks = [4, 6, 8]
    # Told once per look it went on from (every look before the one that stopped it), with the next one.
    passed = [n for n in looks if n < amp["n_pairs"]]
    assert passed and [t[:3] for t in told] == [(0, n, looks[looks.index(n) + 1]) for n in passed]
    assert all(list(t[3]) == looks for t in told)
    assert len(remaining) >= 2 + len(told)


def test_the_first_kept_change_s_held_out_pairs_wait_for_the_end_when_nothing_later_is_kept(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 0.8}, noise=0.01)
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    checkpoints = []
    search.on_checkpoint = checkpoints.append
    doc = search.run()
    ids = [r.trial_id for r in runner.requests]
    held = [i for i, t in enumerate(ids) if t.startswith("holdout/amp/")]
    later = [i for i, t in enumerate(ids) if "/num_workers/" in t]
    # Measured once num_workers is decided (it kept nothing): they are the final check's pairs.
    assert len(held) == 12 and later and min(held) > max(later)
    # Until then the partial results say the figure is still to come.
    amp_then = by_knob(checkpoints[0], "amp")[0]
    assert amp_then["kept"] and amp_then["extra"].get("holdout_pending") and "to come" in amp_then["reason"]
    amp = by_knob(doc, "amp")[0]
    assert amp["kept"] and "holdout_pending" not in amp["extra"] and "to come" not in amp["reason"]
    assert amp["extra"]["holdout"]["n_pairs"] == 6 and doc["final"]["reused_pairs"] == 6


def test_a_search_stopped_before_the_late_held_out_pairs_resumes_without_measuring_twice(tmp_path):
    effects = {("amp", "bf16"): 1.5, ("num_workers", 1): 0.8}
    first = FakeRunner(effects, noise=0.01)
    search, spec = make_search(tmp_path, first, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    original = first.run

    def stop_at_the_late_held_out_pairs(request, log_path, timeout_s):
        if request.trial_id.startswith("holdout/amp/") and len([r for r in first.requests if r.trial_id.startswith("holdout/")]) > 5:
            raise KeyboardInterrupt
        return original(request, log_path, timeout_s)

    first.run = stop_at_the_late_held_out_pairs
    with pytest.raises(KeyboardInterrupt):
        search.run()
    done = {r.trial_id for r in first.requests[:-1]}
    again = FakeRunner(effects, noise=0.01)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path, again, store).run()
    rerun = [r.trial_id for r in again.requests]
    # The late held-out pairs, the training check's runs, then the recommended settings'
    # diagnosis trial that had not run yet.
    assert rerun[-1].startswith("diagnosis/final/")
    assert [t.split("/")[1] for t in rerun if t.startswith("training/")] == ["reference", "twin", "recommended"]
    rerun = [t for t in rerun[:-1] if not t.startswith("training/")]
    assert rerun and not done & set(rerun) and all(t.startswith("holdout/amp/") for t in rerun)
    assert by_knob(doc, "amp")[0]["extra"]["holdout"]["n_pairs"] == 6 and doc["final"]["reused_pairs"] == 6


def test_a_third_arm_that_fails_leaves_the_final_check_to_measure_its_own_pairs(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 1.5}, noise=0.01)
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], "num_workers": [0, 1]})
    original = runner.run

    def crash_third_arm(request, log_path, timeout_s):
        if request.trial_id.startswith("holdout/num_workers/") and request.trial_id.split("/")[-2] == "arm2":
            return TrialResult(status="crashed", settings=request.settings, error="fake crash", env={"device_type": "cpu"})
        return original(request, log_path, timeout_s)

    runner.run = crash_third_arm
    doc = search.run()
    assert [d["kept"] for d in doc["decisions"]] == [True, True]
    assert [t["role"] for t in doc["trials"]].count("final") == 12 and "reused_pairs" not in doc["final"]
    assert doc["final"]["verdict"] == "improved"
    # amp's held-out figure was to come from those sessions: it keeps the deciding interval's, and says so.
    amp = by_knob(doc, "amp")[0]
    assert amp["kept"] and "holdout" not in amp["extra"] and "holdout_pending" not in amp["extra"]
    assert "deciding interval's" in amp["reason"] and "to come" not in amp["reason"]


def test_held_out_sessions_run_alone_on_several_slots(tmp_path):
    from trainopt.execute.executors import SerialExecutor
    from trainopt.execute.session_runners import SequentialSessionRunner

    class TwoSlots(SerialExecutor):
        # Says it has two slots (the broker then batches sessions) and notes which batches
        # had to run with no other session beside them.
        slots = 2

        def __init__(self, runner):
            super().__init__(runner)
            self.batches = []

        def run_many(self, jobs, exclusive=False):
            self.batches.append(([j.requests[0].trial_id.split("/")[:2] for j in jobs], exclusive))
            return super().run_many(jobs, exclusive)

    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 1.5})
    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"], "num_workers": [0, 1]},
                                         measure={"pairs": 4, "max_pairs": 8}), "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    executor = TwoSlots(SequentialSessionRunner(runner))
    doc = Search(spec, tmp_path, runner, store, executor=executor).run()
    assert [d["kept"] for d in doc["decisions"]] == [True, True]
    alone = {tuple(ids[0]): exclusive for ids, exclusive in executor.batches}
    # Every held-out session may be the final check's, so each runs alone; they are the final check here
    # (amp, the first kept change, is measured in them too).
    assert alone[("holdout", "num_workers")] and ("holdout", "amp") not in alone and ("final", "final") not in alone
    assert not alone[("confirm", "amp")] and not alone[("confirm", "num_workers")]
    # With amp the only kept change, its held-out pairs (measured alone) are the final check.
    (tmp_path / "one").mkdir()
    runner = FakeRunner({("amp", "bf16"): 1.5})
    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={"pairs": 4, "max_pairs": 8}), "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'one' / 'trials.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path / "one", runner, store, executor=TwoSlots(SequentialSessionRunner(runner))).run()
    assert "final" not in [t["role"] for t in doc["trials"]] and doc["final"]["reused_pairs"] == 6


def test_the_cli_summary_says_where_the_recommended_settings_come_from(tmp_path):
    from trainopt.outputs.summary import search_summary as _summary

    runner = FakeRunner({("amp", "bf16"): 1.5}, final_factor=0.5, late_roles=("holdout", "final"))
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    text = _summary(search.run())
    assert "recommended (best.yaml): baseline: the final check contradicts the kept change;" in text
    assert text.count("fresh pairs show the change slower than") == 1
    assert "final check: regressed:" in text
    # The baseline stays: one throughput figure, not the final check's baseline arms against the
    # one-shot baseline trial as if they were before and after.
    assert "samples/s (the baseline stays); speedup 1.000x" in text and " -> " not in text.split("throughput:")[1].split("\n")[0]


def test_the_summary_and_the_report_say_the_final_check_once(tmp_path):
    from trainopt.outputs.report import write_report
    from trainopt.outputs.summary import search_summary as _summary

    search, _ = make_search(tmp_path, FakeRunner({("amp", "bf16"): 1.5}), {"amp": ["off", "bf16"]})
    doc = search.run()
    assert doc["best"]["source"] == "final-check"
    text = _summary(doc)
    claim = "fresh pairs do not show the change slower than the 1.030x margin a single change must clear"
    assert doc["final"]["claim_text"] == claim
    assert text.count(claim) == 1 and "contradict" not in text.replace("does not contradict them", "")
    assert "recommended (best.yaml): final-check: every kept change: the final check does not contradict them" in text
    # The final check's figures are the speedup line's: its own line gives the verdict and the test only.
    final_line = next(line for line in text.splitlines() if line.startswith("final check: "))
    assert "[" not in final_line and "(the speedup above)" in final_line
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert html.count(claim) == 1
    # A sentence in the report starts with a capital.
    assert re.search(r"Final check: [A-Z][a-z]+ over \d+ fresh pairs \(the speedup above\); fresh pairs", html)


def test_the_results_document_is_made_from_a_plain_state(tmp_path):
    from trainopt.decide.verdict import Decision
    from trainopt.search.document import build_results
    from trainopt.search.state import SearchState, TrialRecord

    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}), "t.yaml", tmp_path)
    state = SearchState.for_spec(spec, tmp_path)
    base = TrialResult(status="ok", settings=dict(spec.baseline), samples_per_s=100.0, step_time_s=0.16,
                       data_wait_fraction=0.1, peak_memory_bytes=2048, env={"device_type": "cpu"},
                       log_path=str(tmp_path / "logs" / "0000-baseline-baseline.log"))
    state.baseline = base
    state.trials.append(TrialRecord(id=0, key="baseline/baseline/0/x", stage="baseline", knob="baseline", role="baseline",
                                    tag="0", mode="measure", result=base))
    state.order, state.done_knobs, state.ran, state.reused = ["amp"], [], 1, 0
    state.decisions.append(Decision(knob="amp", stage="precision", from_value="off", to_value="bf16", verdict="improved",
                                    kept=True, speedup=1.4, ci=[1.3, 1.5], n_pairs=6, after_samples_per_s=140.0))
    doc = build_results(state, complete=False)
    assert doc["name"] == "tiny" and doc["spec_fingerprint"] == spec.fingerprint()
    assert doc["missing"] == ["amp", "final check"] and doc["complete"] is False
    assert doc["baseline"]["samples_per_s"] == 100.0 and doc["baseline"]["peak_memory_bytes"] == 2048
    assert doc["best"]["settings"] == {**spec.baseline, "amp": "bf16"} and doc["best"]["source"] == "first-kept-change"
    assert (doc["speedup"], doc["speedup_ci"], doc["best"]["samples_per_s"]) == (1.4, [1.3, 1.5], 140.0)
    assert doc["decisions"][0]["from"] == "off" and doc["decisions"][0]["to"] == "bf16"
    assert doc["trials"][0]["log"] == "logs/0000-baseline-baseline.log"
    assert doc["counts"] == {"trials_run": 1, "trials_reused": 0}
    assert doc["measure"] == spec.measure.model_dump(mode="json")


@pytest.mark.parametrize("later", [{}, {"num_workers": [0, 1]}], ids=["only knob", "a later knob keeps nothing"])
def test_a_candidate_that_fails_in_its_held_out_pairs_is_not_adopted(tmp_path, later):
    # With a later knob that keeps nothing, the first kept change's held-out pairs run at the end.
    runner = FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 1): 0.8}, noise=0.01)
    search, spec = make_search(tmp_path, runner, {"amp": ["off", "bf16"], **later})
    original = runner.run

    def crash_in_holdout(request, log_path, timeout_s):
        if request.trial_id.startswith("holdout/") and request.settings["amp"] == "bf16":
            return TrialResult(status="crashed", settings=request.settings, error="fake crash", env={"device_type": "cpu"})
        return original(request, log_path, timeout_s)

    runner.run = crash_in_holdout
    doc = search.run()
    (amp,) = by_knob(doc, "amp")
    assert amp["verdict"] == "crashed" and not amp["kept"] and "held-out pair" in amp["reason"]
    assert doc["final"]["verdict"] == "unchanged" and doc["best"]["settings"] == spec.baseline


def _confirmed(doc, knob):
    return {t["settings"][knob] for t in doc["trials"] if t["knob"] == knob and t["role"] == "confirm"}


def test_candidates_are_confirmed_best_screen_first_until_one_is_improved(tmp_path):
    # Both beat the incumbent; bf16 screens faster, is confirmed and kept, and fp16 costs
    # no confirmation at all.
    runner = FakeRunner({("amp", "bf16"): 1.6, ("amp", "fp16"): 1.3})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16", "fp16"]})
    doc = search.run()
    amp = {d["to"]: d for d in by_knob(doc, "amp")}
    assert amp["bf16"]["verdict"] == "improved" and amp["bf16"]["kept"]
    assert amp["fp16"]["verdict"] == "screened-out" and not amp["fp16"]["kept"]
    assert "amp=bf16, which screened faster, was confirmed improved" in amp["fp16"]["reason"]
    assert _confirmed(doc, "amp") == {"off", "bf16"}
    # The second choice still shared the error budget it was selected with.
    assert amp["bf16"]["extra"]["confirmed_with"] == 2


def test_the_second_choice_is_confirmed_when_the_first_is_not_improved(tmp_path):
    # fp16 screens faster (its screen arm is lucky: doubled there only) but is no faster
    # in fresh pairs, so bf16, the second choice, is confirmed next.
    class LuckyScreen(FakeRunner):
        def run(self, request, log_path, timeout_s):
            result = super().run(request, log_path, timeout_s)
            if request.trial_id.startswith("screen/") and request.settings["amp"] == "fp16" and result.samples_per_s:
                result.samples_per_s *= 2.0
            return result

    runner = LuckyScreen({("amp", "bf16"): 1.5})
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16", "fp16"]})
    doc = search.run()
    amp = {d["to"]: d for d in by_knob(doc, "amp")}
    assert amp["fp16"]["screen_speedup"] > amp["bf16"]["screen_speedup"]
    # Confirmed on fresh pairs (at least the first look's 3), and not improved there.
    assert amp["fp16"]["verdict"] != "improved" and amp["fp16"]["n_pairs"] >= 3
    assert amp["bf16"]["verdict"] == "improved" and amp["bf16"]["kept"]
    assert _confirmed(doc, "amp") == {"off", "bf16", "fp16"}


def test_the_eta_is_recounted_once_a_screen_has_selected_what_to_confirm(tmp_path):
    from trainopt.search.progress import NullProgress

    class Recorder(NullProgress):
        def __init__(self):
            self.counts = []

        def set_remaining(self, trials):
            self.counts.append(trials)

    # Both candidates are far slower: the screen selects none, so the knob has nothing left,
    # and with nothing kept there will be no final check either.
    runner = FakeRunner({("amp", "bf16"): 0.5, ("amp", "fp16"): 0.4})
    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16", "fp16"], "pin_memory": [False, True]},
                                         measure={"pairs": 4, "max_pairs": 8}), "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    progress = Recorder()
    Search(spec, tmp_path, runner, store, progress=progress).run()
    # Before the first screen: amp's screen (3 arms at 1.4), one typical confirmation, the
    # held-out pairs and the final check at their expected shares; pin_memory runs nothing on this CPU.
    assert progress.counts[0] > 3 * 1.4 + 8
    assert progress.counts[1] == 0


def test_the_cold_compile_is_paid_in_a_trial_of_its_own_and_charged_to_compile(tmp_path):
    # The one-shot trial before the screen compiles cold (300 s); every later compile arm
    # finds the cache warm (2 s). The 300 s are what the break-even is judged on.
    class CompileCache(FakeRunner):
        def run(self, request, log_path, timeout_s):
            result = super().run(request, log_path, timeout_s)
            if result.compile_s is not None:
                result.compile_s = 300.0 if request.trial_id.startswith("cold-compile/") else 2.0
            return result

    runner = CompileCache({("compile", "default"): 1.3})
    spec = tiny_spec_dict(search={"compile": ["off", "default"]}, run_length_steps=10**6, measure={"pairs": 4, "max_pairs": 8})
    spec = spec_from_dict(spec, "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'c.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path, runner, store).run()
    ids = [r.trial_id for r in runner.requests]
    cold = [i for i, t in enumerate(ids) if t.startswith("cold-compile/")]
    first_screen = next(i for i, t in enumerate(ids) if t.startswith("screen/compile/"))
    assert len(cold) == 1 and cold[0] < first_screen
    assert runner.requests[cold[0]].settings["compile"] == "default"
    (d,) = by_knob(doc, "compile")
    assert d["verdict"] == "improved" and d["kept"]
    assert d["extra"]["compile_s"] == 300.0
    # Resumed, the cold trial is reused, not compiled again.
    again = CompileCache({("compile", "default"): 1.3})
    Search(spec, tmp_path, again, TrialStore(f"sqlite:///{tmp_path / 'c.db'}", spec.name, spec.fingerprint())).run()
    assert again.requests == []


class UnluckyFirstScreen(FakeRunner):
    """The candidate's arm in the first screen session runs ``factor`` times its truth."""

    def __init__(self, *args, factor=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.factor = factor

    def run(self, request, log_path, timeout_s):
        result = super().run(request, log_path, timeout_s)
        if request.trial_id.startswith("screen/amp/screen/") and request.settings["amp"] != "off" and result.samples_per_s:
            result.samples_per_s *= self.factor
        return result


def _screen_tags(runner):
    return {r.trial_id.split("/")[2] for r in runner.requests if r.trial_id.startswith("screen/")}


def test_a_near_miss_in_the_screen_is_screened_again_and_judged_by_both_sessions(tmp_path):
    # A real 1.5x win whose first screen arm ran slow (0.945x): below the gate, above the
    # floor. A second screen session reads 1.5x; the geometric mean clears the gate, and
    # the change is confirmed and kept.
    runner = UnluckyFirstScreen({("amp", "bf16"): 1.5}, factor=0.63, noise=0.0)
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    (amp,) = by_knob(doc, "amp")
    assert _screen_tags(runner) == {"screen", "rescreen"}
    first, second = amp["extra"]["screens"]
    assert first == pytest.approx(0.945) and second == pytest.approx(1.5)
    assert amp["screen_speedup"] == pytest.approx(math.sqrt(0.945 * 1.5))
    assert amp["verdict"] == "improved" and amp["kept"]


def test_a_second_screen_that_confirms_the_miss_screens_the_candidate_out(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 0.95}, noise=0.0)
    search, _ = make_search(tmp_path, runner, {"amp": ["off", "bf16"]})
    (amp,) = by_knob(search.run(), "amp")
    assert _screen_tags(runner) == {"screen", "rescreen"}
    assert amp["verdict"] == "screened-out" and amp["extra"]["screens"] == pytest.approx([0.95, 0.95])
    assert "two screen sessions, 0.950x and 0.950x" in amp["reason"]


@pytest.mark.parametrize("search, knob, effects", [
    ({"amp": ["off", "bf16"]}, "amp", {("amp", "bf16"): 0.85}),  # far below the gate
    # Two cleared the gate: confirmation has no room for the near miss.
    ({"num_workers": [0, 1, 2, 3]}, "num_workers",
     {("num_workers", 1): 1.3, ("num_workers", 2): 1.2, ("num_workers", 3): 0.95}),
])
def test_no_second_screen_far_below_the_gate_or_once_confirmation_is_full(tmp_path, search, knob, effects):
    runner = FakeRunner(effects, noise=0.0)
    search, _ = make_search(tmp_path, runner, search)
    doc = search.run()
    assert _screen_tags(runner) == {"screen"}
    assert all("screens" not in d["extra"] for d in by_knob(doc, knob))


def test_a_near_miss_is_screened_again_while_confirmation_has_room():
    from trainopt.decide.screen import rescreen_candidates

    assert rescreen_candidates([0.95, 0.85, None, 0.97], gate=0.98, floor=0.90, max_confirm=2) == [0, 3]
    # One cleared the gate, a second confirmation is still free: the near miss gets its second screen.
    assert rescreen_candidates([0.95, 0.99], gate=0.98, floor=0.90, max_confirm=2) == [0]
    assert rescreen_candidates([0.95, 0.99, 1.2], gate=0.98, floor=0.90, max_confirm=2) == []
    assert rescreen_candidates([0.95, 0.99], gate=0.98, floor=0.90, max_confirm=1) == []
    assert rescreen_candidates([0.80, None], gate=0.98, floor=0.90, max_confirm=2) == []
    assert rescreen_candidates([0.90, 0.98 - 1e-9], gate=0.98, floor=0.90, max_confirm=2) == [0, 1]
    assert rescreen_candidates([0.95], gate=0.98, floor=None, max_confirm=2) == []


class SlowTrials(FakeRunner):
    """Trials whose key starts with one of ``slow`` run at ``factor`` times their truth."""

    def __init__(self, *args, slow=(), factor=1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.slow, self.factor = slow, factor

    def run(self, request, log_path, timeout_s):
        result = super().run(request, log_path, timeout_s)
        if request.trial_id.startswith(self.slow) and result.samples_per_s:
            result.samples_per_s *= self.factor
        return result


def test_the_final_check_is_compared_with_the_first_screen_not_the_one_shot_baseline_trial(tmp_path):
    # The one-shot baseline trial runs 1.5x slow (a fresh process, unlike the session arms):
    # no warning, since the first screen's incumbent arm agrees with the final check.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    runner = SlowTrials({("amp", "bf16"): 1.6}, slow=("baseline/",), factor=1 / 1.5, noise=0.0)
    search, _ = make_search(tmp_path / "a", runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    assert doc["final"]["verdict"] == "improved" and doc["warnings"] == []
    # The first screen's incumbent 1.5x slow against the final check: warned, and named.
    runner = SlowTrials({("amp", "bf16"): 1.6}, slow=("screen/amp/screen/arm0/",), factor=1 / 1.5, noise=0.0)
    search, _ = make_search(tmp_path / "b", runner, {"amp": ["off", "bf16"]})
    doc = search.run()
    assert any("the first screen session at 667 samples/s (1.50x)" in w for w in doc["warnings"]), doc["warnings"]
