"""What a trial trained, as plain data: how a batch became the loss, and the optimizer it built.

The exports write the training the search measured (``best.yaml``'s ``code:`` section is
made from this record of the baseline trial): the optimizer's class and keyword arguments,
where they came from (the spec's ``optimizer``, trainopt's default, or a LightningModule's
``configure_optimizers()``), the loss form, and for a LightningModule's own data the batch
size its ``train_dataloader()`` asked for (trainopt's ``batch_size`` knob replaced it).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Mapping

import torch

from trainopt.contract.spec import DEFAULT_OPTIMIZER

__all__ = ["IMPL_KEYS", "class_path", "optimizer_arguments", "workload_record"]

# The optimizer's kernel choice: the optimizer_impl knob carries it, not the optimizer's record.
IMPL_KEYS = ("foreach", "fused", "capturable", "differentiable")


def class_path(cls: type) -> str:
    """``torch.optim.AdamW`` for torch's optimizers (their public name), else ``module.Class``."""
    if getattr(torch.optim, cls.__name__, None) is cls:
        return f"torch.optim.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _plain(value: Any) -> Any:
    """A hyperparameter as YAML-ready data: tensors to numbers, tuples to lists."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def optimizer_arguments(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The keyword arguments that rebuild ``optimizer``: its hyperparameters that differ from its class's defaults.

    The learning rate is always kept. Kernel choices (``IMPL_KEYS``) are the
    ``optimizer_impl`` knob's, so they are left out, as are entries the constructor does not
    take (AdamW records ``decoupled_weight_decay`` in its defaults but has no such argument).
    """
    try:
        params = dict(inspect.signature(type(optimizer)).parameters)
    except (TypeError, ValueError):
        params = {}
    open_ended = not params or any(p.kind is p.VAR_KEYWORD for p in params.values())
    out: dict[str, Any] = {}
    for key, value in optimizer.defaults.items():
        if key in IMPL_KEYS or not isinstance(value, (int, float, bool, tuple, list, torch.Tensor, str, type(None))):
            continue
        if key not in params and not open_ended:
            continue
        value = _plain(value)
        default = params[key].default if key in params else inspect.Parameter.empty
        if key == "lr" or default is inspect.Parameter.empty or _plain(default) != value:
            out[key] = value
    return out


def workload_record(form: str, spec: Mapping[str, Any], optimizer: torch.optim.Optimizer,
                    fields: Mapping[str, Any]) -> dict[str, Any]:
    """The record of what one trial trained.

    Args:
        form: The loss form (``pair``, ``model``, ``step`` or ``lightning``).
        spec: The resolved spec the trial ran.
        optimizer: The optimizer the trial built (its kernel choice included).
        fields: The workload's ``fields`` (``data.batch_size``: a LightningModule's or data
            module's own DataLoader batch size, when it supplied the data).

    Returns:
        ``{form, optimizer: {source, name, class, args}, data_batch_size}``: ``source`` is
        ``spec``, ``default`` or ``configure_optimizers``; ``name`` the spec's optimizer name
        (None from ``configure_optimizers``); ``args`` the keyword arguments as the spec gave
        them, or as measured on the built optimizer when the module built it.
    """
    section = spec.get("optimizer")
    if section is None and form == "lightning":
        source, name, args = "configure_optimizers", None, optimizer_arguments(optimizer)
    else:
        section = section or DEFAULT_OPTIMIZER
        source = "spec" if spec.get("optimizer") is not None else "default"
        name = section["name"]
        args = {k: _plain(v) for k, v in dict(section.get("args") or {}).items() if k not in IMPL_KEYS}
    return {
        "form": form,
        "optimizer": {"source": source, "name": name, "class": class_path(type(optimizer)), "args": args},
        "data_batch_size": fields.get("data.batch_size"),
    }
