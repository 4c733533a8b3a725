"""The broker's sessions inside the real search: batching up to the rule's looks, reuse of
whole sessions only, and the stability guard's re-runs and marks (fake runners, no processes)."""

from __future__ import annotations

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore
from tests.loaded import LoadedMachine, hog
from trainopt.contract.spec import spec_from_dict
from trainopt.decide.sequential import SequentialRule
from trainopt.decide.stability import StabilityGuard
from trainopt.execute.executors import SerialExecutor
from trainopt.search.search import Search

BUDGET = {"pairs": 6, "max_pairs": 20, "confidence": 0.95}


class CountingExecutor(SerialExecutor):
    """Records the size of every batch of sessions and claims several slots, so batches stay whole."""

    slots = 4

    def __init__(self, runner):
        super().__init__(runner)
        self.batches: list[tuple[str, int]] = []

    def run_many(self, jobs, exclusive=False):
        self.batches.append((jobs[0].requests[0].trial_id.split("/")[0], len(jobs)))
        return super().run_many(jobs, exclusive)


def make(tmp_path, runner, search, executor=None, guard=None, store=None):
    spec = spec_from_dict(tiny_spec_dict(search=search, measure=BUDGET), "t.yaml", tmp_path)
    return Search(spec, tmp_path, runner, store or MemoryStore(), executor=executor, guard=guard), spec


def test_confirmation_pairs_are_measured_together_up_to_each_look(tmp_path):
    runner = FakeRunner({}, arm_sd=0.2, session_sd=0.0, seed=4)
    executor = CountingExecutor(runner)
    search, spec = make(tmp_path, runner, {"amp": ["off", "bf16"]}, executor=executor)
    doc = search.run()
    (amp,) = [d for d in doc["decisions"] if d["knob"] == "amp"]
    rule = SequentialRule.from_measure(spec.measure, family=1)
    looks, n = [], 0
    while n < amp["n_pairs"]:
        looks.append(rule.next_look(n) - n)
        n = rule.next_look(n)
    assert [size for role, size in executor.batches if role == "confirm"] == looks
    assert [size for role, size in executor.batches if role == "screen"] == [1]


def test_a_half_stored_session_is_measured_again_as_a_whole(tmp_path):
    store = MemoryStore()
    first = FakeRunner({("amp", "bf16"): 1.3}, seed=1)
    make(tmp_path, first, {"amp": ["off", "bf16"]}, store=store)[0].run()
    # Forget one arm of the screen session, as a kill between storing its arms would.
    screen_keys = [k for k in store._done if k.startswith("screen/amp/")]
    assert len(screen_keys) == 2
    del store._done[screen_keys[1]]
    again = FakeRunner({("amp", "bf16"): 1.3}, seed=2)
    doc = make(tmp_path, again, {"amp": ["off", "bf16"]}, store=store)[0].run()
    assert [len(s) for s in again.sessions] == [2]  # only the screen session ran again, both arms
    assert doc["counts"]["trials_run"] == 2


def test_under_a_cpu_hog_the_guard_marks_pair_sessions_without_dropping_them_and_the_search_stays_right(tmp_path):
    # After a quiet start, a hog takes half the machine 5 s in every 12; a no-op knob and a real +30 % win.
    h = hog(5, 7, 0.5)
    machine = LoadedMachine({("num_workers", 2): 1.3}, load=lambda t: h(t) if t > 120 else 1.0, arm_sd=0.03,
                            session_sd=0.05, seed=7)
    guard = StabilityGuard(settle_s=6.0)
    search, _ = make(tmp_path, machine, {"num_workers": [0, 2], "prefetch_factor": [None, 4]}, guard=guard)
    slept: list[float] = []
    search.broker.sleep = lambda s: (slept.append(s), machine.sleep(s))
    doc = search.run()
    verdicts = {d["knob"]: d for d in doc["decisions"]}
    assert verdicts["num_workers"]["kept"] and verdicts["num_workers"]["verdict"] == "improved"
    assert verdicts["prefetch_factor"]["verdict"] not in ("improved", "regressed")
    st = doc["stability"]
    assert any(not p["stable"] for p in st["points"])
    # Only screens are re-run (as sessions of their own, keys with /retryN); a pair session
    # the guard flags is kept as measured, so the guard picks no pairs.
    retried = [t["key"] for t in doc["trials"] if "/retry" in t["key"]]
    assert all(k.startswith("screen/") for k in retried), retried
    assert all(p["retry"] == 0 for p in st["points"] if p["role"] != "screen")
    flagged_pairs = [p for p in st["points"] if p["role"] != "screen" and not p["stable"]]
    assert flagged_pairs and all(p["final"] for p in flagged_pairs)
    # The sessions after a flagged pair waited for the machine to settle.
    assert slept and all(x == guard.settle_s for x in slept)
    for d in doc["decisions"]:
        if d["extra"].get("unstable"):
            assert any(f"{d['knob']}={d['to']}" in w for w in doc["warnings"]), doc["warnings"]


