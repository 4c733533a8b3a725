"""The user's training code as it is: real tiny training in this process, every form and every clear error."""

from __future__ import annotations

import sys
from typing import Any

import pytest
import torch

from tests.conftest import ROOT
from tests.fixtures import user_code
from trainopt.contract.reference import WorkloadError
from trainopt.knobs.catalog import channels_last_reason, default_settings
from trainopt.trial.batches import loss_computer
from trainopt.trial.breakdown import profile_steps
from trainopt.trial.measure import Trainer, measure_throughput
from trainopt.trial.run_costs import time_evaluation
from trainopt.trial.workloads import build_workload

CPU = torch.device("cpu")
# Module references, so the classes a batch holds are the ones this test imports.
CODE = "tests.fixtures.user_code"


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    # Resolving a reference puts the fixtures' folder on sys.path; the threads knob sets torch's count.
    monkeypatch.setattr(sys, "path", list(sys.path))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def spec(model: str, data: str, model_args=None, data_args=None, collate=None, loss="cross_entropy", step=None) -> dict:
    out: dict[str, Any] = {
        "model": {"name": f"{CODE}:{model}", "args": model_args or {}},
        "data": {"name": f"{CODE}:{data}", "args": data_args or {}},
        "loss": loss,
        "optimizer": {"name": "adam", "args": {"lr": 0.01}},
        "seed": 0,
    }
    if collate:
        out["data"]["collate"] = f"{CODE}:{collate}"
    if step:
        out["step"] = f"{CODE}:{step}"
    return out


TEXT = spec("encoder", "tokens", collate="pad_collate", loss="model")
SCENES = spec("scene_net", "scenes", step="scene_step")


def trainer(s: dict, **settings) -> Trainer:
    workload = build_workload(s, ROOT)
    return Trainer(workload, {**default_settings(), "threads": 1, "batch_size": 8, **settings}, CPU)


def train(t: Trainer, steps: int = 12) -> list[float]:
    return [float(t.step()) for _ in range(steps)]


# ---- the forms ------------------------------------------------------------------------------------


def test_dict_batches_with_a_padding_collate_and_a_model_that_computes_its_own_loss():
    t = trainer(TEXT, num_workers=1, grad_accum=2)
    assert t.loader.collate_fn is user_code.pad_collate
    workload_batch = next(iter(t.loader))
    assert set(workload_batch) == {"input_ids", "attention_mask", "labels"}
    losses = train(t, 30)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < sum(losses[:5])  # it learns: the real loss, backpropagated
    assert t.optimizer_steps == 30


@pytest.mark.parametrize("output", ["object", "dict"])
def test_the_loss_is_read_from_an_object_or_a_dict_output(output):
    s = spec("encoder", "tokens", {"output": output}, collate="pad_collate_encoding", loss="model")
    assert all(torch.isfinite(torch.tensor(train(trainer(s), 3))))


def test_a_model_returning_logits_and_loss_trains_on_its_one_scalar_and_says_which_element():
    s = {"model": {"name": "examples/your_code_gpt.py:gpt", "args": {"n_layer": 1, "n_embd": 16}},
         "data": {"name": "examples/your_code_gpt.py:next_tokens", "args": {"size": 64}},
         "loss": "model", "optimizer": {"name": "adamw", "args": {"lr": 0.01}}, "seed": 0}
    t = trainer(s)
    losses = train(t, 20)
    assert sum(losses[-4:]) < sum(losses[:4])  # the loss the model computed, backpropagated: it learns
    assert t.compute_loss.note == (
        "loss 'model': the model's output is a tuple (a tensor of shape [8, 16, 64], a scalar tensor); "
        "element 1, its one scalar tensor, is the loss")
    x, y = t.loader.dataset[0]
    logits, loss = t.model(x[None], y[None])
    assert float(t.compute_loss(t.forward, (x[None], y[None])).detach()) == pytest.approx(float(loss.detach()))


