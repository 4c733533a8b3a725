"""The timed training loop that runs inside a trial process.

It reads top to bottom like a plain training script: apply the knobs, build the loader,
warm up (discarded), calibrate how many steps fill a window, then time fixed windows of
real steps over the real DataLoader. The device is synchronized at every window edge, so
the figure is what a training run actually gets, not what an un-synchronized clock
suggests; inside a window the loss is read on the host (a sync) every ``sync_every``
optimizer steps, as a logging loop does (every step at the default 1). Where a step's time goes is measured after the timed windows, never inside them
(``trainopt.trial.breakdown``, through the ``phases`` hook of ``Trainer.step``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from trainopt.knobs.kwargs import should_read_loss
from trainopt.stats import intervals as stats
from trainopt.trial.applier import Applier
from trainopt.trial.batches import check_worker_batches, loss_computer
from trainopt.trial.memory import PeakMemory

__all__ = ["NonFiniteLoss", "Measurement", "Trainer", "host_read", "measure_throughput", "probe_memory"]


class NonFiniteLoss(RuntimeError):
    """The training loss became NaN or infinite."""


@dataclass
class Measurement:
    """Raw figures of one measured trial; the worker turns it into a TrialResult."""

    windows: list[float] = field(default_factory=list)
    window_steps: int = 0
    window_times: list[float] = field(default_factory=list)
    window_waits: list[float] = field(default_factory=list)
    steady_from: int = 0
    steady: bool = True
    samples_per_s: float | None = None
    step_time_s: float | None = None
    data_wait_fraction: float | None = None
    warmup_s: float = 0.0
    first_step_s: float = 0.0
    compile_s: float | None = None
    first_loss: float | None = None
    last_loss: float | None = None
    steps: int = 0
    peak_memory_bytes: int | None = None
    grad_scaler: dict[str, Any] | None = None


class Trainer:
    """One training configuration: model, loader, optimizer and the knobs applied.

    Every knob is applied by ``trainopt.trial.applier.Applier``, the same code that
    ``trainopt.load_settings()`` uses in production. A batch of any structure moves to the
    device whole; the workload's loss form turns it into the loss (``trainopt.trial.batches``),
    and backward, loss scaling, accumulation, ``no_sync`` and the optimizer step stay here.

    Args:
        workload: A ``trainopt.trial.workloads.Workload``.
        settings: Every knob's value.
        device: The torch.device to train on.
        seed: Seed for the loader's shuffling.
        ddp: For a data-parallel trial, the rank's ``trainopt.trial.ddp_rank.RankGroup``: the applier
            then wraps the model in DistributedDataParallel, the loader reads this rank's
            shard through a DistributedSampler, and accumulation steps run under no_sync().

    Attributes:
        samples_per_step: Samples per optimizer step (``batch_size * grad_accum``), per rank.
        data_wait: Seconds spent waiting for the loader since last reset.
        dataset_len: Samples in the data set.
        optimizer_steps: Optimizer steps taken over the whole run.
    """

    def __init__(self, workload: Any, settings: dict[str, Any], device: torch.device, seed: int = 0, ddp: Any = None):
        self.settings = settings
        self.device = device
        self.ddp = ddp
        self._epoch = 0
        self.applier = Applier(settings, device, data_parallel=ddp is not None)
        self.applier.apply_backend_flags()
        self.model = workload.model
        self.forward = self.applier.prepare_model(self.model)
        self.optimizer = workload.optimizer_factory(self.model.parameters(), settings["optimizer_impl"])
        self.loss_fn = workload.loss_fn
        # compute_loss(forward, batch): the workload's form, (input, target) pairs, loss: model or step.
        self.compute_loss = loss_computer(workload.loss_form, workload.loss_fn, workload.step_fn, workload.fields)
        self.scaler = self.applier.grad_scaler
        self.amp_dtype = self.applier.autocast_dtype()
        self.samples_per_step = settings["batch_size"] * settings["grad_accum"]
        self.dataset_len = len(workload.dataset)
        world = ddp.world if ddp is not None else 1
        if self.dataset_len // world < settings["batch_size"]:
            per_rank = f" ({self.dataset_len // world} per rank of {world})" if world > 1 else ""
            raise ValueError(
                f"the data set has {self.dataset_len} samples{per_rank}, fewer than batch_size {settings['batch_size']}; "
                f"raise data.args.size or lower batch_size"
            )
        if settings["num_workers"] > 0:
            sample = workload.sample_batch
            if sample is None:
                sample = (workload.collate_fn or torch.utils.data.default_collate)([workload.dataset[0]])
            check_worker_batches(sample, workload.dataset, workload.collate_fn, settings["num_workers"],
                                 workload.data_field)
        if ddp is not None:
            # Each rank reads its own shard; the sampler shuffles, so the loader must not.
            order: dict[str, Any] = {"sampler": self.applier.sampler(workload.dataset, seed)}
        else:
            order = {"shuffle": True, "generator": torch.Generator().manual_seed(seed)}
        self.loader = torch.utils.data.DataLoader(
            workload.dataset, **order, collate_fn=workload.collate_fn, **self.applier.loader_kwargs()
        )
        self._iter: Iterator | None = None
        self.data_wait = 0.0
        self.last_loss: torch.Tensor | None = None

    @property
    def optimizer_steps(self) -> int:
        return self.applier.optimizer_steps

    def sync(self) -> None:
        """Wait for queued device work; a no-op on CPU, where work is synchronous."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def next_batch(self, clock: Callable[[], float] = time.perf_counter):
        """The loader's next batch, starting a new epoch when one ends; the wait adds to ``data_wait``."""
        t0 = clock()
        try:
            batch = next(self._iter) if self._iter is not None else None
        except StopIteration:
            batch = None
        if batch is None:
            # A new epoch, as training would start one (workers restart unless persistent).
            if self.ddp is not None:
                self._epoch += 1
                self.loader.sampler.set_epoch(self._epoch)
            self._iter = iter(self.loader)
            batch = next(self._iter)
        self.data_wait += clock() - t0
        return batch

    def step(self, clock: Callable[[], float] = time.perf_counter, phases: Any = None) -> torch.Tensor:
        """One optimizer step: ``grad_accum`` micro-batches forward and backward, then the update.

        Args:
            clock: The time source of the loader wait.
            phases: A ``trainopt.trial.breakdown.PhaseTimer`` told each phase as it starts (the
                profiled window after the timed ones), or None. The timed windows pass None:
                each phase edge then costs one ``is None`` test and no clock read.
        """
        accum = self.settings["grad_accum"]
        loss_sum = None
        for _ in range(accum):
            if phases is not None:
                phases.start("data_wait")
            batch = self.next_batch(clock)
            if phases is not None:
                phases.start("to_device")
            batch = self.applier.to_device(batch)
            if phases is not None:
                phases.start("forward")
            with self.applier.no_sync():
                with self.applier.autocast():
                    loss = self.compute_loss(self.forward, batch)
                # Closes the forward phase and times backward and the update itself.
                self.applier.backward_and_step(loss, self.optimizer, phases)
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        self.last_loss = loss_sum / accum
        return self.last_loss

    def should_read_loss(self) -> bool:
        """Whether the loss is read on the host now, as ``sync_every`` asks (run-wide count)."""
        return self.applier.should_read_loss()

    def loss_value(self) -> float:
        """The last loss on the host (a device sync); raises NonFiniteLoss when NaN/inf."""
        value = float(self.last_loss.item()) if self.last_loss is not None else float("nan")
        if not math.isfinite(value):
            raise NonFiniteLoss(f"the training loss became {value}")
        return value


