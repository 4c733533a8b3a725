"""Build the thing being trained from a spec: model, data set, collate, loss (or step) and optimizer.

Each part is a built-in name or a reference to the user's code (see ``reference``). How a
batch becomes a loss is one of three forms (``trainopt.trial.batches``): ``(input, target)``
pairs with a named loss, ``loss: model`` (the model computes its own loss from the whole
batch) or ``step: "module:callable"`` (the user's forward and loss).
Mistakes in the spec raise ``WorkloadError`` with a one-line message; exceptions raised
by the user's own factories pass through unchanged, so their tracebacks reach the log.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, IterableDataset, default_collate

from trainopt.contract.reference import (
    WorkloadError,
    check_kwargs,
    is_reference,
    resolve_reference,
)
from trainopt.contract.spec import BUILTIN_OPTIMIZER_CLASSES, DEFAULT_LOSS, DEFAULT_OPTIMIZER, MODEL_LOSS
from trainopt.knobs.kwargs import optimizer_kwargs
from trainopt.trial.batches import describe, has_image_tensor
from trainopt.trial.workloads.data import BUILTIN_DATA, build_dataset
from trainopt.trial.workloads.models import BUILTIN_MODELS

__all__ = [
    "Workload",
    "WorkloadError",
    "build_workload",
    "resolve_reference",
    "BUILTIN_MODELS",
    "BUILTIN_DATA",
    "BUILTIN_LOSSES",
    "BUILTIN_OPTIMIZERS",
]


@dataclass
class Workload:
    """Everything a trial needs to run training steps.

    Attributes:
        model: The network, on the CPU, freshly initialized from the spec's seed.
        dataset: A map-style data set; its items are ``(input, target)`` tensors in the
            pair form, anything its collate function batches otherwise.
        loss_fn: ``loss_fn(output, target)`` returns a scalar tensor (the pair form; None
            in the others).
        optimizer_factory: ``optimizer_factory(params, impl)`` returns an optimizer;
            ``impl`` is ``"default"``, ``"foreach"`` or ``"fused"``.
        image_like: True when a batch holds a 4-D floating tensor, so channels-last applies.
        collate_fn: The DataLoader's ``collate_fn`` (``data.collate``), or None for PyTorch's default.
        loss_form: ``pair``, ``model``, ``step`` or ``lightning`` (``trainopt.contract.spec.LOSS_FORMS``).
        step_fn: The step form's ``step(model, batch)``, else None.
        sample_batch: A real batch collated from the data set's first items, or None.
        fields: The spec's values by field (``model.name``, ``data.name``, ``data.collate``,
            ``loss``, ``step``), for messages; ``data.batch_size``: the batch size of a
            LightningModule's (or data module's) own ``train_dataloader()``, when it supplied the data.
    """

    model: nn.Module
    dataset: Dataset
    loss_fn: Callable[[Any, Any], torch.Tensor] | None
    optimizer_factory: Callable[[Iterable[Any], str], torch.optim.Optimizer]
    image_like: bool
    collate_fn: Callable[[list[Any]], Any] | None = None
    loss_form: str = "pair"
    step_fn: Callable[[Any, Any], Any] | None = None
    sample_batch: Any = None
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def data_field(self) -> str:
        """The spec field that makes the batches, as messages name it: ``data.collate '...'`` or ``data.name '...'``."""
        if self.fields.get("data.collate"):
            return f"data.collate {self.fields['data.collate']!r}"
        return f"data.name {self.fields.get('data.name', '?')!r}"


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy; sequence logits ``[B, T, V]`` are scored per token."""
    if output.dim() == 3 and target.dim() == 2:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error; the target is cast to the output's dtype and shape.

    Integer or ``[B]`` targets are common in user data; casting here keeps them from
    failing under mixed precision, while a real size mismatch is still an error rather
    than a silent broadcast.
    """
    if target.dtype != output.dtype:
        target = target.to(output.dtype)
    if target.shape != output.shape:
        if target.numel() != output.numel():
            raise ValueError(
                f"mse: model output {tuple(output.shape)} and target {tuple(target.shape)} differ in size; "
                f"make the model's output width match the target"
            )
        target = target.reshape(output.shape)
    return F.mse_loss(output, target)


BUILTIN_LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cross_entropy": cross_entropy,
    "mse": mse,
}
BUILTIN_OPTIMIZERS: dict[str, type[torch.optim.Optimizer]] = {
    name: getattr(torch.optim, path.rpartition(".")[2]) for name, path in BUILTIN_OPTIMIZER_CLASSES.items()
}


def _with_impl(args: Mapping[str, Any], impl: str) -> dict[str, Any]:
    # The impl knob is what is being measured, so it overrides foreach/fused in the
    # spec's args; only the one key is set, since older optimizers lack the other.
    kwargs = dict(args)
    extra = optimizer_kwargs(impl)
    if extra:
        kwargs.pop("foreach", None)
        kwargs.pop("fused", None)
        kwargs.update(extra)
    return kwargs


def _accepts(factory: Callable[..., Any], key: str) -> bool:
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.name == key or p.kind is p.VAR_KEYWORD for p in params)


def _optimizer_factory(name: str, args: Mapping[str, Any], source_dir: Path):
    if is_reference(name):
        factory = resolve_reference(name, source_dir, field="optimizer.name")
        check_kwargs(factory, args, "optimizer.args", repr(name), leading=1)
        label = f"optimizer.name {name!r}"
    elif name in BUILTIN_OPTIMIZERS:
        factory = BUILTIN_OPTIMIZERS[name]
        check_kwargs(factory, args, "optimizer.args", name, leading=1)
        label = f"optimizer {name!r}"
    else:
        raise WorkloadError(
            f"optimizer.name {name!r} is not a built-in optimizer ({', '.join(BUILTIN_OPTIMIZERS)}) "
            f"nor a 'module:callable' reference"
        )

    def make(params: Iterable[Any], impl: str = "default") -> torch.optim.Optimizer:
        kwargs = _with_impl(args, impl)
        for key in optimizer_kwargs(impl):
            if not _accepts(factory, key):
                raise WorkloadError(f"{label} takes no {key!r} argument, so optimizer_impl={impl} cannot apply to it")
        return factory(params, **kwargs)

    return make


def _loss(name: str, source_dir: Path) -> Callable[[Any, Any], torch.Tensor]:
    if name in BUILTIN_LOSSES:
        return BUILTIN_LOSSES[name]
    if not is_reference(name):
        raise WorkloadError(
            f"loss {name!r} is not a built-in loss ({', '.join(BUILTIN_LOSSES)}) nor a 'module:callable' reference"
        )
    loss = resolve_reference(name, source_dir, field="loss")
    if isinstance(loss, type):
        if not issubclass(loss, nn.Module):
            raise WorkloadError(
                f"loss {name!r}: {loss.__name__} is a class but not a torch.nn.Module; "
                f"name a function loss(output, target) or an nn.Module loss class"
            )
        # A loss class such as torch.nn:CrossEntropyLoss is used with its defaults.
        loss = loss()
    return loss


def _dataset(name: str, args: Mapping[str, Any], source_dir: Path, pairs: bool = True) -> Dataset:
    """The data set; with ``pairs``, its items must be ``(input, target)`` (no collate, the pair form)."""
    if not is_reference(name):
        return build_dataset(name, args)
    factory = resolve_reference(name, source_dir, field="data.name")
    check_kwargs(factory, args, "data.args", repr(name))
    dataset = factory(**args)  # the user's errors propagate as raised
    expected = "expected a torch.utils.data.Dataset yielding (input, target)" if pairs else "expected a torch.utils.data.Dataset"
    # Map-style: a torch Dataset, or another indexable class with a length (a Hugging Face
    # datasets.Dataset); a bare list or dict is more likely a mistake than a data set.
    map_style = isinstance(dataset, Dataset) or (
        hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__") and not isinstance(dataset, (list, tuple, dict, str)))
    if isinstance(dataset, IterableDataset) or not map_style:
        what = "an IterableDataset" if isinstance(dataset, IterableDataset) else type(dataset).__name__
        raise WorkloadError(f"data.name {name!r}: returned {what}, {expected} (map-style, with __len__)")
    if len(dataset) == 0:
        raise WorkloadError(f"data.name {name!r}: returned an empty data set; it needs at least one batch of samples")
    if not pairs:
        return dataset
    first = dataset[0]
    if not isinstance(first, (tuple, list)) or len(first) != 2:
        got = type(first).__name__
        if isinstance(first, (tuple, list)):
            got = f"a {got} of length {len(first)}"
        raise WorkloadError(f"data.name {name!r}: item 0 is {got}; {expected} pairs")
    return dataset


def _sample_shape(dataset: Dataset) -> tuple[int, ...]:
    """The shape of item 0's input when items are ``(input, target)`` pairs, else ``()``."""
    first = dataset[0]
    if not isinstance(first, (tuple, list)) or len(first) != 2:
        return ()
    shape = getattr(first[0], "shape", None)
    return tuple(int(s) for s in shape) if shape is not None else ()


