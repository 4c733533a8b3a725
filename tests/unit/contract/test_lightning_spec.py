"""A spec may leave ``optimizer`` and ``data`` to a LightningModule; what stays an error is named."""

from __future__ import annotations

import pytest

from trainopt.contract.spec import DEFAULT_OPTIMIZER, SpecError, spec_from_dict
from trainopt.execute.refcheck import spec_references

MODEL = {"name": "lit.py:classifier", "args": {"dim": 8}}


def problems(data) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, "s.yaml")
    return info.value.problems


def test_a_referenced_model_may_leave_out_optimizer_and_data():
    spec = spec_from_dict({"name": "lit", "model": MODEL})
    resolved = spec.resolved()
    assert "optimizer" not in resolved and "data" not in resolved
    assert spec_from_dict(resolved) == spec
    assert spec_references(spec) == [("model.name", "lit.py:classifier")]


def test_leaving_out_the_optimizer_fingerprints_as_the_default_it_was():
    left_out = spec_from_dict({"name": "lit", "model": MODEL})
    written = spec_from_dict({"name": "lit", "model": MODEL, "optimizer": DEFAULT_OPTIMIZER})
    assert left_out.fingerprint() == written.fingerprint()
    assert written.resolved()["optimizer"] == DEFAULT_OPTIMIZER
    other = spec_from_dict({"name": "lit", "model": MODEL, "optimizer": {"name": "adam"}})
    assert other.fingerprint() != left_out.fingerprint()


def test_a_built_in_model_still_shows_the_default_optimizer():
    spec = spec_from_dict({"name": "m", "model": {"name": "mlp"}, "data": {"name": "synthetic-tabular"}})
    assert spec.resolved()["optimizer"] == DEFAULT_OPTIMIZER


def test_a_datamodule_resolves_in_place_of_the_data_set():
    spec = spec_from_dict({"name": "lit", "model": MODEL, "data": {"datamodule": "lit.py:data", "args": {"size": 64}}})
    assert spec.resolved()["data"] == {"args": {"size": 64}, "datamodule": "lit.py:data"}


@pytest.mark.parametrize(
    "body, expected",
    [
        ({"model": {"name": "mlp"}}, "data: required field is missing"),
        ({"model": {"name": "mlp"}, "data": {"collate": "c.py:pad"}}, "data.name: required field is missing; model 'mlp'"),
        ({"model": MODEL, "data": {"name": "d.py:data", "datamodule": "lit.py:data"}}, "data: got both name 'd.py:data'"),
        ({"model": MODEL, "data": {"args": {"size": 3}}}, "data.args: given without data.name or data.datamodule"),
        ({"model": MODEL, "data": {"datamodule": "TokenData"}}, "data.datamodule: got 'TokenData'; 'TokenData' is not a"),
        ({"model": MODEL, "optimizer": {"args": {"lr": 0.1}}}, "optimizer.name: required field is missing"),
    ],
)
def test_what_cannot_be_left_out_is_named(body, expected):
    found = problems({"name": "x", **body})
    assert any(p.startswith(expected) for p in found), found