def host_read(trainer: Any) -> None:
    """Read the loss on the host when ``sync_every`` asks, as a logging loop does.

    The cadence counts optimizer steps over the whole run (warm-up included), so a
    ``sync_every`` longer than a window is measured at its real rate, not as "never".
    """
    if should_read_loss(trainer.settings["sync_every"], trainer.optimizer_steps):
        trainer.loss_value()


def _agree(group: Any, flag: bool) -> bool:
    """``flag`` on one process; under DDP true when any rank says so, so all ranks loop alike."""
    return group.any(flag) if group is not None else flag


def measure_throughput(
    trainer: Trainer,
    warmup_steps: int,
    warmup_seconds: float,
    window_seconds: float,
    windows: int,
    clock: Callable[[], float] = time.perf_counter,
    group: Any = None,
) -> Measurement:
    """Warm up, then time ``windows`` windows of a fixed number of steps.

    Args:
        trainer: The configured training step.
        warmup_steps: Minimum number of discarded steps.
        warmup_seconds: Minimum discarded time.
        window_seconds: Target length of one timed window (sets the steps per window).
        windows: Number of timed windows.
        clock: The time source; injectable for tests.
        group: For a data-parallel trial, the rank's ``trainopt.trial.ddp_rank.RankGroup``: every rank
            then warms up for the same steps, times windows of the same length, and starts
            and ends each window at a barrier.

    Returns:
        Per-window throughputs and the derived figures.
    """
    m = Measurement()
    mem = PeakMemory(trainer.device)
    trainer.sync()
    start = clock()
    trainer.step(clock)
    m.first_loss = trainer.loss_value()  # syncs: the first step's time includes any compilation
    m.first_step_s = clock() - start
    steps = 1
    after_first = clock()
    while _agree(group, steps < max(warmup_steps, 2) or clock() - start < warmup_seconds):
        trainer.step(clock)
        host_read(trainer)
        steps += 1
    trainer.loss_value()
    typical = (clock() - after_first) / (steps - 1)
    if group is not None:
        typical = group.max(typical)  # the slowest rank sets the window length for all
    m.warmup_s = clock() - start
    if trainer.settings["compile"] != "off":
        m.compile_s = max(0.0, m.first_step_s - typical)
    m.window_steps = max(1, int(round(window_seconds / max(typical, 1e-9))))
    mem.sample()

    for _ in range(windows):
        trainer.data_wait = 0.0
        trainer.sync()
        if group is not None:
            group.barrier()
        t0 = clock()
        for _ in range(m.window_steps):
            trainer.step(clock)
            host_read(trainer)
        trainer.sync()
        if group is not None:
            group.barrier()
        elapsed = clock() - t0
        wait = trainer.data_wait
        # Outside the timed region: the loss check and memory sample cost nothing measured.
        m.last_loss = trainer.loss_value()
        mem.sample()
        m.window_times.append(elapsed)
        m.window_waits.append(wait)
        m.windows.append(m.window_steps * trainer.samples_per_step / elapsed)
    m.steps = steps + windows * m.window_steps

    cut = stats.steady_state(m.windows)
    m.steady_from, m.steady = cut.start, cut.steady
    kept_time = sum(m.window_times[cut.start:])
    kept_steps = m.window_steps * (windows - cut.start)
    m.samples_per_s = kept_steps * trainer.samples_per_step / kept_time
    m.step_time_s = kept_time / kept_steps
    m.data_wait_fraction = sum(m.window_waits[cut.start:]) / kept_time
    m.peak_memory_bytes = mem.peak()
    m.grad_scaler = _scaler_state(trainer)
    return m


def _scaler_state(trainer: Any) -> dict[str, Any] | None:
    # After the timed windows: reading the scale waits for the device.
    applier = getattr(trainer, "applier", None)
    return applier.scaler_state() if applier is not None else None


def probe_memory(trainer: Trainer, steps: int = 2) -> Measurement:
    """Run full training steps (forward, backward, optimizer) to learn whether a batch fits.

    Two steps, because optimizer state (momentum, Adam moments) is allocated on the first
    and the second shows the steady memory of training.
    """
    m = Measurement()
    mem = PeakMemory(trainer.device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer.step()
    trainer.sync()
    # A probe asks only whether memory suffices; the loss value is not judged here.
    m.last_loss = float(trainer.last_loss.item())
    m.first_step_s = time.perf_counter() - start
    m.steps = steps
    mem.sample()
    m.peak_memory_bytes = mem.peak()
    m.grad_scaler = _scaler_state(trainer)
    return m