def _user_function(ref: str, source_dir: Path, field_name: str, positional: int) -> Callable[..., Any]:
    function = resolve_reference(ref, source_dir, field=field_name)
    check_kwargs(function, {}, field_name, repr(ref), leading=positional)
    return function


def _sample_batch(dataset: Dataset, collate_fn: Callable[[list[Any]], Any] | None, data_name: str) -> Any:
    """A real batch of the data set's first items (two, so items of unequal size show)."""
    items = [dataset[i] for i in range(min(2, len(dataset)))]
    if collate_fn is not None:
        return collate_fn(items)  # the user's errors propagate as raised
    try:
        return default_collate(items)
    except Exception as exc:  # noqa: BLE001 - default_collate raises several types for the same problem
        detail = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        raise WorkloadError(
            f"data.name {data_name!r}: PyTorch's default collate cannot batch its items ({detail}); "
            f"set data.collate to a 'module:callable' that batches them (padding, for one)"
        ) from exc


def _shape_hints(name: str, dataset: Dataset, input_shape: tuple[int, ...], args: Mapping[str, Any]) -> dict[str, Any]:
    """Model arguments the data set already determines; the spec's ``args`` win."""
    hints: dict[str, Any] = {}
    if name in ("resnet18", "resnet50", "mlp"):
        hints["input_shape"] = input_shape
        # The built-in sets say how wide the output must be (classes, or 1 for regression).
        outputs = getattr(dataset, "num_outputs", None)
        if isinstance(outputs, int):
            hints["num_classes"] = outputs
    elif name == "gpt":
        for key in ("vocab_size", "seq_len"):
            value = getattr(dataset, key, None)
            if isinstance(value, int):
                hints[key] = value
                given = args.get(key)
                # A smaller table than the data needs fails deep in an embedding lookup.
                if isinstance(given, int) and not isinstance(given, bool) and given < value:
                    raise WorkloadError(
                        f"model.args.{key} is {given} but the data set's {key} is {value}; raise it or leave it out"
                    )
    return {k: v for k, v in hints.items() if k not in args}


