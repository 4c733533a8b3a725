"""The bottleneck verdict, the knob order it sets, and what checkpoints and evaluation cost a run."""

from __future__ import annotations

import pytest

from tests.fakes import breakdown_of
from trainopt.decide import bottleneck, plan
from trainopt.decide.run_costs import BUDGET, advise, share_at, steps_for_budget
from trainopt.knobs import catalog

# One knob of every single-process stage, written out of the checklist's order (two in the
# input and host stages, to show that a stage keeps the order written).
SEARCH = {
    "compile": ["off", "default"],
    "pin_memory": [False, True],
    "sync_every": [1, 0],
    "amp": ["off", "bf16"],
    "cudnn_benchmark": [False, True],
    "num_workers": [0, 2],
    "batch_size": {"max": 256},
    "channels_last": [False, True],
    "optimizer_impl": ["default", "fused"],
}
CHECKLIST = ["batch_size", "amp", "channels_last", "pin_memory", "num_workers", "sync_every", "optimizer_impl",
             "cudnn_benchmark", "compile"]

ORDERS = {
    "input": ["pin_memory", "num_workers", "batch_size", "amp", "channels_last", "sync_every", "optimizer_impl",
              "cudnn_benchmark", "compile"],
    "sync": ["sync_every", "optimizer_impl", "compile", "batch_size", "amp", "channels_last", "pin_memory",
             "num_workers", "cudnn_benchmark"],
    "host": ["sync_every", "optimizer_impl", "compile", "batch_size", "amp", "channels_last", "pin_memory",
             "num_workers", "cudnn_benchmark"],
    "compute": CHECKLIST,
    "unknown": CHECKLIST,
}


def test_every_verdict_has_an_order_and_stages_that_exist():
    assert set(ORDERS) == set(bottleneck.VERDICTS) == set(bottleneck.FIRST_STAGES) == set(bottleneck.LABELS)
    assert all(set(stages) <= set(catalog.STAGES) for stages in bottleneck.FIRST_STAGES.values())
    assert [catalog.KNOBS[k].stage for k in CHECKLIST] == sorted(
        (catalog.KNOBS[k].stage for k in CHECKLIST), key=catalog.STAGES.index)


@pytest.mark.parametrize("verdict", list(ORDERS))
def test_the_verdict_s_stages_come_first_then_the_checklist(verdict):
    order = plan.knob_order(SEARCH, "guide", verdict)
    assert order == ORDERS[verdict]
    first = bottleneck.FIRST_STAGES[verdict]
    stages = [catalog.KNOBS[k].stage for k in order]
    # The verdict's stages lead, in the order FIRST_STAGES gives them.
    lead = [s for s in stages if s in first]
    assert stages[:len(lead)] == lead and list(dict.fromkeys(lead)) == [s for s in first if s in lead]
    # The rest keep the checklist's order.
    rest = stages[len(lead):]
    assert rest == sorted(rest, key=catalog.STAGES.index)


@pytest.mark.parametrize("verdict", list(ORDERS))
def test_as_written_ignores_the_verdict(verdict):
    assert plan.knob_order(SEARCH, "as_written", verdict) == list(SEARCH)


def test_an_unknown_verdict_keeps_the_checklist():
    assert plan.knob_order(SEARCH, "guide", "something-new") == CHECKLIST


def _phases(**shares):
    return breakdown_of(shares)


