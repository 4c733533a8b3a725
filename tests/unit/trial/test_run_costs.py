"""One checkpoint save and one evaluation pass, timed on a real tiny trainer."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.fixtures import planted_phases as planted
from trainopt.knobs.catalog import default_settings
from trainopt.trial.measure import Trainer
from trainopt.trial.run_costs import run_costs_or_none, time_checkpoint, time_evaluation
from trainopt.trial.workloads import Workload, cross_entropy


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


class Recording(nn.Module):
    """A linear model that records, per call, whether it trained and whether autograd was on."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 4)
        self.calls: list[tuple[bool, bool]] = []

    def forward(self, x):
        self.calls.append((self.training, torch.is_grad_enabled()))
        return self.fc(x)


def trainer(model=None, **settings) -> Trainer:
    workload = Workload(model or Recording(), planted.fast_data(), cross_entropy,
                        lambda params, impl: torch.optim.SGD(params, lr=0.01, momentum=0.9), False)
    t = Trainer(workload, {**default_settings(), "threads": 1, "batch_size": 16, **settings}, torch.device("cpu"))
    for _ in range(2):
        t.step()  # momentum buffers exist, as in a checkpoint taken mid-run
    return t


def test_a_checkpoint_is_timed_and_leaves_no_file(tmp_path):
    t = trainer()
    (tmp_path / "result.json").write_text("{}")
    seconds = time_checkpoint(t, tmp_path)
    assert seconds > 0
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


def test_the_checkpoint_holds_model_and_optimizer_state(tmp_path, monkeypatch):
    saved = {}
    real_save = torch.save

    def spy(obj, f, *args, **kwargs):
        saved.update(obj)
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", spy)
    t = trainer()
    time_checkpoint(t, tmp_path)
    assert set(saved["model"]) == set(t.model.state_dict())
    assert saved["optimizer"]["state"], "the momentum buffers are saved"


def test_evaluation_runs_without_grad_in_eval_mode_and_returns_to_training():
    model = Recording()
    t = trainer(model)
    before = [p.detach().clone() for p in model.parameters()]
    model.calls.clear()
    seconds = time_evaluation(t, 5)
    assert seconds > 0
    # One untimed batch, then five timed ones: all in eval mode, autograd off.
    assert model.calls == [(False, False)] * 6
    assert model.training
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    t.step()
    assert model.calls[-1] == (True, True)


def test_evaluation_time_grows_with_its_batches():
    # A data set that sleeps per item makes each batch's cost known: 16 items x 2 ms.
    workload = Workload(planted.small_model(), planted.slow_data(delay_s=0.002), cross_entropy,
                        lambda params, impl: torch.optim.SGD(params, lr=0.01), False)
    t = Trainer(workload, {**default_settings(), "threads": 1, "batch_size": 16}, torch.device("cpu"))
    assert time_evaluation(t, 4) >= 4 * 16 * 0.002
    assert time_evaluation(t, 1) < 4 * 16 * 0.002


def test_only_the_costs_the_spec_asks_for(tmp_path):
    t = trainer()
    assert run_costs_or_none(t, None, tmp_path) is None
    assert run_costs_or_none(t, {"checkpoint_every_steps": None, "eval_every_steps": None, "eval_batches": 3}, tmp_path) is None
    only_checkpoint = run_costs_or_none(t, {"checkpoint_every_steps": 100, "eval_every_steps": None, "eval_batches": 3}, tmp_path)
    assert set(only_checkpoint) == {"checkpoint_s"} and only_checkpoint["checkpoint_s"] > 0
    only_eval = run_costs_or_none(t, {"checkpoint_every_steps": None, "eval_every_steps": 50, "eval_batches": 3}, tmp_path)
    assert set(only_eval) == {"eval_s", "eval_batches"} and only_eval["eval_batches"] == 3 and only_eval["eval_s"] > 0
    both = run_costs_or_none(t, {"checkpoint_every_steps": 100, "eval_every_steps": 50, "eval_batches": 2}, tmp_path)
    assert set(both) == {"checkpoint_s", "eval_s", "eval_batches"}
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_failure_gives_none_and_says_why(tmp_path, capsys):
    t = trainer()
    missing = tmp_path / "gone"
    assert run_costs_or_none(t, {"checkpoint_every_steps": 10, "eval_every_steps": None}, missing) is None
    assert "no run costs" in capsys.readouterr().err
