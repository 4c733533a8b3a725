"""The record of what a trial trained: the optimizer's class and the arguments that rebuild it."""

from __future__ import annotations

import pytest
import torch

from trainopt.trial.workload_record import IMPL_KEYS, class_path, optimizer_arguments, workload_record


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (torch.optim.AdamW, {"lr": 3e-4, "betas": (0.9, 0.95), "weight_decay": 0.1, "eps": 1e-6}),
        (torch.optim.Adam, {"lr": 1e-3, "amsgrad": True}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        (torch.optim.RMSprop, {"lr": 0.01, "alpha": 0.9}),
        (torch.optim.Adagrad, {"lr": 0.05}),
    ],
)
def test_the_recorded_arguments_rebuild_the_optimizer_a_module_built(cls, kwargs):
    params = [torch.nn.Parameter(torch.zeros(3))]
    built = cls(params, foreach=True, **kwargs)
    args = optimizer_arguments(built)
    assert not set(args) & set(IMPL_KEYS) and args["lr"] == kwargs["lr"]
    again = cls(params, **{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    strip = lambda g: {k: v for k, v in g.items() if k != "params" and k not in IMPL_KEYS}  # noqa: E731
    assert strip(again.param_groups[0]) == strip(built.param_groups[0])
    assert class_path(cls) == f"torch.optim.{cls.__name__}"


def test_a_configure_optimizers_record_differs_from_a_spec_record():
    built = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.2, momentum=0.5, foreach=True)
    lit = workload_record("lightning", {"model": {"name": "m:f"}}, built, {"data.batch_size": 4})
    assert lit == {"form": "lightning", "data_batch_size": 4, "optimizer": {
        "source": "configure_optimizers", "name": None, "class": "torch.optim.SGD", "args": {"lr": 0.2, "momentum": 0.5}}}
    spec = {"optimizer": {"name": "sgd", "args": {"lr": 0.2, "momentum": 0.5, "foreach": True}}}
    assert workload_record("pair", spec, built, {})["optimizer"] == {
        "source": "spec", "name": "sgd", "class": "torch.optim.SGD", "args": {"lr": 0.2, "momentum": 0.5}}
    assert workload_record("pair", {}, built, {})["optimizer"]["source"] == "default"