def test_a_session_still_unstable_after_its_retries_marks_the_verdict_and_warns(tmp_path):
    # The hog is on for most of every period: retries cannot find a steady machine.
    h = hog(9, 1, 0.3)
    machine = LoadedMachine({("amp", "bf16"): 1.3}, load=lambda t: h(t) if t > 60 else 1.0, arm_sd=0.03, session_sd=0.05, seed=3)
    guard = StabilityGuard(settle_s=1.0, max_retries=1)
    search, _ = make(tmp_path, machine, {"amp": ["off", "bf16"]}, guard=guard)
    search.broker.sleep = machine.sleep
    doc = search.run()
    (amp,) = [d for d in doc["decisions"] if d["knob"] == "amp"]
    assert amp["extra"].get("unstable"), amp
    assert doc["stability"]["unstable_verdicts"] >= 1
    assert any("unstable" in w and "amp=bf16" in w for w in doc["warnings"]), doc["warnings"]


def test_with_several_slots_the_screen_is_split_into_sessions_that_run_together(tmp_path):
    runner = FakeRunner({("num_workers", 2): 1.4}, arm_sd=0.02, session_sd=0.0, seed=3)
    executor = CountingExecutor(runner)
    executor.slots = 2
    doc = make(tmp_path, runner, {"num_workers": [0, 1, 2, 3]}, executor=executor)[0].run()
    # One batch of two screen sessions, each with its own incumbent arm (a near miss may
    # add a batch of its second screen after it).
    assert [size for role, size in executor.batches if role == "screen"][0] == 2
    screens = [s for s in runner.sessions if s[0].trial_id.startswith("screen/num_workers/screen")]
    assert [len(s) for s in screens] == [2, 3]
    assert all(s[0].settings["num_workers"] == 0 for s in screens)
    assert sorted(r.settings["num_workers"] for s in screens for r in s[1:]) == [1, 2, 3]
    decisions = {d["to"]: d for d in doc["decisions"] if d["knob"] == "num_workers"}
    assert set(decisions) == {1, 2, 3} and all(d["screen_speedup"] for d in decisions.values())
    assert decisions[2]["verdict"] == "improved" and decisions[2]["kept"]


def test_the_eta_prices_arms_that_ran_side_by_side_at_their_share_of_the_batch(tmp_path):
    import time

    from trainopt.search.progress import NullProgress

    class SlowExecutor(CountingExecutor):
        """Two slots; every batch takes 0.05 s of wall time however many sessions it holds."""

        slots = 2
        spent = 0.0

        def run_many(self, jobs, exclusive=False):
            t0 = time.monotonic()
            time.sleep(0.05)
            out = super().run_many(jobs, exclusive)
            self.spent += time.monotonic() - t0
            return out

    class Walls(NullProgress):
        def __init__(self):
            self.walls = []

        def trial_finished(self, result, wall_s=None, cost=1.0):
            self.walls.append(wall_s)

    runner = FakeRunner({("amp", "bf16"): 1.0}, arm_sd=0.1, session_sd=0.0, seed=2)
    executor, progress = SlowExecutor(runner), Walls()
    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure=BUDGET), "t.yaml", tmp_path)
    Search(spec, tmp_path, runner, MemoryStore(), progress=progress, executor=executor).run()
    session_walls = [w for w in progress.walls if w is not None]
    assert any(size > 1 for _, size in executor.batches)  # some batches ran several sessions at once
    # The arms' prices add up to the time the batches took, not to slots times that.
    assert abs(sum(session_walls) - executor.spent) < 0.1 * executor.spent


def test_a_held_out_session_with_the_baseline_says_so_in_its_progress_detail():
    from trainopt.search.broker import SessionAsk, TrialBroker

    base, inc, cand = {"compile": "off", "batch_size": 32}, {"compile": "off", "batch_size": 256}, {"compile": "default", "batch_size": 256}
    assert TrialBroker._detail(SessionAsk([inc, cand, base], "compile", "compile", "holdout", "t")) == (
        "compile=off vs default, and the baseline")
    assert TrialBroker._detail(SessionAsk([inc, cand], "compile", "compile", "holdout", "t")) == "compile=off vs default"
    assert TrialBroker._detail(SessionAsk([inc, cand, cand], "compile", "compile", "screen", "t")) == (
        "compile=off vs default vs default")


class BusyProbe:
    """A machine check that says busy before the search (no /proc read)."""

    def __init__(self, busy):
        self.before = {"busy": busy, "reason": "other processes used 1.00 of 2 CPUs (yes 1.00)"}
        self.busy_now = busy
        self.samples = 0

    def sample(self, t_s=None):
        self.samples += 1

    def to_dict(self):
        return {"before": self.before, "during": [], "busy_samples": 0, "samples": self.samples, "max_others": None}


def test_a_threads_change_confirmed_while_the_machine_is_busy_is_not_adopted(tmp_path):
    for busy in (True, False):
        # The baseline runs 1 thread; 2 confirm as faster.
        runner = FakeRunner({("threads", 2): 1.5}, arm_sd=0.02, session_sd=0.0, seed=2)
        search, _ = make(tmp_path, runner, {"threads": [1, 2]})
        search.state.machine = search.broker.machine = probe = BusyProbe(busy)
        doc = search.run()
        (d,) = [d for d in doc["decisions"] if d["knob"] == "threads"]
        assert d["verdict"] == "improved" and probe.samples >= 1
        assert d["kept"] is (not busy), d
        assert ("not adopted: the machine was busy" in d["reason"]) is busy
        assert doc["machine"]["before"]["busy"] is busy
        assert any("busy before the search" in w for w in doc["warnings"]) is busy
