"""What is measured is what ships: the trial loop and the production settings API train alike.

The same settings, seed and data go through ``measure.Trainer`` (the loop a trial times)
and through ``TrainSettings`` used as the README shows; backend flags, autocast dtype,
loader arguments, GradScaler use, host reads, optimizer steps and the resulting weights
must all agree.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainopt.knobs.catalog import default_settings
from trainopt.settings.production import TrainSettings
from trainopt.trial.measure import Trainer
from trainopt.trial.workloads import Workload, cross_entropy
from trainopt.trial.workloads import _optimizer_factory as optimizer_factory

OPTIMIZER_STEPS = 6
SEED = 3

CASES = {
    "plain": {},
    "bf16": {"amp": "bf16"},
    "fp16": {"amp": "fp16", "grad_accum": 2},
    "accum-channels-last": {"grad_accum": 2, "channels_last": True, "sync_every": 4},
    "foreach": {"optimizer_impl": "foreach", "sync_every": 0},
    "fused": {"optimizer_impl": "fused", "sync_every": 2, "cudnn_benchmark": False},
    "flags": {"tf32": True, "cudnn_benchmark": True, "amp": "bf16", "grad_accum": 3, "sync_every": 5},
}


def _model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 3))


def _dataset():
    g = torch.Generator().manual_seed(SEED)
    return [(torch.randn(3, 8, 8, generator=g), torch.tensor(i % 3)) for i in range(20)]


def _factory():
    return optimizer_factory("sgd", {"lr": 0.05, "momentum": 0.9}, Path("."))


def _flags():
    return (torch.get_num_threads(), torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32)


# Not PyTorch's TF32 defaults (matmul off, cuDNN on): what tf32: null must leave alone.
UNTOUCHED_TF32 = (True, False)


def _scramble_flags(settings):
    # The opposite of what the settings ask for, so a flag that is not applied shows.
    torch.backends.cudnn.benchmark = not settings["cudnn_benchmark"]
    if settings["tf32"] is None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = UNTOUCHED_TF32
    else:
        torch.backends.cuda.matmul.allow_tf32 = not settings["tf32"]
        torch.backends.cudnn.allow_tf32 = not settings["tf32"]


class _Observed:
    """Records optimizer steps (global hook) and the classifier's output dtype."""

    def __init__(self, model):
        self.steps = 0
        self.dtypes = set()
        model[-1].register_forward_hook(lambda m, i, out: self.dtypes.add(out.dtype))

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._handle = register_optimizer_step_post_hook(lambda *a: setattr(self, "steps", self.steps + 1))
        return self

    def __exit__(self, *exc):
        self._handle.remove()


def _loader_args(loader):
    return {k: getattr(loader, k) for k in ("batch_size", "num_workers", "pin_memory", "drop_last", "persistent_workers",
                                            "prefetch_factor")}


def _through_trainer(settings):
    _scramble_flags(settings)
    model = _model()
    workload = Workload(model=model, dataset=_dataset(), loss_fn=cross_entropy, optimizer_factory=_factory(),
                        image_like=True)
    observed = _Observed(model)
    trainer = Trainer(workload, settings, torch.device("cpu"), seed=SEED)
    flags = _flags()
    reads = 0
    with observed:
        for _ in range(OPTIMIZER_STEPS):
            trainer.step()
            if trainer.should_read_loss():
                trainer.loss_value()
                reads += 1
    return {
        "flags": flags,
        "dtypes": observed.dtypes,
        "loader": _loader_args(trainer.loader),
        "scaler": None if trainer.scaler is None else trainer.scaler.get_scale(),
        "steps": observed.steps,
        "reads": reads,
        "weights": [p.detach().clone() for p in model.parameters()],
        "channels_last": model[0].weight.is_contiguous(memory_format=torch.channels_last),
        "optimizer_defaults": {k: trainer.optimizer.defaults.get(k) for k in ("foreach", "fused")},
    }


def _through_settings(settings):
    """The README's "Using the winner in production" loop."""
    _scramble_flags(settings)
    s = TrainSettings(device="cpu", settings=settings)
    s.apply_backend_flags()
    flags = _flags()
    dataset = _dataset()
    model = _model()
    observed = _Observed(model)
    loader = torch.utils.data.DataLoader(dataset, shuffle=True, generator=torch.Generator().manual_seed(SEED),
                                         **s.dataloader_kwargs())
    forward = s.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, **s.optimizer_kwargs())
    step, reads = 0, 0
    with observed:
        while observed.steps < OPTIMIZER_STEPS:
            for x, y in loader:
                x, y = s.to_device(x, y)
                with s.autocast():
                    loss = cross_entropy(forward(x), y)
                s.backward_and_step(loss, optimizer, step)
                if s.should_log(step):
                    loss.item()
                    reads += 1
                step += 1
                if observed.steps == OPTIMIZER_STEPS:
                    break
    return {
        "flags": flags,
        "dtypes": observed.dtypes,
        "loader": _loader_args(loader),
        "scaler": None if s.grad_scaler is None else s.grad_scaler.get_scale(),
        "steps": observed.steps,
        "reads": reads,
        "weights": [p.detach().clone() for p in model.parameters()],
        "channels_last": model[0].weight.is_contiguous(memory_format=torch.channels_last),
        "optimizer_defaults": {k: optimizer.defaults.get(k) for k in ("foreach", "fused")},
    }


@pytest.fixture(autouse=True)
def _restore_flags():
    saved = _flags()
    yield
    torch.set_num_threads(saved[0])
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1:]


@pytest.mark.parametrize("case", sorted(CASES))
def test_trial_loop_and_settings_api_train_alike(case):
    settings = {**default_settings(), "batch_size": 4, "threads": torch.get_num_threads(), **CASES[case]}
    trial = _through_trainer(settings)
    prod = _through_settings(settings)

    tf32 = UNTOUCHED_TF32 if settings["tf32"] is None else (settings["tf32"], settings["tf32"])
    expected_flags = (settings["threads"], settings["cudnn_benchmark"], *tf32)
    assert trial["flags"] == prod["flags"] == expected_flags
    dtype = {"off": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[settings["amp"]]
    assert trial["dtypes"] == prod["dtypes"] == {dtype}
    assert trial["loader"] == prod["loader"]
    assert trial["loader"]["batch_size"] == 4 and trial["loader"]["drop_last"] is True
    assert (trial["scaler"] is None) is (prod["scaler"] is None) is (settings["amp"] != "fp16")
    assert trial["scaler"] == prod["scaler"]
    assert trial["steps"] == prod["steps"] == OPTIMIZER_STEPS
    every = settings["sync_every"]
    assert trial["reads"] == prod["reads"] == (OPTIMIZER_STEPS // every if every else 0)
    assert trial["channels_last"] is prod["channels_last"] is settings["channels_last"]
    assert trial["optimizer_defaults"] == prod["optimizer_defaults"]
    for a, b in zip(trial["weights"], prod["weights"]):
        assert torch.equal(a, b)
    # Training happened: the weights moved from their initial values.
    assert not all(torch.equal(a, b) for a, b in zip(trial["weights"], _model().parameters()))
