"""The fake runner used by simulations: it drives the real search and its sessions behave as specified."""

from __future__ import annotations

import math
import statistics

import pytest

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, breakdown_of, noise_draw
from trainopt.contract.protocol import TrialRequest
from trainopt.contract.spec import spec_from_dict
from trainopt.search.search import Search
from trainopt.search.store import TrialStore


def request(settings, mode="measure", diagnose=False):
    return TrialRequest(spec={}, source_dir=".", settings=settings, mode=mode, result_path="/nonexistent", diagnose=diagnose)


def test_fake_runner_drives_the_search_probes_and_confirmations(tmp_path):
    runner = FakeRunner({("amp", "bf16"): 1.5, ("batch_size", 32): 1.3}, process_sd=0.02, fits_up_to=100, seed=1)
    spec = tiny_spec_dict(search={"amp": ["off", "bf16"], "batch_size": {"max": 256}}, measure={"pairs": 4, "max_pairs": 8})
    spec = spec_from_dict(spec, "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", spec.name, spec.fingerprint())
    doc = Search(spec, tmp_path, runner, store).run()
    assert doc["best"]["settings"]["amp"] == "bf16"
    assert doc["best"]["settings"]["batch_size"] == 32
    assert doc["batch_size"]["max_fitting"] <= 100 < max(p["size"] for p in doc["batch_size"]["probes"])
    assert doc["speedup"] == pytest.approx(1.5 * 1.3, rel=0.05)
    assert any(r.mode == "probe" for r in runner.requests)


def test_session_ratios_cancel_the_shared_noise_and_keep_the_per_arm_noise():
    runner = FakeRunner({("amp", "bf16"): 1.1}, arm_sd=0.05, session_sd=0.3, seed=2)
    inc, cand = request({"amp": "off", "batch_size": 16}), request({"amp": "bf16", "batch_size": 16})
    logs = [runner.run_session([inc, cand], [], 60, seed=i) for i in range(2000)]
    r = [math.log(s.ratio(1, 0)) for s in logs]
    assert statistics.mean(r) == pytest.approx(math.log(1.1), abs=0.01)
    assert statistics.stdev(r) == pytest.approx(0.05 * math.sqrt(2), rel=0.1)
    levels = [math.log(s.arms[0].samples_per_s / 1000) for s in logs]
    assert statistics.stdev(levels) > 0.25  # the session-wide swing is there, and cancels above
    assert logs[0].mode == "interleaved" and sorted(logs[0].order[0]) == [0, 1]


def test_a_failing_arm_is_classified_alone():
    runner = FakeRunner(fits_up_to=64)
    s = runner.run_session([request({"batch_size": 16}), request({"batch_size": 128})], [], 60, seed=0)
    assert s.arms[0].ok and s.arms[1].status == "oom"
    assert s.ratio(1, 0) is None
    assert runner.run(request({"batch_size": 128}, "probe"), None, 60).status == "oom"
    assert runner.run(request({"batch_size": 64}, "probe"), None, 60).ok


@pytest.mark.parametrize("tail", ["normal", "t3", "contaminated"])
def test_noise_draws_have_the_asked_spread(tail):
    import random

    rng = random.Random(3)
    x = [noise_draw(rng, 0.1, tail) for _ in range(20000)]
    assert statistics.median(x) == pytest.approx(0, abs=0.01)
    assert statistics.pstdev(x) == pytest.approx(0.1, rel=0.15)


def test_only_diagnosed_trials_report_the_chosen_breakdown_and_run_costs():
    shares = {"data_wait": 0.3, "forward": 0.4, "backward": 0.2}
    fixed = breakdown_of(shares, device_type="cuda", device_busy=0.7)
    assert fixed["shares"]["other"] == pytest.approx(0.1) and sum(fixed["shares"].values()) == pytest.approx(1.0)
    costs = {"checkpoint_s": 1.0, "eval_s": 2.0, "eval_batches": 5}
    runner = FakeRunner(breakdown=fixed, run_costs=costs)
    r = runner.run(request({"batch_size": 16}, diagnose=True), None, 60)
    assert r.breakdown == fixed and r.breakdown is not fixed and r.run_costs == costs
    plain = runner.run(request({"batch_size": 16}), None, 60)
    assert plain.breakdown is None and plain.run_costs is None
    arms = runner.run_session([request({"batch_size": 16}), request({"batch_size": 32})], [], 60, seed=0).arms
    assert [a.breakdown for a in arms] == [None, None]
    # Per settings: a function of the trial's settings, which may report none.
    per = FakeRunner(breakdown=lambda s: fixed if s["batch_size"] == 16 else None)
    assert per.run(request({"batch_size": 16}, diagnose=True), None, 60).breakdown == fixed
    assert per.run(request({"batch_size": 32}, diagnose=True), None, 60).breakdown is None
    # Without a chosen breakdown a diagnosed trial reports none, as one without the profiled window.
    assert FakeRunner().run(request({"batch_size": 16}, diagnose=True), None, 60).breakdown is None