@pytest.mark.parametrize("breakdown, wait, verdict", [
    # The loader wait alone (no profiled window), each side of the threshold.
    (None, 0.40, "input"),
    (None, bottleneck.INPUT_BOUND_THRESHOLD, "compute"),
    (None, None, "unknown"),
    # A breakdown's own loader share decides over the timed windows' figure.
    (_phases(data_wait=0.30, forward=0.3, backward=0.3), 0.01, "input"),
    (_phases(data_wait=0.02, forward=0.3, backward=0.3), 0.40, "compute"),
    # Reading the loss on the host: sync-bound, unless the loader is the bigger problem.
    (_phases(data_wait=0.05, forward=0.3, backward=0.3, loss_read=0.25), 0.05, "sync"),
    (_phases(data_wait=0.30, forward=0.2, backward=0.2, loss_read=0.25), 0.05, "input"),
    # An idle GPU: the host is the limit; a busy one: compute.
    (breakdown_of({"forward": 0.4, "backward": 0.4}, device_type="cuda", device_busy=0.3), 0.0, "host"),
    (breakdown_of({"forward": 0.4, "backward": 0.4}, device_type="cuda", device_busy=0.9), 0.0, "compute"),
    (breakdown_of({"forward": 0.4, "backward": 0.4}, device_type="cuda", device_busy=bottleneck.HOST_BOUND_BUSY), 0.0,
     "compute"),
])
def test_each_verdict_from_the_figure_that_decides_it(breakdown, wait, verdict):
    d = bottleneck.diagnose(breakdown, wait)
    assert d["bottleneck"] == verdict
    assert set(d) == {"bottleneck", "reason", "text", "data_wait_fraction", "breakdown"}
    assert d["data_wait_fraction"] == wait and d["breakdown"] == breakdown
    assert d["reason"]
    if verdict != "unknown":
        assert d["text"].startswith(bottleneck.LABELS[verdict]) and d["reason"] in d["text"]


def test_the_reason_names_the_deciding_figure():
    assert "data_wait 45 %" in bottleneck.diagnose(_phases(data_wait=0.45, forward=0.3), None)["reason"]
    assert "loss_read 30 %" in bottleneck.diagnose(_phases(loss_read=0.3, forward=0.3), None)["reason"]
    host = breakdown_of({"forward": 0.4}, device_type="cuda", device_busy=0.35)
    assert "device busy 35 %" in bottleneck.diagnose(host, None)["reason"]


def test_shares_text_lists_the_phases_in_the_order_they_run():
    b = _phases(forward=0.4, data_wait=0.12, backward=0.3)
    text = bottleneck.shares_text(b)
    assert text.split(", ")[:3] == ["data_wait 12 %", "to_device 0 %", "forward 40 %"]
    assert text.endswith(f"other {100 * b['shares']['other']:.0f} %")
    assert bottleneck.shares_text(None) is None and bottleneck.shares_text({"shares": {}}) is None


# ---- run costs ---------------------------------------------------------------------------


@pytest.mark.parametrize("cost, step", [(2.0, 0.1), (30.0, 0.05), (0.01, 0.2), (5.0, 1.0)])
def test_the_frequency_for_the_budget_is_the_fewest_steps_that_keep_the_share_under_it(cost, step):
    n = steps_for_budget(cost, step)
    assert share_at(cost, n, step) <= BUDGET + 1e-12
    if n > 1:
        assert share_at(cost, n - 1, step) > BUDGET


def test_advice_per_measured_cost_and_none_without_a_measurement():
    spec = {"checkpoint_every_steps": 1000, "eval_every_steps": 100, "eval_batches": 20}
    advice = advise({"checkpoint_s": 1.0, "eval_s": 20.0, "eval_batches": 20}, spec, 0.05)
    assert advice["checkpoint"]["share"] == pytest.approx(share_at(1.0, 1000, 0.05))
    assert advice["checkpoint"]["within_budget"] is (advice["checkpoint"]["share"] <= BUDGET)
    assert advice["evaluation"]["within_budget"] is False and advice["evaluation"]["eval_batches"] == 20
    # Only what was measured and is scheduled is priced.
    only = advise({"checkpoint_s": 1.0}, spec, 0.05)
    assert "checkpoint" in only and "evaluation" not in only
    assert advise({"checkpoint_s": 1.0}, {"eval_every_steps": 100}, 0.05) is None
    assert advise(None, spec, 0.05) is None and advise({"checkpoint_s": 1.0}, None, 0.05) is None
    assert advise({"checkpoint_s": 1.0}, spec, None) is None