@pytest.mark.parametrize(
    "output, start",
    [
        ((torch.zeros(2, 3), torch.tensor(1.0), torch.tensor(2.0)),
         "loss 'model': the model's output (a tuple of 3) holds 2 scalar tensors (elements 1, 2), so which is the loss is ambiguous"),
        ((torch.zeros(2, 3), None), "loss 'model': the model's output (a tuple of 2) carries no loss"),
    ],
    ids=["two scalars", "no scalar"],
)
def test_a_tuple_output_without_exactly_one_scalar_is_one_error_line(output, start):
    compute = loss_computer("model")
    with pytest.raises(WorkloadError) as info:
        compute(lambda x: output, torch.zeros(2))
    assert str(info.value).startswith(start) and "(logits, loss)" in str(info.value)


@pytest.mark.parametrize("on", [True, False])
def test_a_step_over_nested_dicts_gets_its_image_in_the_measured_memory_format(on):
    user_code.SEEN_CHANNELS_LAST.clear()
    s = spec("scene_net", "scenes", {"expect_channels_last": on}, step="scene_step")
    t = trainer(s, channels_last=on, amp="bf16")
    assert t.model.conv.weight.is_contiguous(memory_format=torch.channels_last) is on
    train(t, 4)
    assert user_code.SEEN_CHANNELS_LAST == [on] * 4


def test_a_namedtuple_batch_is_called_as_model_star_batch():
    workload = build_workload(spec("regressor", "samples", loss="model"), ROOT)
    assert type(workload.sample_batch) is user_code.Sample and not workload.image_like
    losses = train(Trainer(workload, {**default_settings(), "threads": 1, "batch_size": 8}, CPU), 80)
    assert sum(losses[-10:]) < sum(losses[:10])


def test_a_dataclass_batch_is_passed_whole_and_its_dict_output_read():
    s = spec("batch_regressor", "samples", collate="to_batch", loss="model")
    workload = build_workload(s, ROOT)
    assert type(workload.sample_batch) is user_code.Batch
    losses = train(Trainer(workload, {**default_settings(), "threads": 1, "batch_size": 8}, CPU), 80)
    assert sum(losses[-10:]) < sum(losses[:10])


def test_a_detection_model_returning_a_dict_of_losses_trains_on_their_sum():
    s = spec("detector", "boxes", collate="detection_collate", loss="model")
    t = trainer(s, channels_last=True)
    images, targets = t.applier.to_device(next(iter(t.loader)))
    assert images.is_contiguous(memory_format=torch.channels_last) and isinstance(targets, list)
    model = t.model
    batch = t.applier.to_device(next(iter(t.loader)))
    expected = sum(model(*batch).values())
    assert t.compute_loss(t.forward, batch).item() == pytest.approx(expected.item())
    assert all(torch.isfinite(torch.tensor(train(t, 3))))


def test_a_step_keeps_every_knob_trainopt_applies():
    t = trainer(SCENES, amp="fp16", grad_accum=2, sync_every=2)
    train(t, 3)
    assert t.optimizer_steps == 3 and t.applier.micro_steps == 6
    assert t.scaler is not None and t.scaler.get_scale() > 0


def test_the_timed_loop_the_breakdown_and_the_evaluation_take_dict_batches():
    t = trainer(TEXT)
    m = measure_throughput(t, warmup_steps=2, warmup_seconds=0.0, window_seconds=0.05, windows=3)
    assert m.samples_per_s > 0 and m.last_loss is not None
    b = profile_steps(t, 3)
    assert b["seconds"]["to_device"] > 0 and b["seconds"]["forward"] > 0
    assert time_evaluation(t, 2) > 0


# ---- channels_last: decided on a real batch -----------------------------------------------------


@pytest.mark.parametrize(
    "s, images",
    [(TEXT, False), (SCENES, True), (spec("detector", "boxes", collate="detection_collate", loss="model"), True),
     (spec("regressor", "samples", loss="model"), False)],
    ids=["tokens", "nested images", "detection", "namedtuple"],
)
def test_channels_last_applies_exactly_when_a_batch_holds_a_4d_floating_tensor(s, images):
    workload = build_workload(s, ROOT)
    assert workload.image_like is images
    reason = channels_last_reason({"channels_last": True}, workload.image_like)
    assert (reason is None) is images
    if not images:
        assert reason.startswith("channels_last needs a 4-D floating tensor")


