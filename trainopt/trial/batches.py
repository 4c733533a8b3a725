"""Batches of any structure: moved to the device, searched for images, fed to the model, read for a loss.

A batch is whatever the DataLoader yields: a tensor, a tuple or list (a namedtuple keeps its
type), a dict or any other Mapping (Hugging Face's ``BatchEncoding`` included), a dataclass,
nested at will. Three forms turn a batch into the loss that trainopt backpropagates:

* ``pair``: ``(input, target)`` and a named loss, ``loss_fn(model(input), target)``;
* ``model`` (``loss: model``): the model computes its own loss; a Mapping batch is called as
  ``model(**batch)``, a tuple or list as ``model(*batch)``, anything else as ``model(batch)``;
  an output such as ``(logits, loss)`` gives its one scalar tensor, and ``note`` on the
  computing function says which element that was;
* ``step`` (``step: "module:callable"``): ``step(model, batch)``, the user's forward and loss;
* ``lightning``: a LightningModule's ``training_step(batch, batch_idx)``
  (``trainopt.trial.lightning_step``).

The loss is read from what the model or the step returns (``read_loss``). A batch the model
cannot be called with, or an output that carries no loss, is a ``WorkloadError`` whose one
line names the spec field and the fix; an error inside the user's code keeps its own type.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import multiprocessing
import pickle
from collections.abc import Mapping, MutableMapping
from typing import Any, Callable, Iterator

import torch

from trainopt.contract.reference import WorkloadError
from trainopt.contract.spec import LOSS_FORMS

__all__ = [
    "LOSS_FORMS",
    "call_model",
    "check_worker_batches",
    "describe",
    "has_image_tensor",
    "loss_computer",
    "loss_element",
    "loss_note",
    "move",
    "read_loss",
    "tensors",
]

# What a loss may be, for the messages that say what to return.
_LOSS_SHAPES = ("a scalar tensor, an object with .loss, a dict with 'loss', a dict of scalar losses, "
                "or a tuple or list with one scalar tensor among its elements, such as (logits, loss)")


def move(batch: Any, device: torch.device, non_blocking: bool, channels_last: bool) -> Any:
    """``batch`` with every tensor on ``device``; its structure and container types kept.

    Args:
        batch: A tensor, or any structure of them (see the module's docstring).
        device: Where to.
        non_blocking: Copy without waiting (from pinned memory).
        channels_last: Give every 4-D floating tensor the channels-last memory format.
    """
    # A tensor costs this one isinstance test; only containers recurse.
    if isinstance(batch, torch.Tensor):
        batch = batch.to(device, non_blocking=non_blocking)
        if channels_last and batch.dim() == 4 and batch.is_floating_point():
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch
    kind = type(batch)
    if kind is list or kind is tuple:
        # The default collate's (input, target) comes as a list: no closure, one comprehension.
        moved = [move(item, device, non_blocking, channels_last) for item in batch]
        return moved if kind is list else tuple(moved)
    return _rebuild(batch, lambda item: move(item, device, non_blocking, channels_last))


def _rebuild(batch: Any, fn: Callable[[Any], Any]) -> Any:
    """``batch`` with ``fn`` applied to each direct member, in a container of the same type."""
    kind = type(batch)
    if kind is list:
        return [fn(item) for item in batch]
    if kind is tuple:
        return tuple(fn(item) for item in batch)
    if kind is dict:
        return {key: fn(value) for key, value in batch.items()}
    if isinstance(batch, tuple):
        items = [fn(item) for item in batch]
        # A namedtuple takes its fields as arguments; other tuple subclasses an iterable.
        return kind(*items) if hasattr(batch, "_fields") else kind(items)
    if isinstance(batch, list):
        return kind(fn(item) for item in batch)
    if isinstance(batch, Mapping):
        if isinstance(batch, MutableMapping):
            # A copy keeps the type and what it carries beside its items (BatchEncoding's
            # encodings); a UserDict's copy has its own item storage.
            out = copy.copy(batch)
            for key, value in batch.items():
                out[key] = fn(value)
            return out
        moved = {key: fn(value) for key, value in batch.items()}
        try:
            return kind(moved)
        except Exception:  # noqa: BLE001 - a read-only mapping type that cannot be rebuilt: a dict serves
            return moved
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        changes = {f.name: fn(getattr(batch, f.name)) for f in dataclasses.fields(batch) if f.init}
        return dataclasses.replace(batch, **changes)
    return batch


def _members(batch: Any) -> Iterator[Any]:
    if isinstance(batch, (tuple, list)):
        yield from batch
    elif isinstance(batch, Mapping):
        yield from batch.values()
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for f in dataclasses.fields(batch):
            yield getattr(batch, f.name)


def tensors(batch: Any) -> Iterator[torch.Tensor]:
    """Every tensor in ``batch``, depth first."""
    if isinstance(batch, torch.Tensor):
        yield batch
        return
    for item in _members(batch):
        yield from tensors(item)


def has_image_tensor(batch: Any) -> bool:
    """Whether ``batch`` holds a 4-D floating tensor: what ``channels_last`` changes."""
    return any(t.dim() == 4 and t.is_floating_point() for t in tensors(batch))


def describe(value: Any) -> str:
    """A short phrase for a batch or an output in messages: ``a dict with keys a, b``, ``a tensor of shape [4, 3]``."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)}"
    name = type(value).__name__
    if isinstance(value, Mapping):
        keys = ", ".join(str(k) for k in list(value.keys())[:8])
        return f"a {name} with keys {keys}" if keys else f"an empty {name}"
    if isinstance(value, (tuple, list)):
        return f"a {name} of {len(value)}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return f"a {name} dataclass"
    return "None" if value is None else f"a {name}"


# ---- the model's call -------------------------------------------------------------------


def _innermost(module: Any) -> Any:
    """The user's own module under torch.compile's and DistributedDataParallel's wrappers."""
    for _ in range(8):
        inner = getattr(module, "_orig_mod", None)
        if inner is None and type(module).__name__ == "DistributedDataParallel":
            inner = module.module
        if inner is None:
            return module
        module = inner
    return module


def _binds(forward: Any, args: tuple, kwargs: Mapping[str, Any]) -> TypeError | None:
    """The TypeError binding ``args``/``kwargs`` to the model's ``forward`` raises, or None when they bind."""
    target = _innermost(forward)
    try:
        signature = inspect.signature(getattr(target, "forward", target))
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return exc
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _call(forward: Any, args: tuple, kwargs: Mapping[str, Any], mismatch: Callable[[TypeError], str]) -> Any:
    try:
        return forward(*args, **kwargs)
    except TypeError as exc:
        # Only a batch that does not fit forward's parameters is the spec's fault; a
        # TypeError from inside the model is the model's own, with its traceback.
        bad = _binds(forward, args, kwargs)
        if bad is None:
            raise
        raise WorkloadError(mismatch(bad)) from exc


def _parameters(forward: Any) -> str:
    target = _innermost(forward)
    try:
        names = list(inspect.signature(getattr(target, "forward", target)).parameters)
    except (TypeError, ValueError):
        return ""
    return f" ({', '.join(names)})" if names else ""


def call_model(forward: Any, batch: Any, field: str = "loss 'model'") -> Any:
    """``model(**batch)`` for a Mapping, ``model(*batch)`` for a tuple or list, else ``model(batch)``.

    Raises:
        WorkloadError: The batch's keys or members do not fit the model's ``forward``.
    """
    if isinstance(batch, Mapping):
        args, kwargs, how = (), batch, "model(**batch)"
    elif isinstance(batch, (tuple, list)):
        args, kwargs, how = tuple(batch), {}, "model(*batch)"
    else:
        args, kwargs, how = (batch,), {}, "model(batch)"

    def mismatch(exc: TypeError) -> str:
        return (
            f"{field}: the model cannot be called as {how} with {describe(batch)} ({_first_line(exc)}); "
            f"make the batch's keys or members match forward's parameters{_parameters(forward)}, "
            f"or set step: 'module:callable' to call the model yourself"
        )

    return _call(forward, args, kwargs, mismatch)


# ---- the loss ------------------------------------------------------------------------------


def _scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1


def read_loss(output: Any, field: str, what: str, fix: str) -> torch.Tensor:
    """The loss in what a model or a step returned.

    The output itself when it is a scalar tensor; else its ``["loss"]`` or its ``.loss``;
    else the sum of a dict of scalar losses (torchvision's detection models); else, for a
    tuple or list, its one scalar tensor (``(logits, loss)``; ``loss_element``).

    Args:
        output: What the model or the step returned.
        field: The spec field, for the message (``loss 'model'``, ``step 'mod:fn'``).
        what: How the message names ``output`` (``the model's output``).
        fix: What to change, for the message.

    Raises:
        WorkloadError: ``output`` carries no loss.
    """
    if isinstance(output, torch.Tensor):
        if output.numel() == 1:
            return output
        raise WorkloadError(f"{field}: {what} is {describe(output)}, not a scalar loss; {fix}")
    loss = output["loss"] if isinstance(output, Mapping) and "loss" in output else getattr(output, "loss", None)
    if loss is not None:
        if _scalar(loss):
            return loss
        raise WorkloadError(f"{field}: the loss in {what} is {describe(loss)}, not a scalar tensor; {fix}")
    if isinstance(output, Mapping) and output and all(_scalar(v) for v in output.values()):
        return sum(output.values())
    index = loss_element(output)
    if index is not None:
        return output[index]
    if isinstance(output, (tuple, list)):
        several = [i for i, v in enumerate(output) if _scalar(v)]
        if several:
            raise WorkloadError(
                f"{field}: {what} ({describe(output)}) holds {len(several)} scalar tensors (elements "
                f"{', '.join(map(str, several))}), so which is the loss is ambiguous; {fix}"
            )
    raise WorkloadError(f"{field}: {what} ({describe(output)}) carries no loss; {fix}")


def loss_element(output: Any) -> int | None:
    """The index of the loss in a tuple or list output, such as ``(logits, loss)``.

    Only when exactly one element is a scalar tensor: with two or more, which one is the
    loss is a guess trainopt does not make.
    """
    if not isinstance(output, (tuple, list)) or hasattr(output, "loss"):
        return None
    scalars = [i for i, value in enumerate(output) if _scalar(value)]
    return scalars[0] if len(scalars) == 1 else None


def loss_note(output: Any, field: str, what: str) -> str | None:
    """The line that says which element of a tuple or list output was read as the loss, or None."""
    index = loss_element(output)
    if index is None:
        return None
    parts = ", ".join("a scalar tensor" if i == index else describe(v) for i, v in enumerate(output))
    return f"{field}: {what} is a {type(output).__name__} ({parts}); element {index}, its one scalar tensor, is the loss"


def loss_computer(
    form: str,
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = None,
    step_fn: Callable[[Any, Any], Any] | None = None,
    fields: Mapping[str, Any] | None = None,
) -> Callable[[Any, Any], torch.Tensor]:
    """The function ``compute(forward, batch) -> loss`` of one loss form.

    Args:
        form: ``pair``, ``model``, ``step`` or ``lightning`` (``LOSS_FORMS``).
        loss_fn: The pair form's ``loss(output, target)``.
        step_fn: The step form's ``step(model, batch)``; the lightning form's
            ``compute(forward, batch)`` that calls ``training_step`` through ``forward``.
        fields: The spec's values by field (``model.name``, ``data.name``, ``step``), for messages.

    Raises:
        ValueError: An unknown form, or one without the function it needs.
    """
    fields = dict(fields or {})
    if form == "pair":
        if loss_fn is None:
            raise ValueError("the pair form needs a loss function")
        model_field = f"model.name {fields.get('model.name', '?')!r}"

        def mismatch(exc: TypeError) -> str:
            return (
                f"{model_field}: the model cannot be called as model(input) with the data's inputs "
                f"({_first_line(exc)}); make data.name yield (input, target) pairs the model takes, "
                f"or set loss: model (the model takes the whole batch) or step: 'module:callable'"
            )

        def pair(forward: Any, batch: Any) -> torch.Tensor:
            x, y = batch
            try:
                output = forward(x)
            except TypeError as exc:
                bad = _binds(forward, (x,), {})
                if bad is None:
                    raise
                raise WorkloadError(mismatch(bad)) from exc
            return loss_fn(output, y)

        return pair
    if form == "model":
        fix = (
            f"make forward return the loss when the batch holds the labels ({_LOSS_SHAPES}), "
            f"or set step: 'module:callable' to compute it"
        )

        def model_loss(forward: Any, batch: Any) -> torch.Tensor:
            output = call_model(forward, batch)
            if model_loss.note is None:
                model_loss.note = loss_note(output, "loss 'model'", "the model's output")
            return read_loss(output, "loss 'model'", "the model's output", fix)

        model_loss.note = None  # type: ignore[attr-defined]
        return model_loss
    if form in ("step", "lightning"):
        if step_fn is None:
            raise ValueError(f"the {form} form needs a step function")
        if form == "step":
            field = f"step {fields.get('step', '?')!r}"
            fix = f"return the loss from step(model, batch): {_LOSS_SHAPES}"
        else:
            field = f"model.name {fields.get('model.name', '?')!r}"
            fix = f"return the loss from training_step(batch, batch_idx): {_LOSS_SHAPES}"

        def step_loss(forward: Any, batch: Any) -> torch.Tensor:
            output = step_fn(forward, batch)
            if step_loss.note is None:
                step_loss.note = loss_note(output, field, "what it returned")
            return read_loss(output, field, "what it returned", fix)

        step_loss.note = None  # type: ignore[attr-defined]
        return step_loss
    raise ValueError(f"unknown loss form {form!r}; expected one of {', '.join(LOSS_FORMS)}")


# ---- loader workers ----------------------------------------------------------------------


def check_worker_batches(sample: Any, dataset: Any, collate_fn: Any, num_workers: int, field: str) -> None:
    """Check that loader workers can send batches (and, unless forked, receive the data set).

    A worker sends each batch to the training process pickled; a batch that cannot be
    pickled is only printed by the queue's feeder thread, and the loader then waits for it
    forever. So a sample batch is pickled here first, and the data set and collate function
    too where workers are spawned rather than forked.

    Args:
        sample: A batch collated from the data set's first items.
        dataset: The data set.
        collate_fn: The loader's ``collate_fn``, or None.
        num_workers: The loader's worker count; nothing is checked at 0.
        field: The spec field that makes the batches (``data.name '...'``), for the message.

    Raises:
        WorkloadError: One of them cannot be pickled.
    """
    if num_workers <= 0:
        return
    parts = [("a batch", sample)]
    if multiprocessing.get_start_method() != "fork":
        parts += [("the data set", dataset), ("data.collate", collate_fn)]
    for what, obj in parts:
        try:
            pickle.dumps(obj)
        except Exception as exc:  # noqa: BLE001 - whatever pickling raises means the same thing here
            raise WorkloadError(
                f"{field}: {what} cannot be pickled ({_first_line(exc)}), and with num_workers {num_workers} "
                f"loader worker processes must pickle it; keep to tensors, numbers, strings and containers of them "
                f"(or objects of importable classes), or set num_workers to 0"
            ) from exc
