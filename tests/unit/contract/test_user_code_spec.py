"""The spec's fields for the user's own training code: ``data.collate``, ``loss: model`` and ``step``."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURES, tiny_spec_dict
from trainopt.contract.reference import WorkloadError
from trainopt.contract.spec import SpecError, spec_from_dict
from trainopt.execute.refcheck import check_references, spec_references

CODE = f"{FIXTURES / 'user_code.py'}"


def problems(data) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, "s.yaml")
    return info.value.problems


def test_collate_loss_model_and_step_are_accepted_and_resolved():
    spec = spec_from_dict(tiny_spec_dict(
        data={"name": f"{CODE}:tokens", "collate": f"{CODE}:pad_collate"}, loss="model"))
    assert spec.data.collate == f"{CODE}:pad_collate" and spec.loss == "model" and spec.step is None
    resolved = spec.resolved()
    assert resolved["data"]["collate"] == f"{CODE}:pad_collate" and "step" not in resolved
    stepped = spec_from_dict(tiny_spec_dict(step=f"{CODE}:scene_step"))
    assert stepped.step == f"{CODE}:scene_step" and stepped.resolved()["step"] == f"{CODE}:scene_step"
    assert spec_from_dict(stepped.resolved()) == stepped


def test_a_spec_without_them_resolves_and_fingerprints_as_before():
    spec = spec_from_dict(tiny_spec_dict())
    resolved = spec.resolved()
    assert "step" not in resolved and "collate" not in resolved["data"]
    assert list(resolved["data"]) == ["name", "args"]
    with_none = spec_from_dict(tiny_spec_dict(step=None, data={"collate": None}))
    assert with_none.fingerprint() == spec.fingerprint()
    assert spec_from_dict(tiny_spec_dict(loss="model")).fingerprint() != spec.fingerprint()


@pytest.mark.parametrize(
    "patch, expected",
    [
        ({"step": "s.py:step", "loss": "mse"},
         "step: 's.py:step' computes the loss itself, so loss 'mse' would never be used; remove loss"),
        ({"step": "s.py:step", "loss": "model"}, "so loss 'model' would never be used"),
        ({"step": "train_step"}, "step: got 'train_step'; 'train_step' is not a 'module:callable' or 'path/file.py:callable' "
                                 "reference to a function step(model, batch) -> loss"),
        ({"data": {"collate": "pad"}}, "data.collate: got 'pad'; 'pad' is not a 'module:callable'"),
        ({"data": {"collate": 3}}, "data.collate: got 3"),
        ({"loss": "models"}, "loss: got 'models'; 'models' is not a built-in loss (cross_entropy, mse, model)"),
    ],
)
def test_mistakes_name_the_field_and_the_fix(patch, expected):
    found = problems(tiny_spec_dict(**patch))
    assert any(expected in p for p in found), found


def test_a_step_with_the_default_loss_written_out_is_fine():
    assert spec_from_dict(tiny_spec_dict(step="s.py:step", loss="cross_entropy")).step == "s.py:step"


def test_the_reference_check_covers_collate_and_step(tmp_path):
    spec = spec_from_dict(tiny_spec_dict(
        data={"name": f"{CODE}:tokens", "collate": f"{CODE}:pad_collate"}, step=f"{CODE}:scene_step"), "s.yaml", tmp_path)
    assert ("data.collate", f"{CODE}:pad_collate") in spec_references(spec)
    assert ("step", f"{CODE}:scene_step") in spec_references(spec)
    plain = spec_from_dict(tiny_spec_dict(loss="model"), "s.yaml", tmp_path)
    assert [field for field, _ in spec_references(plain)] == []


def test_a_bad_collate_or_step_reference_is_caught_in_the_child(tmp_path):
    (tmp_path / "code.py").write_text("def collate(items):\n    return items\n")
    spec = spec_from_dict(tiny_spec_dict(data={"collate": "code.py:colate"}, step="code.py:stepp"), "s.yaml", tmp_path)
    with pytest.raises(WorkloadError) as info:
        check_references(spec)
    text = str(info.value)
    assert text.startswith("data.collate 'code.py:colate': file 'code.py' has no attribute 'colate'")
    assert "\n  step 'code.py:stepp': file 'code.py' has no attribute 'stepp'" in text
