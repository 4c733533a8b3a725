"""A LightningModule as a workload: its training_step, configure_optimizers and train_dataloader.

Lightning is never imported here: a model is a LightningModule when the user's own code
has already imported Lightning and the model is an instance of its class. trainopt then
trains it as Lightning's automatic optimization does, with trainopt's loop around it:

* the step is ``training_step(batch, batch_idx)``, reached through ``TrainingStep`` (a
  module whose ``forward`` is the training step, as Lightning's own strategy wrapper), so
  DistributedDataParallel and ``torch.compile`` wrap the step itself;
* ``self.log`` and ``self.log_dict`` do nothing (no Trainer collects metrics in a trial;
  they never change what the step computes);
* the optimizer and schedulers come from ``configure_optimizers()`` (any of Lightning's
  return forms) when the spec has no ``optimizer``; a scheduler steps after every
  ``frequency``-th optimizer step (``interval: step``) or at the end of every
  ``frequency``-th epoch (``interval: epoch``; an epoch is one pass of trainopt's loader
  over the data set, ``len(data set) // batch_size`` batches, the last partial one dropped);
* the data set and collate function come from ``train_dataloader()`` (the module's, or a
  LightningDataModule's after ``prepare_data()`` and ``setup("fit")``) when the spec has
  no ``data.name``; trainopt builds its own DataLoader around them, so the loader knobs apply.

What trainopt cannot measure faithfully is refused with one line naming the spec field
and the alternative: manual optimization, several optimizers, ReduceLROnPlateau (it needs
a monitored metric), a loader over an IterableDataset.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch
from torch import nn

from trainopt.contract.reference import WorkloadError
from trainopt.knobs.kwargs import optimizer_kwargs
from trainopt.trial.batches import tensors

__all__ = [
    "TrainingStep",
    "SchedulerDriver",
    "is_lightning_module",
    "is_datamodule",
    "prepare_module",
    "silence_log",
    "training_step_loss",
    "parse_configure_optimizers",
    "lightning_optimizer_factory",
    "loader_parts",
]

_PACKAGES = ("lightning.pytorch", "pytorch_lightning")
_STEP_ALTERNATIVE = (
    "set step: 'module:callable' (step(model, batch) returns the loss) and optimizer: {name: ...} "
    "so trainopt steps one optimizer"
)


def _lightning_class(name: str) -> list[type]:
    # Only what the user's code has imported already: detecting never imports Lightning.
    return [getattr(sys.modules[p], name) for p in _PACKAGES if p in sys.modules and hasattr(sys.modules[p], name)]


def is_lightning_module(model: Any) -> bool:
    """Whether ``model`` is a ``LightningModule`` (of ``lightning`` or ``pytorch_lightning``)."""
    return any(isinstance(model, cls) for cls in _lightning_class("LightningModule"))


def is_datamodule(obj: Any) -> bool:
    """Whether ``obj`` is a ``LightningDataModule``."""
    return any(isinstance(obj, cls) for cls in _lightning_class("LightningDataModule"))


def _no_log(*args: Any, **kwargs: Any) -> None:
    """``self.log`` in a trial: no Trainer collects metrics, and logging changes nothing the step computes."""


def silence_log(module: Any) -> None:
    """Make the module's ``self.log`` and ``self.log_dict`` do nothing (on this instance only)."""
    module.log = _no_log
    module.log_dict = _no_log


def _base_defaults() -> set[type]:
    """The classes whose hooks are Lightning's defaults: ``LightningModule`` and the classes it is built from."""
    return {base for cls in _lightning_class("LightningModule") for base in cls.__mro__}


def _overrides(module: Any, name: str) -> bool:
    """Whether some class of the module's hierarchy defines ``name``, other than the LightningModule base.

    Lightning's own modules (``lightning.pytorch.demos``' ``BoringModel``, a model
    shipped in a package built on Lightning) define their hooks as the user's do; only the
    base's placeholders (which warn or raise) do not count.
    """
    defaults = _base_defaults()
    for cls in type(module).__mro__:
        if name in vars(cls):
            return cls not in defaults
    return False


def prepare_module(module: Any, field_name: str) -> None:
    """Check the module can be trained by its training_step and run the hooks Lightning runs before fit.

    Args:
        module: The LightningModule.
        field_name: The spec field that built it (``model.name '...'``), for messages.

    Raises:
        WorkloadError: Manual optimization, or no ``training_step``.
    """
    if not getattr(module, "automatic_optimization", True):
        raise WorkloadError(
            f"{field_name}: automatic_optimization is False (manual optimization) is not supported: trainopt "
            f"must own backward and the optimizer step to apply its knobs; {_STEP_ALTERNATIVE}"
        )
    if not _overrides(module, "training_step"):
        raise WorkloadError(
            f"{field_name}: the LightningModule {type(module).__name__} defines no training_step; "
            f"define training_step(batch, batch_idx) returning the loss, or {_STEP_ALTERNATIVE}"
        )
    silence_log(module)
    # Lightning calls these before configure_optimizers in fit; a module may build layers in them.
    module.setup("fit")
    configure = getattr(module, "configure_model", None)  # Lightning 2.1 and later
    if configure is not None:
        configure()


