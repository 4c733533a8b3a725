"""A LightningModule trained by trainopt's loop, in this process, against Lightning's own Trainer."""

from __future__ import annotations

import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.core.optimizer import (  # noqa: E402
    _configure_optimizers,
    _configure_schedulers_automatic_opt,
)

from tests.conftest import ROOT  # noqa: E402
from trainopt.contract.reference import WorkloadError  # noqa: E402
from trainopt.knobs.catalog import default_settings  # noqa: E402
from trainopt.trial.lightning_step import (  # noqa: E402
    is_lightning_module,
    parse_configure_optimizers,
)
from trainopt.trial.measure import Trainer  # noqa: E402
from trainopt.trial.workloads import build_workload  # noqa: E402

CPU = torch.device("cpu")
# A module reference, so the classes and functions compared are the ones this test imports.
EXAMPLE = "your_code_lightning"
sys.path.insert(0, str(ROOT / "examples"))
import your_code_lightning as lit_code  # noqa: E402


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


class Scheduled(lit_code.LitClassifier):
    """The example module with a StepLR whose every step shows in the learning rate."""

    def __init__(self, interval: str = "step", frequency: int = 1, **kwargs):
        super().__init__(**kwargs)
        self.interval, self.frequency = interval, frequency

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        decay = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": decay, "interval": self.interval, "frequency": self.frequency}}


def scheduled(**kwargs) -> Scheduled:
    return Scheduled(**kwargs)


def lightning_spec(model: str = "classifier", module: str = EXAMPLE, **args) -> dict:
    return {"model": {"name": f"{module}:{model}", "args": args}, "seed": 0}


def trainer_for(spec: dict, **settings) -> Trainer:
    s = default_settings()
    s.update({"threads": 1, "batch_size": 16, **settings})
    return Trainer(build_workload(spec, ROOT), s, CPU)


def test_the_module_is_recognised_without_lightning_being_imported_by_trainopt():
    import subprocess

    check = ("import sys, torch; from trainopt.trial import lightning_step as l, workloads; "
             "assert not l.is_lightning_module(torch.nn.Linear(2, 2)); "
             "assert not any(m.split('.')[0] in ('lightning', 'pytorch_lightning') for m in sys.modules)")
    subprocess.run([sys.executable, "-c", check], check=True, cwd=ROOT, timeout=120)
    assert is_lightning_module(lit_code.classifier())
    assert not is_lightning_module(torch.nn.Linear(2, 2))
    workload = build_workload(lightning_spec(), ROOT)
    assert workload.loss_form == "lightning" and len(workload.dataset) == 256
    assert workload.collate_fn is lit_code.pad  # train_dataloader()'s collate, in trainopt's own loader


def test_training_step_runs_with_self_log_and_its_dict_loss_is_the_modules_own():
    trainer = trainer_for(lightning_spec())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Lightning warns when self.log has no Trainer; trainopt's log is silent
        loss = trainer.step()
    module = trainer.model.module
    torch.manual_seed(0)
    twin = lit_code.classifier()
    twin.log = lambda *a, **k: None
    batch = lit_code.pad([trainer.loader.dataset[i] for i in range(4)])
    twin.load_state_dict(module.state_dict())
    assert torch.equal(twin.training_step(batch, 0)["loss"], module.training_step(batch, 0)["loss"])
    assert torch.isfinite(loss)


