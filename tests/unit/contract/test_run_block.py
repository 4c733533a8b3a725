"""The spec's run block, the deprecated run_length_steps, and durations."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_spec_dict
from trainopt.contract.run_block import parse_duration
from trainopt.contract.spec import SpecError, spec_from_dict


@pytest.mark.parametrize("text, seconds", [("20m", 1200), ("1h30m", 5400), ("90s", 90), ("1.5h", 5400), (45, 45),
                                           ("600", 600), (" 2h ", 7200)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["20x", "", "m", "-5m", 0, -1, True, [1], "1h 2q", 10**9])
def test_bad_durations_say_what_is_allowed(bad):
    with pytest.raises(ValueError, match="duration|more than 0"):
        parse_duration(bad)


def test_a_run_block_and_a_time_budget_are_read_and_resolved():
    spec = spec_from_dict(tiny_spec_dict(run={"hours": 12, "device_hour_cost": 2.5, "currency": "USD"},
                                         measure={"time_budget": "20m"}))
    assert spec.measure.time_budget == 1200 and spec.run_plan.hours == 12 and spec.notes == []
    resolved = spec.resolved()
    assert resolved["run"] == {"hours": 12.0, "device_hour_cost": 2.5, "currency": "USD"}
    assert resolved["measure"]["time_budget"] == 1200
    assert spec_from_dict(resolved).resolved() == resolved


def test_the_budget_does_not_change_the_fingerprint_and_a_spec_without_a_run_hashes_as_before():
    plain = spec_from_dict(tiny_spec_dict())
    assert "run" not in plain.resolved() and "time_budget" not in plain.resolved()["measure"]
    assert spec_from_dict(tiny_spec_dict(measure={"time_budget": 60})).fingerprint() == plain.fingerprint()
    assert spec_from_dict(tiny_spec_dict(run_length_steps=100_000)).fingerprint() == plain.fingerprint()
    assert spec_from_dict(tiny_spec_dict(run={"steps": 5})).fingerprint() != plain.fingerprint()


def test_run_length_steps_is_still_valid_with_a_note():
    spec = spec_from_dict(tiny_spec_dict(run_length_steps=5000))
    assert spec.run_plan.steps == 5000 and spec.run is None
    assert spec.notes == ["run_length_steps is deprecated; write run: {steps: 5000} instead (the same run length; "
                          "a run block can also give device_hour_cost to price the time saved)"]


@pytest.mark.parametrize("overrides, message", [
    ({"run": {"steps": 3, "hours": 2}}, "run: give exactly one of steps, epochs, hours (got steps and hours)"),
    ({"run": {"device_hour_cost": 2}}, "run: give exactly one of steps, epochs, hours (got none)"),
    ({"run": {"steps": 3}, "run_length_steps": 4}, "run_length_steps: got 4 beside a run block"),
    ({"run": {"steps": 3, "currency": "EUR"}}, "run.currency: got 'EUR' without run.device_hour_cost"),
    ({"run": {"stepz": 3}}, "run.stepz: unknown key"),
    ({"run": {"steps": 0}}, "run.steps: got 0"),
    ({"run": {"hours": 1, "device_hour_cost": -1}}, "run.device_hour_cost: got -1"),
    ({"measure": {"time_budget": "soon"}}, "measure.time_budget: got 'soon'; expected a duration"),
])
def test_bad_run_blocks_name_the_field(overrides, message):
    with pytest.raises(SpecError) as err:
        spec_from_dict(tiny_spec_dict(**overrides))
    assert message in err.value.render()