def test_the_builtin_data_sets_decide_as_before():
    base = {"optimizer": {"name": "sgd", "args": {"lr": 0.1}}, "loss": "cross_entropy", "seed": 0}
    images = {**base, "model": {"name": "resnet18", "args": {"width": 4}},
              "data": {"name": "synthetic-images", "args": {"size": 8, "shape": [3, 16, 16]}}}
    tokens = {**base, "model": {"name": "gpt", "args": {"n_layer": 1, "n_head": 2, "n_embd": 16}},
              "data": {"name": "synthetic-tokens", "args": {"size": 8, "seq_len": 8, "vocab_size": 32}}}
    assert build_workload(images, ROOT).image_like
    assert not build_workload(tokens, ROOT).image_like


# ---- what does not fit: one line naming the field and the fix ---------------------------------------


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_a_model_whose_output_has_no_loss():
    t = trainer(spec("encoder", "tokens", collate="pad_collate_unlabelled", loss="model"))
    with pytest.raises(WorkloadError) as info:
        t.step()
    text = one_line(info)
    assert text.startswith("loss 'model': the model's output (a ClassifierOutput dataclass) carries no loss; make forward return")


def test_a_model_that_returns_logits_under_loss_model():
    t = trainer(spec("encoder", "tokens", {"output": "logits"}, collate="pad_collate", loss="model"))
    with pytest.raises(WorkloadError) as info:
        t.step()
    assert one_line(info).startswith("loss 'model': the model's output is a tensor of shape [8, 3], not a scalar loss")


def test_a_step_that_returns_no_loss():
    t = trainer(spec("scene_net", "scenes", step="logits_step"))
    with pytest.raises(WorkloadError) as info:
        t.step()
    assert one_line(info).startswith(f"step '{CODE}:logits_step': what it returned (a dict with keys logits) carries no loss")


def test_a_batch_the_model_cannot_be_called_with():
    t = trainer(spec("encoder", "tokens", collate="pad_collate_mask", loss="model"))
    with pytest.raises(WorkloadError) as info:
        t.step()
    text = one_line(info)
    assert "model(**batch) with a dict with keys input_ids, mask, labels" in text
    assert "(input_ids, attention_mask, labels)" in text


def test_items_that_cannot_be_pickled_are_refused_before_workers_start():
    s = spec("locked_regressor", "locked", collate="keep_lock", loss="model")
    assert train(trainer(s), 2)  # in-process loading needs no pickling
    with pytest.raises(WorkloadError) as info:
        trainer(s, num_workers=2)
    text = one_line(info)
    assert text.startswith(f"data.collate '{CODE}:keep_lock': a batch cannot be pickled (TypeError: cannot pickle")
    assert "num_workers 2" in text


@pytest.mark.parametrize(
    "s, text",
    [
        (spec("encoder", "tokens", loss="model"),
         f"data.name '{CODE}:tokens': PyTorch's default collate cannot batch its items"),
        (spec("encoder", "tokens", collate="pad_collate"),
         f"data.collate '{CODE}:pad_collate': returns a dict with keys input_ids, attention_mask, labels, "
         f"but loss 'cross_entropy' takes (input, target) batches"),
        (spec("encoder", "tokens", collate="pad_collate", step="scene_step", loss="mse"),
         f"step '{CODE}:scene_step': step computes the loss itself"),
        (spec("encoder", "tokens", collate="no_arguments", loss="model"),
         f"data.collate: '{CODE}:no_arguments' must take 1 positional argument(s) first"),
        (spec("scene_net", "scenes", step="pad_collate"), f"step: '{CODE}:pad_collate' must take 2 positional argument(s) first"),
        (spec("encoder", "tokens", collate="nope", loss="model"), f"data.collate '{CODE}:nope': module '{CODE}' has no attribute 'nope'"),
    ],
    ids=["unequal items, no collate", "pairs from a dict collate", "step and loss", "collate signature",
         "step signature", "missing collate"],
)
def test_spec_mistakes_are_caught_while_building(s, text):
    with pytest.raises(WorkloadError) as info:
        build_workload(s, ROOT)
    assert text in one_line(info)


def test_a_pair_data_set_with_a_collate_that_returns_pairs_keeps_the_pair_form():
    s = spec("regressor", "samples", collate="to_batch")
    s["model"] = {"name": "mlp", "args": {"hidden": 8, "layers": 1}}
    with pytest.raises(WorkloadError, match="returns a Batch dataclass, but loss 'cross_entropy'"):
        build_workload(s, ROOT)