def _model(name: str, args: Mapping[str, Any], source_dir: Path, dataset: Dataset, input_shape) -> nn.Module:
    if is_reference(name):
        factory = resolve_reference(name, source_dir, field="model.name")
        check_kwargs(factory, args, "model.args", repr(name))
        model = factory(**args)  # the user's errors propagate as raised
        if not isinstance(model, nn.Module):
            raise WorkloadError(f"model.name {name!r}: returned {type(model).__name__}, expected a torch.nn.Module")
        return model
    if name not in BUILTIN_MODELS:
        raise WorkloadError(
            f"model.name {name!r} is not a built-in model ({', '.join(BUILTIN_MODELS)}) "
            f"nor a 'module:callable' reference"
        )
    factory = BUILTIN_MODELS[name]
    check_kwargs(factory, args, "model.args", name)
    if name.startswith("resnet") and "input_shape" not in args and len(input_shape) != 3:
        raise WorkloadError(
            f"model.name {name!r} needs image inputs [channels, height, width], but the data set's inputs "
            f"have shape {list(input_shape)}; use image data or another model"
        )
    return factory(**{**_shape_hints(name, dataset, input_shape, args), **args})


def _section(spec: Mapping[str, Any], key: str) -> tuple[str, dict[str, Any]]:
    section = spec.get(key)
    if not isinstance(section, Mapping) or not isinstance(section.get("name"), str):
        raise WorkloadError(f"{key}: expected a mapping with 'name' (and optional 'args'), got {section!r}")
    args = section.get("args") or {}
    if not isinstance(args, Mapping):
        raise WorkloadError(f"{key}.args: expected a mapping of keyword arguments, got {args!r}")
    return section["name"], dict(args)


