"""Where a step's time goes: the profiled window on real tiny training steps, and its CUDA side with fakes.

The planted workloads (``tests/fixtures/planted_phases.py``) each put the time in one place,
a sleeping data set, a sleeping host read of the loss, or a wide model with nothing else,
and the tests check that the phase that holds the plant holds the time, and what the
bottleneck verdict (``trainopt.decide.bottleneck.diagnose``) makes of it.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from tests.fixtures import planted_phases as planted
from trainopt.decide.bottleneck import INPUT_BOUND_THRESHOLD, diagnose
from trainopt.knobs.catalog import default_settings
from trainopt.stats.phases import PHASES, covered_seconds
from trainopt.trial import breakdown
from trainopt.trial.breakdown import (
    PhaseTimer,
    device_intervals,
    nvml_figures,
    profile_or_none,
    profile_steps,
)
from trainopt.trial.ddp_rank import slowest_rank
from trainopt.trial.measure import Trainer, measure_throughput
from trainopt.trial.workloads import Workload, cross_entropy
from trainopt.trial.workloads.models import mlp

CPU = torch.device("cpu")
COMPUTE = ("forward", "backward", "optimizer")


@pytest.fixture(autouse=True)
def _restore_threads():
    # The threads knob sets torch's thread count for the process; give it back.
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def trainer(model, data, loss=cross_entropy, seed=0, **settings) -> Trainer:
    """A real Trainer on the CPU, one thread, plain SGD."""
    workload = Workload(model, data, loss, lambda params, impl: torch.optim.SGD(params, lr=0.01), False)
    return Trainer(workload, {**default_settings(), "threads": 1, "batch_size": 16, **settings}, CPU, seed=seed)


def warm(t: Trainer, steps: int = 3) -> Trainer:
    for _ in range(steps):
        t.step()
    return t


def wide_mlp() -> nn.Module:
    return mlp(input_shape=(256,), hidden=1024, layers=2, num_classes=4)


# ---- the profiled window on real steps ---------------------------------------------------


def test_every_phase_is_reported_and_the_shares_sum_to_one():
    t = warm(trainer(planted.small_model(), planted.fast_data()))
    b = profile_steps(t, 15)
    assert b["steps"] == 15 and b["wall_s"] > 0
    assert set(b["shares"]) == set(PHASES) and set(b["seconds"]) == set(PHASES)
    assert sum(b["shares"].values()) == pytest.approx(1.0, abs=0.02)
    # The phases are timed inside the window: with "other" they add up to its wall time.
    assert sum(b["seconds"].values()) == pytest.approx(b["wall_s"], rel=0.02)
    assert all(b["seconds"][p] > 0 for p in ("data_wait", "forward", "backward", "optimizer"))
    assert b["device_type"] == "cpu"
    assert b["device_busy"] is None and b["gpu_utilization"] is None and b["gpu_memory_used_bytes"] is None


def test_a_data_set_that_sleeps_per_item_makes_the_step_wait_for_data():
    t = warm(trainer(planted.small_model(), planted.slow_data(delay_s=0.002), num_workers=0), 2)
    b = profile_steps(t, 8)
    assert b["shares"]["data_wait"] >= 0.5, b["shares"]
    # 16 items at 2 ms each: the wait is at least the sleeps themselves.
    assert b["seconds"]["data_wait"] >= 8 * 16 * 0.002
    verdict = diagnose(b)
    assert verdict["bottleneck"] == "input" and "data_wait" in verdict["reason"]


def test_a_wide_model_without_io_is_compute_bound():
    t = warm(trainer(wide_mlp(), planted.fast_data(size=1024, features=256), batch_size=128), 2)
    b = profile_steps(t, 10)
    compute = sum(b["shares"][p] for p in COMPUTE)
    assert compute >= 0.7, b["shares"]
    assert b["shares"]["data_wait"] < INPUT_BOUND_THRESHOLD and b["shares"]["data_wait"] < compute / 5
    assert b["shares"]["loss_read"] < 0.05
    assert diagnose(b)["bottleneck"] == "compute"


def test_a_blocking_host_read_of_the_loss_is_sync_bound():
    t = warm(trainer(planted.small_model(), planted.fast_data(), planted.slow_read_loss, sync_every=1))
    b = profile_steps(t, 10)
    assert max(b["shares"], key=b["shares"].get) == "loss_read", b["shares"]
    assert b["shares"]["loss_read"] >= 0.5
    assert b["seconds"]["loss_read"] >= 10 * planted.READ_DELAY_S
    verdict = diagnose(b)
    assert verdict["bottleneck"] == "sync" and "loss_read" in verdict["reason"]


def test_the_host_read_follows_sync_every():
    # The same planted read, asked for every 5th step: a fifth of the reads, a fifth of the time.
    t = warm(trainer(planted.small_model(), planted.fast_data(), planted.slow_read_loss, sync_every=5), 2)
    b = profile_steps(t, 10)
    assert 2 * planted.READ_DELAY_S <= b["seconds"]["loss_read"] < 4 * planted.READ_DELAY_S
    t = warm(trainer(planted.small_model(), planted.fast_data(), planted.slow_read_loss, sync_every=0), 2)
    b = profile_steps(t, 10)
    assert b["seconds"]["loss_read"] < planted.READ_DELAY_S
    assert diagnose(b)["bottleneck"] != "sync"


@pytest.mark.parametrize("grad_accum", [1, 3])
def test_a_profiled_step_trains_exactly_like_a_plain_one(grad_accum):
    torch.manual_seed(0)
    plain = trainer(planted.small_model(), planted.fast_data(), grad_accum=grad_accum, batch_size=8)
    torch.manual_seed(0)
    timed = trainer(planted.small_model(), planted.fast_data(), grad_accum=grad_accum, batch_size=8)
    timer = PhaseTimer()
    for _ in range(4):
        plain.step()
        timed.step(phases=timer)
    for a, b in zip(plain.model.parameters(), timed.model.parameters()):
        assert torch.equal(a, b)
    assert plain.optimizer_steps == timed.optimizer_steps == 4
    assert timed.applier.micro_steps == 4 * grad_accum
    # Every micro-batch went through each phase; nothing was left open.
    assert all(timer.seconds[p] > 0 for p in ("data_wait", "to_device", "forward", "backward", "optimizer"))
    assert timer._open is None


class CountingClock:
    def __init__(self):
        self.calls = 0

    def __call__(self) -> float:
        import time

        self.calls += 1
        return time.perf_counter()


@pytest.mark.parametrize("grad_accum", [1, 2])
def test_a_plain_step_reads_the_clock_only_for_the_loader_wait(grad_accum):
    t = warm(trainer(planted.small_model(), planted.fast_data(), grad_accum=grad_accum, batch_size=8), 1)
    clock = CountingClock()
    t.step(clock)
    assert clock.calls == 2 * grad_accum
    # The same step told its phases reads the clock at every edge besides.
    clock.calls = 0
    t.step(clock, phases=PhaseTimer(clock))
    assert clock.calls > 2 * grad_accum + 4


def test_the_timed_loop_reads_no_clock_beyond_the_windows_and_the_loader_wait():
    t = trainer(planted.small_model(), planted.fast_data(), grad_accum=2, batch_size=8)
    clock = CountingClock()
    windows = 3
    m = measure_throughput(t, warmup_steps=3, warmup_seconds=0.0, window_seconds=0.02, windows=windows, clock=clock)
    warm_steps = m.steps - windows * m.window_steps
    assert warm_steps == 3
    loader = 2 * 2 * m.steps  # two reads per micro-batch, two micro-batches per step
    # Warm-up: start, first step's end, after the first, the one loop test that reads the
    # clock, the typical step, the warm-up's end; then two edges per window.
    assert clock.calls == loader + 6 + 2 * windows


def test_the_profiled_window_comes_after_the_timed_ones_and_leaves_their_figures():
    t = trainer(planted.small_model(), planted.fast_data())
    m = measure_throughput(t, warmup_steps=2, warmup_seconds=0.0, window_seconds=0.02, windows=3)
    before = (list(m.windows), m.samples_per_s, m.steps)
    steps_before = t.optimizer_steps
    b = profile_steps(t, 6)
    assert t.optimizer_steps == steps_before + 6 and b["steps"] == 6
    assert (m.windows, m.samples_per_s, m.steps) == before


# ---- the phase timer -------------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_phase_timer_charges_each_span_to_the_open_phase_and_syncs_at_every_edge():
    clock, syncs = FakeClock(), []
    timer = PhaseTimer(clock, sync=lambda: syncs.append(clock.now))
    timer.start("data_wait")
    clock.now = 1.0
    timer.start("forward")
    clock.now = 1.5
    timer.start("backward")
    clock.now = 3.5
    timer.stop()
    clock.now = 9.0  # between phases: "other"
    timer.stop()  # nothing open: nothing charged
    timer.start("forward")
    clock.now = 9.25
    timer.stop()
    assert timer.seconds["data_wait"] == 1.0
    assert timer.seconds["forward"] == 0.75
    assert timer.seconds["backward"] == 2.0
    assert timer.seconds["optimizer"] == 0.0
    assert syncs == [0.0, 1.0, 1.5, 3.5, 9.0, 9.25]
    with pytest.raises(ValueError, match="unknown phase"):
        timer.start("other")


def test_breakdown_steps_default_to_one_window_and_zero_means_none():
    assert breakdown.breakdown_steps({"breakdown_steps": None}, 37) == 37
    assert breakdown.breakdown_steps({}, 37) == 37
    assert breakdown.breakdown_steps({"breakdown_steps": 5}, 37) == 5
    assert breakdown.breakdown_steps({"breakdown_steps": 0}, 37) == 0


def test_no_profile_when_breakdown_steps_is_zero():
    t = warm(trainer(planted.small_model(), planted.fast_data()), 1)
    steps = t.optimizer_steps
    assert profile_or_none(t, {"breakdown_steps": 0}, 10) is None
    assert t.optimizer_steps == steps


def test_a_failure_in_the_profiled_window_gives_no_breakdown_and_says_why(capsys):
    t = warm(trainer(planted.small_model(), planted.fast_data()), 1)
    t.model = t.forward = planted.fails_when_profiled()
    assert profile_or_none(t, {"breakdown_steps": 3}, 10) is None
    err = capsys.readouterr().err
    assert "planted failure inside the profiled window" in err and "no breakdown" in err


# ---- the CUDA side, with fakes ----------------------------------------------------------


class FakeCudaTrainer:
    """The interface profile_steps uses, on a fake "cuda" device and a fake clock.

    Each step charges known seconds to each phase and records the device syncs it sees.
    """

    PLAN = {"data_wait": 0.001, "to_device": 0.002, "forward": 0.010, "backward": 0.020, "optimizer": 0.004}

    def __init__(self, clock):
        self.clock = clock
        self.device = torch.device("cuda", 0)
        self.settings = {"sync_every": 0}
        self.optimizer_steps = 0
        self.syncs = 0
        self.plain_steps = 0

    def sync(self):
        self.syncs += 1

    def step(self, clock=None, phases=None):
        for phase, seconds in self.PLAN.items():
            if phases is not None:
                phases.start(phase)
            self.clock.now += seconds
        if phases is not None:
            phases.stop()
        else:
            self.plain_steps += 1
        self.optimizer_steps += 1

    def loss_value(self):
        return 1.0


class FakeProfiler:
    """A profiler whose events are known intervals on the device and on the host."""

    def __init__(self, events, fail_on_enter=False):
        self._events, self.fail_on_enter, self.entered, self.exited = events, fail_on_enter, 0, 0

    def __enter__(self):
        if self.fail_on_enter:
            raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")
        self.entered += 1
        return self

    def __exit__(self, *exc):
        self.exited += 1
        return False

    def events(self):
        return self._events


def event(kind, start_us, end_us):
    return SimpleNamespace(device_type=kind, time_range=SimpleNamespace(start=start_us, end=end_us))


CUDA_KIND = torch.autograd.DeviceType.CUDA
HOST_KIND = torch.autograd.DeviceType.CPU


def test_device_intervals_keep_device_events_only_and_in_seconds():
    events = [event(HOST_KIND, 0, 1000), event(CUDA_KIND, 100, 300), event(CUDA_KIND, 200, 500),
              event(CUDA_KIND, 700, 700), event(CUDA_KIND, 900, 1000)]
    intervals = device_intervals(events, CUDA_KIND)
    assert intervals == [(100e-6, 300e-6), (200e-6, 500e-6), (900e-6, 1000e-6)]
    # Overlapping kernels on two streams are busy once.
    assert covered_seconds(intervals) == pytest.approx(500e-6)


@pytest.fixture
def no_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError


def test_on_cuda_phases_sync_at_every_edge_and_busy_comes_from_a_second_unsynced_pass(no_nvml):
    clock = FakeClock()
    t = FakeCudaTrainer(clock)
    step_s = sum(FakeCudaTrainer.PLAN.values())
    busy_steps = 4
    # Device events covering 60 % of the busy pass's wall time (two overlap, one is host-side).
    wall_busy = busy_steps * step_s
    events = [event(CUDA_KIND, 0, 0.4 * wall_busy * 1e6), event(CUDA_KIND, 0.1 * wall_busy * 1e6, 0.3 * wall_busy * 1e6),
              event(CUDA_KIND, 0.5 * wall_busy * 1e6, 0.7 * wall_busy * 1e6), event(HOST_KIND, 0, wall_busy * 1e6)]
    prof = FakeProfiler(events)
    b = profile_steps(t, 10, clock=clock, busy_steps=busy_steps, profiler=lambda: prof)
    assert b["device_type"] == "cuda"
    assert b["steps"] == 10 and b["wall_s"] == pytest.approx(10 * step_s)
    for phase, seconds in FakeCudaTrainer.PLAN.items():
        assert b["seconds"][phase] == pytest.approx(10 * seconds)
    assert b["device_busy"] == pytest.approx(0.6)
    assert prof.entered == prof.exited == 1
    assert t.plain_steps == busy_steps
    # Profiled window: one sync before and after, and one per phase edge: five phases and
    # their end, plus loss_read's start and end, per step. Busy pass: its two edges only.
    assert t.syncs == 2 + 10 * (5 + 1 + 2) + 2
    assert b["gpu_utilization"] is None and b["gpu_memory_used_bytes"] is None


def test_a_profiler_that_cannot_start_leaves_busy_unknown_but_runs_the_steps(no_nvml, capsys):
    clock = FakeClock()
    t = FakeCudaTrainer(clock)
    b = profile_steps(t, 8, clock=clock, profiler=lambda: FakeProfiler([], fail_on_enter=True))
    assert b["device_busy"] is None
    # Every rank runs the same steps either way, so the all-reduces of DDP still pair up.
    assert t.plain_steps == 2
    assert sum(b["shares"].values()) == pytest.approx(1.0, abs=0.02)
    assert "profiler did not start" in capsys.readouterr().err


def test_no_device_activity_recorded_leaves_busy_unknown(no_nvml):
    clock = FakeClock()
    b = profile_steps(FakeCudaTrainer(clock), 4, clock=clock, profiler=lambda: FakeProfiler([event(HOST_KIND, 0, 10)]))
    assert b["device_busy"] is None


class FakeNvml:
    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def _record(self, name, *args):
        self.calls.append((name, *args))
        if name == self.fail_at:
            raise RuntimeError("NVML_ERROR_UNKNOWN")

    def nvmlInit(self):
        self._record("init")

    def nvmlShutdown(self):
        self._record("shutdown")

    def nvmlDeviceGetHandleByIndex(self, i):
        self._record("index", i)
        return ("handle", i)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._record("uuid", uuid)
        return ("handle", uuid)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._record("utilization", handle)
        return SimpleNamespace(gpu=73, memory=20)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._record("memory", handle)
        return SimpleNamespace(used=5 * 2**30, total=80 * 2**30, free=75 * 2**30)


def test_nvml_absent_gives_none(no_nvml):
    assert nvml_figures(torch.device("cuda", 0)) == (None, None)


@pytest.mark.parametrize("visible, device, handle", [
    (None, torch.device("cuda", 1), 1),
    ("3,5", torch.device("cuda", 1), 5),
    ("GPU-aaaa,GPU-bbbb", torch.device("cuda", 0), "GPU-aaaa"),
])
def test_nvml_figures_read_the_trial_device(monkeypatch, visible, device, handle):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    utilization, used = nvml_figures(device)
    assert utilization == pytest.approx(0.73) and used == 5 * 2**30
    assert ("utilization", ("handle", handle)) in fake.calls and ("memory", ("handle", handle)) in fake.calls
    assert fake.calls[0] == ("init",) and fake.calls[-1] == ("shutdown",)


def test_nvml_errors_and_cpu_devices_give_none(monkeypatch):
    fake = FakeNvml(fail_at="utilization")
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert nvml_figures(torch.device("cuda", 0)) == (None, None)
    assert fake.calls[-1] == ("shutdown",)
    assert nvml_figures(CPU) == (None, None)
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(fail_at="init"))
    assert nvml_figures(torch.device("cuda", 0)) == (None, None)


def test_nvml_figures_reach_the_breakdown_on_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    clock = FakeClock()
    b = profile_steps(FakeCudaTrainer(clock), 4, clock=clock, profiler=lambda: FakeProfiler([]))
    assert b["gpu_utilization"] == pytest.approx(0.73) and b["gpu_memory_used_bytes"] == 5 * 2**30


def test_a_host_bound_device_reads_as_host_bound():
    # A device busy a third of the time with no input or sync plant: the host is the limit.
    clock = FakeClock()
    t = FakeCudaTrainer(clock)
    wall_busy = 4 * sum(FakeCudaTrainer.PLAN.values())
    prof = FakeProfiler([event(CUDA_KIND, 0, wall_busy * 1e6 / 3)])
    b = profile_steps(t, 8, clock=clock, busy_steps=4, profiler=lambda: prof)
    assert diagnose(b)["bottleneck"] == "host"


# ---- data-parallel: the slowest rank's breakdown ------------------------------------------


def test_the_trial_breakdown_is_the_slowest_ranks_and_names_it():
    fast = {"wall_s": 1.0, "shares": {"backward": 0.6}}
    slow = {"wall_s": 1.3, "shares": {"backward": 0.2}}
    top = slowest_rank([{"rank": 0, "breakdown": fast}, {"rank": 1, "breakdown": slow}, {"rank": 2, "breakdown": None}])
    assert top["rank"] == 1 and top["wall_s"] == 1.3 and top["shares"] == slow["shares"]
    assert "rank" not in slow  # the rank's own entry is left as it was
    assert slowest_rank([{"rank": 0, "breakdown": None}]) is None
