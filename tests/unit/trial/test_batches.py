"""Batches of any structure: moved whole, searched for images, fed to the model, read for the loss."""

from __future__ import annotations

from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from types import MappingProxyType

import pytest
import torch
from torch import nn

from tests.fixtures.user_code import ClassifierOutput, Encoding
from trainopt.contract.reference import WorkloadError
from trainopt.knobs.catalog import default_settings
from trainopt.trial.applier import Applier
from trainopt.trial.batches import (
    call_model,
    check_worker_batches,
    describe,
    has_image_tensor,
    loss_computer,
    move,
    read_loss,
    tensors,
)

CPU = torch.device("cpu")
Pair = namedtuple("Pair", ["image", "label"])


@dataclass
class Frame:
    image: torch.Tensor
    tokens: torch.Tensor
    name: str = "frame"


def image() -> torch.Tensor:
    return torch.randn(2, 3, 4, 4)


def channels_last(t: torch.Tensor) -> bool:
    return t.is_contiguous(memory_format=torch.channels_last)


def test_a_tensor_moves_and_only_4d_floating_tensors_become_channels_last():
    assert channels_last(move(image(), CPU, False, True))
    assert not channels_last(move(image(), CPU, False, False))
    ints = move(torch.zeros(2, 3, 4, 4, dtype=torch.long), CPU, False, True)
    assert not channels_last(ints) and ints.is_contiguous()
    flat = move(torch.randn(2, 5), CPU, False, True)
    assert flat.is_contiguous()


@pytest.mark.parametrize(
    "batch, check",
    [
        ([image(), torch.tensor([0, 1])], lambda b: type(b) is list and channels_last(b[0])),
        ((image(), torch.tensor([0, 1])), lambda b: type(b) is tuple and channels_last(b[0])),
        (Pair(image(), torch.tensor([0, 1])), lambda b: type(b) is Pair and channels_last(b.image)),
        ({"pixels": image(), "ids": torch.ones(2, 3)}, lambda b: type(b) is dict and channels_last(b["pixels"])),
        (OrderedDict(pixels=image()), lambda b: type(b) is OrderedDict and channels_last(b["pixels"])),
        (MappingProxyType({"pixels": image()}), lambda b: channels_last(b["pixels"])),
        (Frame(image(), torch.ones(2, 3)), lambda b: type(b) is Frame and channels_last(b.image) and b.name == "frame"),
        (
            {"scene": {"views": [image(), image()], "meta": ("a", 3)}, "label": torch.tensor([1, 0])},
            lambda b: all(channels_last(v) for v in b["scene"]["views"]) and b["scene"]["meta"] == ("a", 3),
        ),
    ],
    ids=["list", "tuple", "namedtuple", "dict", "ordereddict", "read-only mapping", "dataclass", "nested"],
)
def test_every_structure_keeps_its_types_and_gets_the_memory_format(batch, check):
    moved = Applier({**default_settings(), "channels_last": True}, CPU).to_device(batch)
    assert check(moved)


def test_a_mapping_with_more_than_its_items_keeps_them_and_the_original_is_left_alone():
    enc = Encoding({"pixels": image(), "ids": torch.ones(2, 3)}, n_sequences=2)
    moved = move(enc, CPU, False, True)
    assert type(moved) is Encoding and moved.n_sequences == 2 and moved is not enc
    assert channels_last(moved["pixels"]) and not channels_last(enc["pixels"])


def test_two_arguments_still_move_as_a_pair():
    a = Applier({**default_settings(), "channels_last": True}, CPU)
    x, y = a.to_device(image(), torch.tensor([0, 1]))
    assert channels_last(x) and y.tolist() == [0, 1]


def test_tensors_and_images_are_found_at_any_depth():
    batch = {"a": [torch.ones(1), {"b": Frame(image(), torch.ones(2, 2))}], "c": "text"}
    assert len(list(tensors(batch))) == 3
    assert has_image_tensor(batch)
    assert not has_image_tensor({"ids": torch.ones(2, 8, dtype=torch.long), "mask": torch.ones(2, 8)})
    assert not has_image_tensor({"video": torch.zeros(2, 3, 4, 4, 4)})
    assert not has_image_tensor([torch.zeros(2, 3, 4, 4, dtype=torch.uint8)])


def test_describe_names_the_structure():
    assert describe(torch.zeros(4, 3)) == "a tensor of shape [4, 3]"
    assert describe({"input_ids": 1, "mask": 2}) == "a dict with keys input_ids, mask"
    assert describe((1, 2, 3)) == "a tuple of 3"
    assert describe(Frame(image(), image())) == "a Frame dataclass"
    assert describe(None) == "None"


# ---- the model's call and the loss --------------------------------------------------------------


class Takes(nn.Module):
    def forward(self, input_ids, labels=None):
        return input_ids.float().sum() if labels is None else (input_ids.float() - labels).sum()


class Single(nn.Module):
    def forward(self, batch):
        return batch.sum()