class TrainingStep(nn.Module):
    """A LightningModule seen as a module whose ``forward(batch, batch_idx)`` is its ``training_step``."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, batch: Any, batch_idx: int) -> Any:
        return self.module.training_step(batch, batch_idx)


# ---- optimizer and schedulers ---------------------------------------------------------------


@dataclass
class _Schedule:
    scheduler: Any
    interval: str
    frequency: int


def _is_optimizer(value: Any) -> bool:
    return isinstance(value, torch.optim.Optimizer)


def _scheduler_config(value: Any, field_name: str) -> _Schedule:
    config = dict(value) if isinstance(value, dict) else {"scheduler": value}
    scheduler = config.get("scheduler")
    interval = config.get("interval", "epoch")
    frequency = config.get("frequency", 1)
    if scheduler is None or not hasattr(scheduler, "step"):
        raise WorkloadError(
            f"{field_name}: configure_optimizers() returns a scheduler config without a scheduler ({value!r}); "
            f"give lr_scheduler a scheduler or a dict with 'scheduler'"
        )
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise WorkloadError(
            f"{field_name}: ReduceLROnPlateau in configure_optimizers() is not supported: it needs a monitored "
            f"metric that a timed trial has no validation for; return the optimizer alone, or set optimizer: {{name: ...}}"
        )
    if interval not in ("step", "epoch") or not isinstance(frequency, int) or frequency < 1:
        raise WorkloadError(
            f"{field_name}: configure_optimizers() returns interval {interval!r} and frequency {frequency!r}; "
            f"interval must be 'step' or 'epoch' and frequency a positive integer"
        )
    return _Schedule(scheduler, interval, frequency)


def parse_configure_optimizers(conf: Any, field_name: str) -> tuple[torch.optim.Optimizer, list[_Schedule]]:
    """The one optimizer and its schedulers in any of ``configure_optimizers()``'s return forms.

    Forms: an optimizer; a list or tuple of them; ``([optimizers], [schedulers])``; a dict
    with ``optimizer`` and optionally ``lr_scheduler`` (a scheduler or a dict with
    ``scheduler``, ``interval``, ``frequency``); a list of such dicts.

    Raises:
        WorkloadError: None, several optimizers, or a form that is none of these.
    """
    optimizers: list[Any]
    schedules: list[Any] = []
    if _is_optimizer(conf):
        optimizers = [conf]
    elif isinstance(conf, dict):
        optimizers = [conf.get("optimizer")]
        if conf.get("lr_scheduler") is not None:
            schedules = [conf["lr_scheduler"]]
    elif isinstance(conf, (list, tuple)) and len(conf) == 2 and isinstance(conf[0], (list, tuple)):
        optimizers, schedules = list(conf[0]), list(conf[1] or [])
    elif isinstance(conf, (list, tuple)) and conf and all(isinstance(c, dict) for c in conf):
        optimizers = [c.get("optimizer") for c in conf]
        schedules = [c["lr_scheduler"] for c in conf if c.get("lr_scheduler") is not None]
    elif isinstance(conf, (list, tuple)):
        optimizers = list(conf)
    else:
        optimizers = []
    if len(optimizers) > 1:
        raise WorkloadError(
            f"{field_name}: configure_optimizers() returns {len(optimizers)} optimizers; several optimizers are "
            f"not supported (trainopt measures one optimizer step per step); {_STEP_ALTERNATIVE}"
        )
    if not optimizers or not _is_optimizer(optimizers[0]):
        raise WorkloadError(
            f"{field_name}: configure_optimizers() returns {type(conf).__name__} ({str(conf)[:80]}), no optimizer; "
            f"return an optimizer, ([optimizer], [scheduler]) or {{'optimizer': ..., 'lr_scheduler': ...}}, "
            f"or set optimizer: {{name: ...}} in the spec"
        )
    return optimizers[0], [_scheduler_config(s, field_name) for s in schedules]


def _apply_impl(optimizer: torch.optim.Optimizer, impl: str, field_name: str) -> None:
    """Switch an optimizer already built by the user to ``foreach`` or ``fused``, as its constructor would."""
    extra = optimizer_kwargs(impl)
    for key, value in extra.items():
        if key not in optimizer.defaults:
            raise WorkloadError(
                f"{field_name}: the optimizer from configure_optimizers(), {type(optimizer).__name__}, takes no "
                f"{key!r} argument, so optimizer_impl={impl} cannot apply to it"
            )
        other = "foreach" if key == "fused" else "fused"
        for group in [optimizer.defaults, *optimizer.param_groups]:
            group[key] = value
            if other in group:
                group[other] = None if other == "foreach" else False
        if key == "fused":
            # What the constructor sets for a fused optimizer: the GradScaler then lets it unscale.
            optimizer._step_supports_amp_scaling = True


class SchedulerDriver:
    """Steps the schedulers after optimizer steps, by interval and frequency.

    Attributes:
        optimizer_steps: Optimizer steps taken.
        batches: Micro-batches seen (``training_step`` calls), for the epoch count.
        epochs_done: Epochs completed.
    """

    def __init__(self, schedules: list[_Schedule], dataset_len: int):
        self.schedules = schedules
        self.dataset_len = dataset_len
        self.optimizer_steps = 0
        self.batches = 0
        self.epochs_done = 0
        self.batches_per_epoch: int | None = None

    def saw_batch(self, batch: Any) -> None:
        """Count one micro-batch; the first one's leading size gives the epoch length in batches."""
        self.batches += 1
        if self.batches_per_epoch is None:
            size = next((int(t.shape[0]) for t in tensors(batch) if t.dim() > 0), 1)
            # trainopt's loader drops the last partial batch.
            self.batches_per_epoch = max(1, self.dataset_len // max(size, 1))

    def after_optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        """The optimizer's step post-hook: step-interval schedulers, then epoch-interval ones at an epoch's end."""
        self.optimizer_steps += 1
        for s in self.schedules:
            if s.interval == "step" and self.optimizer_steps % s.frequency == 0:
                s.scheduler.step()
        per_epoch = self.batches_per_epoch or 0
        while per_epoch and self.batches >= (self.epochs_done + 1) * per_epoch:
            self.epochs_done += 1
            for s in self.schedules:
                if s.interval == "epoch" and self.epochs_done % s.frequency == 0:
                    s.scheduler.step()


@dataclass
class LightningOptimizer:
    """``optimizer_factory(params, impl)`` for a workload: configure_optimizers() with its schedulers driven."""

    module: Any
    field_name: str
    driver: SchedulerDriver = field(default_factory=lambda: SchedulerDriver([], 1))

    def __call__(self, params: Iterable[Any], impl: str = "default") -> torch.optim.Optimizer:
        # Called once the model is on its device, as Lightning calls configure_optimizers.
        optimizer, schedules = parse_configure_optimizers(self.module.configure_optimizers(), self.field_name)
        _apply_impl(optimizer, impl, self.field_name)
        self.driver.schedules = schedules
        if schedules:
            optimizer.register_step_post_hook(self.driver.after_optimizer_step)
        return optimizer


def lightning_optimizer_factory(module: Any, field_name: str, dataset_len: int) -> LightningOptimizer:
    """The optimizer factory that asks ``module.configure_optimizers()``; its ``driver`` counts the batches."""
    return LightningOptimizer(module, field_name, SchedulerDriver([], dataset_len))


def training_step_loss(driver: SchedulerDriver | None) -> Callable[[Any, Any], Any]:
    """``compute(forward, batch)`` calling ``forward(batch, batch_idx)`` (a ``TrainingStep``), counting batches."""
    count = [0]

    def compute(forward: Any, batch: Any) -> Any:
        if driver is not None:
            driver.saw_batch(batch)
        index = count[0]
        count[0] += 1
        return forward(batch, index)

    return compute


# ---- data ------------------------------------------------------------------------------------


def loader_parts(source: Any, field_name: str) -> tuple[Any, Any, int | None]:
    """The data set, collate function and batch size of ``source.train_dataloader()`` (a module or a data module).

    The batch size is the one the loader asked for; trainopt's ``batch_size`` knob replaces it.

    Raises:
        WorkloadError: No train_dataloader, or one that is not a DataLoader over a map-style data set.
    """
    if is_datamodule(source):
        source.prepare_data()
        source.setup("fit")
    elif not _overrides(source, "train_dataloader"):
        raise WorkloadError(
            f"{field_name}: the LightningModule {type(source).__name__} defines no train_dataloader(), and the spec "
            f"has no data.name; set data.name to a data set factory or data.datamodule to a LightningDataModule factory"
        )
    loader = source.train_dataloader()
    dataset = getattr(loader, "dataset", None)
    if not isinstance(loader, torch.utils.data.DataLoader) or dataset is None:
        raise WorkloadError(
            f"{field_name}: train_dataloader() returns {type(loader).__name__}, not one torch DataLoader; "
            f"return one DataLoader, or set data.name to a data set factory"
        )
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
        raise WorkloadError(
            f"{field_name}: train_dataloader() reads an IterableDataset; trainopt needs a map-style data set "
            f"(with __len__) to build its own loader; set data.name to a factory of one"
        )
    collate = loader.collate_fn
    if collate is torch.utils.data.default_collate:
        collate = None
    return dataset, collate, loader.batch_size
