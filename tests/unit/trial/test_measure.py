"""The timing loop (measure_throughput, probe_memory) with a fake clock and a fake training step.

The fake step advances the fake clock by a known step time and data wait, so every
figure the loop derives has an exact expected value computed from those inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

from trainopt.knobs.kwargs import should_read_loss
from trainopt.stats import intervals as stats
from trainopt.trial.measure import NonFiniteLoss, measure_throughput, probe_memory


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        self.now += dt


class FakeTrainer:
    """The interface measure_throughput uses, with scripted step times.

    Args:
        clock: The fake clock the step advances.
        step_time: Seconds per optimizer step, or a function of the 0-based step index.
        wait: Seconds of each step spent waiting for data.
        read_cost: Seconds a host read of the loss costs (a device sync).
    """

    def __init__(self, clock, step_time=0.1, wait=0.0, read_cost=0.0, batch_size=8, grad_accum=1,
                 sync_every=1, compile="off"):
        self.clock = clock
        self.step_time = step_time if callable(step_time) else (lambda i: step_time)
        self.wait = wait
        self.read_cost = read_cost
        self.settings = {"sync_every": sync_every, "compile": compile, "grad_accum": grad_accum, "batch_size": batch_size}
        self.samples_per_step = batch_size * grad_accum
        self.device = torch.device("cpu")
        self.data_wait = 0.0
        self.optimizer_steps = 0
        self.last_loss = torch.tensor(1.0)
        self.reads: list[int] = []  # optimizer step count at each host read
        self.syncs = 0

    def step(self, clock=None):
        self.clock.advance(self.step_time(self.optimizer_steps))
        self.data_wait += self.wait
        self.optimizer_steps += 1
        return self.last_loss

    def sync(self):
        self.syncs += 1

    def loss_value(self):
        self.reads.append(self.optimizer_steps)
        self.clock.advance(self.read_cost)
        value = float(self.last_loss)
        if not math.isfinite(value):
            raise NonFiniteLoss(f"the training loss became {value}")
        return value


def _run(trainer, clock, warmup_steps=5, warmup_seconds=0.0, window_seconds=1.0, windows=6):
    return measure_throughput(trainer, warmup_steps, warmup_seconds, window_seconds, windows, clock=clock)


def test_window_calibration_from_the_warm_up_step_time():
    clock = FakeClock()
    m = _run(FakeTrainer(clock, step_time=0.1), clock, window_seconds=1.0)
    assert m.window_steps == 10
    m = _run(FakeTrainer(clock, step_time=0.25), clock, window_seconds=1.0)
    assert m.window_steps == 4
    # A step longer than the window still times one step per window.
    m = _run(FakeTrainer(clock, step_time=3.0), clock, window_seconds=1.0)
    assert m.window_steps == 1


def test_warm_up_lasts_at_least_its_steps_and_seconds():
    clock = FakeClock()
    t = FakeTrainer(clock, step_time=0.1)
    m = _run(t, clock, warmup_steps=5, warmup_seconds=2.0, window_seconds=0.5, windows=2)
    warm = m.steps - 2 * m.window_steps
    # At least 2.0 s of 0.1 s steps, and no more than one step past it (float rounding of the sum).
    assert 20 <= warm <= 21
    assert 2.0 - 1e-9 <= m.warmup_s <= 2.1 + 1e-9
    assert m.warmup_s == pytest.approx(warm * 0.1)
    m = _run(FakeTrainer(clock, step_time=0.1), clock, warmup_steps=7, warmup_seconds=0.0, window_seconds=0.5, windows=2)
    assert m.steps - 2 * m.window_steps == 7


@pytest.mark.parametrize("batch_size, grad_accum", [(8, 1), (8, 4), (3, 2)])
def test_samples_per_second_counts_every_micro_batch(batch_size, grad_accum):
    clock = FakeClock()
    t = FakeTrainer(clock, step_time=0.2, batch_size=batch_size, grad_accum=grad_accum)
    m = _run(t, clock, window_seconds=1.0, windows=4)
    expected = batch_size * grad_accum / 0.2
    assert m.samples_per_s == pytest.approx(expected)
    assert m.windows == pytest.approx([expected] * 4)
    assert m.step_time_s == pytest.approx(0.2)
    assert m.steady and m.steady_from == 0


def test_data_wait_share_is_per_kept_time():
    clock = FakeClock()
    m = _run(FakeTrainer(clock, step_time=0.1, wait=0.025), clock, windows=4)
    assert m.data_wait_fraction == pytest.approx(0.25)
    assert m.window_waits == pytest.approx([0.025 * m.window_steps] * 4)


def test_steady_state_cut_drops_slow_first_windows():
    clock = FakeClock()
    warm_steps = 5
    window_steps = 10

    def step_time(i):
        # Warm-up steps calibrate 0.1 s; the first two timed windows are twice as slow.
        return 0.2 if warm_steps <= i < warm_steps + 2 * window_steps else 0.1

    t = FakeTrainer(clock, step_time=step_time, batch_size=10)
    m = _run(t, clock, warmup_steps=warm_steps, window_seconds=1.0, windows=10)
    assert m.window_steps == window_steps
    assert m.windows[:2] == pytest.approx([50.0, 50.0]) and m.windows[2:] == pytest.approx([100.0] * 8)
    cut = stats.steady_state(m.windows)
    assert m.steady_from == cut.start >= 2
    # Throughput over the kept windows only.
    assert m.samples_per_s == pytest.approx(100.0)
    assert m.step_time_s == pytest.approx(0.1)


@pytest.mark.parametrize("sync_every", [1, 3, 7, 25])
def test_sync_cadence_counts_optimizer_steps_across_windows(sync_every):
    """sync_every longer than a window is read at its cadence, not never (window-local counting bug)."""
    clock = FakeClock()
    t = FakeTrainer(clock, step_time=0.1, sync_every=sync_every)
    m = _run(t, clock, warmup_steps=4, window_seconds=0.5, windows=12)
    assert m.window_steps == 5
    cadence = [n for n in range(1, m.steps + 1) if should_read_loss(sync_every, n)]
    assert cadence, "the run is long enough for at least one cadence read"
    assert set(cadence) <= set(t.reads)
    # Window-end reads are outside the timed region; inside it, only the cadence reads.
    warm = m.steps - 12 * m.window_steps
    edges = {warm + k * m.window_steps for k in range(1, 13)}
    inside = [r for r in t.reads if r > warm and r not in edges]
    assert inside == [n for n in cadence if n > warm and n not in edges]


def test_sync_cadence_costs_time_inside_the_windows():
    clock = FakeClock()
    frequent = _run(FakeTrainer(clock, step_time=0.1, read_cost=0.05, sync_every=1), clock, windows=3)
    never = _run(FakeTrainer(clock, step_time=0.1, read_cost=0.05, sync_every=0), clock, windows=3)
    assert frequent.step_time_s == pytest.approx(0.15, rel=0.05)
    assert never.step_time_s == pytest.approx(0.1)


def test_compile_time_is_the_first_steps_excess():
    clock = FakeClock()
    step_time = lambda i: 2.5 if i == 0 else 0.1  # noqa: E731
    m = _run(FakeTrainer(clock, step_time=step_time, compile="default"), clock)
    assert m.first_step_s == pytest.approx(2.5)
    assert m.compile_s == pytest.approx(2.4)
    assert m.window_steps == 10  # calibrated from the steps after the first
    off = _run(FakeTrainer(clock, step_time=step_time, compile="off"), clock)
    assert off.compile_s is None


def test_nonfinite_loss_raises():
    clock = FakeClock()
    t = FakeTrainer(clock)
    t.last_loss = torch.tensor(float("nan"))
    with pytest.raises(NonFiniteLoss, match="nan"):
        _run(t, clock)


def test_first_and_last_loss_and_peak_memory():
    clock = FakeClock()
    t = FakeTrainer(clock)
    m = _run(t, clock, windows=2)
    assert m.first_loss == 1.0 and m.last_loss == 1.0
    assert m.peak_memory_bytes > 10 * 2**20  # this interpreter with torch loaded
    assert m.grad_scaler is None  # no applier, no scaler


def test_probe_mode_runs_two_full_steps_and_no_windows():
    clock = FakeClock()
    t = FakeTrainer(clock, step_time=0.1)
    m = probe_memory(t)
    assert t.optimizer_steps == 2 == m.steps
    assert m.windows == [] and m.samples_per_s is None and m.window_steps == 0
    assert m.last_loss == 1.0
    assert t.reads == []  # a probe judges memory, not the loss
    assert m.peak_memory_bytes > 10 * 2**20