def build_workload(spec: Mapping[str, Any], source_dir: Path) -> Workload:
    """Build the model, data set, collate function, loss form and optimizer factory that a spec describes.

    The data set comes first for a built-in model, so it can take its input shape (and
    vocabulary, output width) from it; a referenced model comes first, so a LightningModule
    can supply what the spec leaves out (``trainopt.trial.lightning_step``). A sample batch is
    collated from the data set's first items, as the loader will batch them: whether it holds
    a 4-D floating tensor decides whether ``channels_last`` applies. Torch is seeded with
    ``spec["seed"]`` before the data set and again before the model, so the model's weights do
    not depend on how much randomness the data set's construction used.

    Args:
        spec: The resolved spec as plain data, with ``model``, ``data`` (``name``, ``args``,
            optionally ``collate`` or ``datamodule``; left out for a LightningModule's own
            data), ``loss``, optionally ``step``, ``optimizer`` (left out: a LightningModule's
            ``configure_optimizers()``, else ``DEFAULT_OPTIMIZER``) and ``seed``.
        source_dir: The spec's folder, where references to user code are looked up.

    Returns:
        The workload.

    Raises:
        WorkloadError: A part of the spec cannot be built as written. Exceptions raised
            inside user factories propagate unchanged.
    """
    from trainopt.trial import lightning_step as lit

    source_dir = Path(source_dir)
    seed = int(spec.get("seed", 0))
    model_name, model_args = _section(spec, "model")
    data = dict(spec.get("data") or {})
    data_name, data_args = data.get("name"), dict(data.get("args") or {})
    datamodule_ref = data.get("datamodule")
    loss_name = spec.get("loss", DEFAULT_LOSS)
    step_ref = spec.get("step")
    collate_ref = data.get("collate")
    if not isinstance(loss_name, str):
        raise WorkloadError(f"loss: expected a built-in loss name or a 'module:callable' reference, got {loss_name!r}")
    if step_ref is not None and loss_name != DEFAULT_LOSS:
        raise WorkloadError(
            f"step {step_ref!r}: step computes the loss itself, so loss {loss_name!r} would never be used; remove loss"
        )
    collate_fn = _user_function(collate_ref, source_dir, "data.collate", 1) if collate_ref is not None else None
    step_fn = _user_function(step_ref, source_dir, "step", 2) if step_ref is not None else None
    model_field = f"model.name {model_name!r}"

    model = None
    if is_reference(model_name):
        torch.manual_seed(seed)
        model = _model(model_name, model_args, source_dir, None, ())
    lightning = model is not None and lit.is_lightning_module(model)
    form = "step" if step_ref is not None else "model" if loss_name == MODEL_LOSS else "lightning" if lightning else "pair"
    if form == "lightning" and loss_name != DEFAULT_LOSS:
        raise WorkloadError(
            f"loss {loss_name!r}: {model_field} is a LightningModule whose training_step computes the loss, "
            f"so the loss would never be used; remove loss"
        )
    if form == "lightning":
        lit.prepare_module(model, model_field)
    elif lightning:
        # Trained by step: or loss: model, it still logs through self.log.
        lit.silence_log(model)

    torch.manual_seed(seed)
    own_batch = None
    if data_name is not None:
        dataset = _dataset(data_name, data_args, source_dir, pairs=form == "pair" and collate_fn is None)
        data_field = data_name
    elif lightning:
        source = model
        if datamodule_ref is not None:
            factory = resolve_reference(datamodule_ref, source_dir, field="data.datamodule")
            check_kwargs(factory, data_args, "data.args", repr(datamodule_ref))
            source = factory(**data_args)
            if not lit.is_datamodule(source):
                raise WorkloadError(
                    f"data.datamodule {datamodule_ref!r}: returned {type(source).__name__}, expected a LightningDataModule"
                )
        dataset, own_collate, own_batch = lit.loader_parts(source, f"data.datamodule {datamodule_ref!r}" if datamodule_ref else model_field)
        collate_fn = collate_fn or own_collate
        data_field = datamodule_ref or f"{model_name} train_dataloader()"
    else:
        what = "data.datamodule" if datamodule_ref else "data.name"
        raise WorkloadError(
            f"{what}: {'given' if datamodule_ref else 'left out'}, but {model_field} returned "
            f"{type(model).__name__}, not a LightningModule with its own data; set data.name to a data set factory"
        )
    sample = _sample_batch(dataset, collate_fn, data_field)
    if form == "pair" and (not isinstance(sample, (tuple, list)) or len(sample) != 2):
        raise WorkloadError(
            f"data.collate {collate_ref!r}: returns {describe(sample)}, but loss {loss_name!r} takes (input, target) "
            f"batches; return (input, target), or set loss: model or step: 'module:callable' for other batches"
        )
    if model is None:
        torch.manual_seed(seed)
        model = _model(model_name, model_args, source_dir, dataset, _sample_shape(dataset))
    optimizer = spec.get("optimizer")
    if optimizer is None and form == "lightning":
        optimizer_factory: Any = lit.lightning_optimizer_factory(model, model_field, len(dataset))
        step_fn = lit.training_step_loss(optimizer_factory.driver)
    else:
        opt_name, opt_args = _section({"optimizer": optimizer or DEFAULT_OPTIMIZER}, "optimizer")
        optimizer_factory = _optimizer_factory(opt_name, opt_args, source_dir)
        if form == "lightning":
            step_fn = lit.training_step_loss(None)
    return Workload(
        model=lit.TrainingStep(model) if form == "lightning" else model,
        dataset=dataset,
        loss_fn=_loss(loss_name, source_dir) if form == "pair" else None,
        optimizer_factory=optimizer_factory,
        image_like=has_image_tensor(sample),
        collate_fn=collate_fn,
        loss_form=form,
        step_fn=step_fn,
        sample_batch=sample,
        fields={"model.name": model_name, "data.name": data_field, "data.collate": collate_ref,
                "loss": loss_name, "step": step_ref, "data.batch_size": own_batch},
    )