@pytest.mark.parametrize("interval, frequency, steps", [("step", 1, 7), ("step", 3, 10), ("epoch", 1, 40)])
def test_the_scheduler_steps_as_lightnings_trainer_fit_steps_it(interval, frequency, steps):
    spec = lightning_spec("scheduled", module=f"{Path(__file__).resolve()}", interval=interval, frequency=frequency)
    trainer = trainer_for(spec)
    for _ in range(steps):
        trainer.step()
    ours = trainer.optimizer.param_groups[0]["lr"]

    torch.manual_seed(0)
    module = Scheduled(interval=interval, frequency=frequency)
    fit = pl.Trainer(max_steps=steps, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu", devices=1)
    fit.fit(module)
    theirs = fit.optimizers[0].param_groups[0]["lr"]
    assert ours == pytest.approx(theirs, rel=1e-12)
    assert ours < 0.01  # it did step


def test_accumulating_two_batches_gives_the_weights_of_one_double_batch():
    spec = lightning_spec()
    spec["optimizer"] = {"name": "sgd", "args": {"lr": 0.5}}
    accumulated = trainer_for(spec, batch_size=8, grad_accum=2)
    double = trainer_for(spec, batch_size=16, grad_accum=1)
    # The loader's seeded shuffle is one permutation: two batches of 8 are the double batch's 16 items.
    accumulated.step()
    double.step()
    for a, b in zip(accumulated.model.parameters(), double.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    start = build_workload(spec, ROOT).model
    assert any(not torch.equal(a, b) for a, b in zip(start.parameters(), double.model.parameters()))


def _forms():
    def make():
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        return opt, torch.optim.lr_scheduler.StepLR(opt, 1)

    opt, sched = make()
    yield "optimizer", opt
    opt, sched = make()
    yield "list", [opt]
    opt, sched = make()
    yield "tuple of lists", ([opt], [sched])
    opt, sched = make()
    yield "dict", {"optimizer": opt, "lr_scheduler": sched}
    opt, sched = make()
    yield "dict config", {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 4}}
    opt, sched = make()
    yield "list of dicts", [{"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}]


@pytest.mark.parametrize("conf", [c for _, c in _forms()], ids=[n for n, _ in _forms()])
def test_every_return_form_of_configure_optimizers_reads_as_lightning_reads_it(conf):
    optimizer, schedules = parse_configure_optimizers(conf, "model.name 'm'")
    optimizers, schedulers, monitor = _configure_optimizers(conf)
    configs = _configure_schedulers_automatic_opt(schedulers, monitor)
    assert [optimizer] == optimizers
    assert [(s.scheduler, s.interval, s.frequency) for s in schedules] == [
        (c.scheduler, c.interval, c.frequency) for c in configs]


def test_two_optimizers_and_a_plateau_scheduler_are_refused_naming_the_alternative():
    a, b = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1), torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1)
    with pytest.raises(WorkloadError, match="returns 2 optimizers; several optimizers are not supported.*set step:"):
        parse_configure_optimizers([a, b], "model.name 'm'")
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(a)
    with pytest.raises(WorkloadError, match="ReduceLROnPlateau .* is not supported"):
        parse_configure_optimizers({"optimizer": a, "lr_scheduler": plateau}, "model.name 'm'")


def test_the_optimizer_impl_knob_applies_to_the_modules_own_optimizer():
    trainer = trainer_for(lightning_spec(), optimizer_impl="foreach")
    assert all(group["foreach"] is True for group in trainer.optimizer.param_groups)
    trainer.step()


def test_a_datamodule_supplies_the_data():
    spec = lightning_spec()
    spec["data"] = {"datamodule": f"{EXAMPLE}:token_data", "args": {"size": 64}}
    workload = build_workload(spec, ROOT)
    assert len(workload.dataset) == 64 and workload.collate_fn is lit_code.pad


@pytest.mark.parametrize(
    "model, data, start",
    [
        ("manual", None, "model.name '{code}:manual': automatic_optimization is False (manual optimization) is not supported"),
        ("no_step", None, "model.name '{code}:no_step': the LightningModule NoStep defines no training_step"),
        ("two_optimizers", None, "model.name '{code}:two_optimizers': configure_optimizers() returns 2 optimizers"),
    ],
)
def test_what_trainopt_cannot_measure_is_one_line_naming_the_field(model, data, start):
    with pytest.raises(WorkloadError) as info:
        trainer_for(lightning_spec(model))
    message = str(info.value)
    assert message.startswith(start.format(code=EXAMPLE)) and "\n" not in message
    assert "set step:" in message


def test_a_plain_module_without_data_is_told_to_name_a_data_set():
    spec = {"model": {"name": "tests.fixtures.user_code:encoder", "args": {}}, "seed": 0}
    with pytest.raises(WorkloadError, match=r"^data.name: left out, but model.name .* not a LightningModule"):
        build_workload(spec, ROOT)


@pytest.mark.parametrize(
    "spec, module_class, lr",
    [
        (lightning_spec("BoringModel", "lightning.pytorch.demos.boring_classes"), "BoringModel", 0.1),
        (lightning_spec("boring_subclass", "tests.fixtures.third_party"), "BoringSubclass", 0.1),
        ({**lightning_spec("LightningTransformer", "lightning.pytorch.demos.transformer", vocab_size=64),
          "data": {"datamodule": "tests.fixtures.third_party:demo_tokens", "args": {}}}, "LightningTransformer", 0.1),
    ],
    ids=["BoringModel", "a plain subclass", "LightningTransformer with a datamodule"],
)
def test_lightnings_own_modules_train_by_the_hooks_their_classes_define(spec, module_class, lr):
    trainer = trainer_for(spec, batch_size=8)
    losses = [float(trainer.step()) for _ in range(3)]
    module = trainer.model.module
    assert type(module).__name__ == module_class
    # The module's own configure_optimizers() (SGD at lr 0.1), not trainopt's default optimizer.
    assert type(trainer.optimizer).__name__ == "SGD" and trainer.optimizer.defaults["lr"] == lr
    assert trainer.optimizer.defaults["momentum"] == 0
    assert all(math.isfinite(x) for x in losses)


def test_the_lightning_module_bases_placeholders_are_not_hooks():
    from trainopt.trial.lightning_step import _overrides

    bare = lit_code.no_step()
    assert not _overrides(bare, "training_step") and not _overrides(bare, "train_dataloader")
    from lightning.pytorch.demos.boring_classes import BoringModel

    assert _overrides(BoringModel(), "training_step") and _overrides(BoringModel(), "train_dataloader")