def test_a_mapping_is_unpacked_as_keywords_a_tuple_as_arguments_anything_else_passed_whole():
    ids = torch.ones(2, 3)
    assert call_model(Takes(), {"input_ids": ids, "labels": torch.ones(2, 3)}).item() == 0
    assert call_model(Takes(), (ids, torch.ones(2, 3))).item() == 0
    assert call_model(Takes(), [ids]).item() == 6
    assert call_model(Single(), ids).item() == 6


def test_a_batch_that_does_not_fit_forward_names_the_field_keys_and_parameters():
    with pytest.raises(WorkloadError) as info:
        call_model(Takes(), {"input_ids": torch.ones(2), "mask": torch.ones(2)})
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("loss 'model': the model cannot be called as model(**batch) with a dict with keys input_ids, mask")
    assert "unexpected keyword argument 'mask'" in text and "(input_ids, labels)" in text and "step:" in text


def test_a_type_error_inside_the_model_stays_the_models_own():
    class Broken(nn.Module):
        def forward(self, x):
            return x + "text"

    with pytest.raises(TypeError) as info:
        call_model(Broken(), torch.ones(2))
    assert not isinstance(info.value, WorkloadError)


class TwoInputs(nn.Module):
    def forward(self, x, mask):
        return x * mask


def test_the_pair_form_names_a_model_that_takes_more_than_the_input():
    compute = loss_computer("pair", loss_fn=lambda out, y: out.sum(), fields={"model.name": "m.py:net"})
    assert compute(Single(), (torch.ones(2), torch.ones(2))).item() == 2
    with pytest.raises(WorkloadError, match=r"^model.name 'm.py:net': the model cannot be called as model\(input\)"):
        compute(TwoInputs(), (torch.ones(2), torch.ones(2)))


@pytest.mark.parametrize(
    "output, expected",
    [
        (torch.tensor(2.0), 2.0),
        (torch.tensor([3.0]), 3.0),
        (ClassifierOutput(torch.tensor(1.5), torch.zeros(2, 3)), 1.5),
        ({"loss": torch.tensor(0.5), "logits": torch.zeros(2, 3)}, 0.5),
        ({"loss_classifier": torch.tensor(1.0), "loss_box_reg": torch.tensor(0.25)}, 1.25),
    ],
    ids=["scalar", "one element", ".loss", "['loss']", "dict of losses"],
)
def test_the_loss_is_read_from_every_documented_output(output, expected):
    assert read_loss(output, "loss 'model'", "the model's output", "fix it").item() == pytest.approx(expected)


@pytest.mark.parametrize(
    "output, text",
    [
        (torch.zeros(4, 3), "the model's output is a tensor of shape [4, 3], not a scalar loss; fix it"),
        (ClassifierOutput(None, torch.zeros(2, 3)), "the model's output (a ClassifierOutput dataclass) carries no loss; fix it"),
        ({"logits": torch.zeros(2, 3)}, "the model's output (a dict with keys logits) carries no loss; fix it"),
        ({"loss": torch.zeros(2)}, "the loss in the model's output is a tensor of shape [2], not a scalar tensor"),
        (None, "the model's output (None) carries no loss"),
        ({}, "(an empty dict) carries no loss"),
    ],
)
def test_an_output_without_a_loss_is_one_line_naming_the_field(output, text):
    with pytest.raises(WorkloadError) as info:
        read_loss(output, "loss 'model'", "the model's output", "fix it")
    assert str(info.value).startswith("loss 'model': ") and text in str(info.value)
    assert "\n" not in str(info.value)


def test_the_step_form_reads_what_step_returns_and_names_the_step():
    compute = loss_computer("step", step_fn=lambda model, batch: {"loss": model(batch)}, fields={"step": "s.py:step"})
    assert compute(Single(), torch.ones(3)).item() == 3
    silent = loss_computer("step", step_fn=lambda model, batch: None, fields={"step": "s.py:step"})
    with pytest.raises(WorkloadError, match=r"^step 's.py:step': what it returned \(None\) carries no loss; return the loss"):
        silent(Single(), torch.ones(3))


def test_unknown_or_incomplete_forms_are_refused():
    with pytest.raises(ValueError):
        loss_computer("pairs")
    with pytest.raises(ValueError):
        loss_computer("step")


# ---- loader workers ----------------------------------------------------------------------------


def test_a_batch_that_cannot_be_pickled_is_refused_only_with_workers():
    import threading

    batch = {"x": torch.ones(2), "lock": threading.Lock()}
    check_worker_batches(batch, None, None, 0, "data.name 'd'")
    with pytest.raises(WorkloadError) as info:
        check_worker_batches(batch, None, None, 2, "data.name 'd'")
    text = str(info.value)
    assert text.startswith("data.name 'd': a batch cannot be pickled (TypeError: cannot pickle '_thread.lock' object)")
    assert "num_workers 2" in text and "set num_workers to 0" in text and "\n" not in text
    check_worker_batches({"x": torch.ones(2), "name": "ok"}, None, None, 2, "data.name 'd'")


def test_spawned_workers_also_need_the_data_set_and_collate_pickled(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing, "get_start_method", lambda *a, **k: "spawn")
    with pytest.raises(WorkloadError, match="data.collate cannot be pickled"):
        check_worker_batches(torch.ones(2), [1, 2], lambda items: items, 1, "data.collate 'c'")
