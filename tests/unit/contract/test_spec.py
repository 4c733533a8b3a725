"""Spec validation: every error names the dotted field, the value and what is allowed."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import tiny_spec_dict
from trainopt.contract.spec import SpecError, load_spec, parse_set, spec_from_dict
from trainopt.knobs import catalog as knobs


def problems(data) -> list[str]:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, "s.yaml")
    return info.value.problems


def test_the_shipped_demo_spec_is_valid():
    from tests.conftest import ROOT

    spec = load_spec(ROOT / "configs" / "resnet.yaml")
    assert spec.name == "resnet18-cifar"
    assert list(spec.search)[:2] == ["batch_size", "amp"]


def test_defaults_are_filled_in_and_name_defaults_to_the_file_stem(tmp_path):
    path = tmp_path / "my-run.yaml"
    path.write_text("model: {name: mlp}\ndata: {name: synthetic-tabular}\n")
    spec = load_spec(path)
    assert spec.name == "my-run"
    assert spec.baseline == knobs.default_settings()
    assert spec.measure.pairs == 6 and spec.measure.confidence == 0.95
    assert spec.resolved()["optimizer"]["name"] == "sgd"


@pytest.mark.parametrize(
    "patch,expected",
    [
        ({"search": {"amp": ["fp8"]}}, "search.amp[0]: 'fp8' is not one of off, bf16, fp16"),
        ({"baseline": {"batch_size": -1}}, "baseline.batch_size: -1 is too small"),
        ({"baseline": {"batch_size": "big"}}, "baseline.batch_size: 'big' is not an integer"),
        ({"baseline": {"nope": 1}}, "baseline.nope: unknown knob"),
        ({"search": {"nope": [1]}}, "search.nope: unknown knob"),
        ({"search": {"num_workers": 2}}, "search.num_workers: got 2; expected a non-empty list"),
        ({"search": {"batch_size": {"max": 0}}}, "search.batch_size.max: got 0"),
        ({"search": {"batch_size": {"mx": 10}}}, "search.batch_size.mx: unknown key"),
        ({"measure": {"windows": 1}}, "measure.windows: got 1; input should be greater than or equal to 3"),
        ({"measure": {"confidence": 1.5}}, "measure.confidence: got 1.5"),
        ({"measure": {"pairs": 8, "max_pairs": 4}}, "measure.max_pairs: got 4; must be at least measure.pairs (8)"),
        ({"measure": {"extra": 1}}, "measure.extra: unknown key"),
        ({"limits": {"memory_gb": -2}}, "limits.memory_gb: got -2"),
        ({"device": "tpu"}, "device: got 'tpu'; 'tpu' is not one of auto, cpu, cuda, cuda:N"),
        ({"loss": "hinge"}, "loss: got 'hinge'; 'hinge' is not a built-in loss"),
        ({"model": {"name": "resnet18", "argz": {}}}, "model.argz: unknown key"),
        ({"colour": "blue"}, "colour: unknown key"),
        ({"run_length_steps": 0}, "run_length_steps: got 0"),
        ({"search": {"batch_size": {"max": 8}}}, "search.batch_size.max: got 8; must be at least baseline.batch_size (16)"),
    ],
)
def test_bad_fields_are_named_with_value_and_allowed(patch, expected):
    data = tiny_spec_dict()
    for key, value in patch.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    found = problems(data)
    assert any(p.startswith(expected) for p in found), found


def test_missing_sections_are_named():
    found = problems({"name": "x"})
    assert "model: required field is missing" in found
    assert "data: required field is missing" in found


def test_yaml_off_is_read_as_the_string_off():
    data = tiny_spec_dict(baseline={"amp": False, "compile": False}, search={"amp": [False, "bf16"]})
    spec = spec_from_dict(data)
    assert spec.baseline["amp"] == "off" and spec.search["amp"] == ["off", "bf16"]


def test_effective_batch_must_match_the_baseline():
    found = problems(tiny_spec_dict(limits={"effective_batch": 64}))
    assert found == [
        "baseline: batch_size 16 x grad_accum 1 = 16, but limits.effective_batch is 64; "
        "set baseline.grad_accum to 4 (= 64 / batch_size 16)"
    ]


def test_effective_batch_that_the_baseline_batch_cannot_divide_names_the_divisors():
    (found,) = problems(tiny_spec_dict(limits={"effective_batch": 20}, baseline={"batch_size": 16, "grad_accum": 1}))
    assert found.startswith("baseline: batch_size 16 x grad_accum 1 = 16, but limits.effective_batch is 20; ")
    assert found.endswith("batch_size 16 does not divide 20; use a batch_size that does (1, 2, 4, 5, 10, 20)")


def test_searched_grad_accum_must_keep_the_effective_batch():
    data = tiny_spec_dict(
        limits={"effective_batch": 64}, baseline={"batch_size": 16, "grad_accum": 4}, search={"grad_accum": [1, 2, 4]}
    )
    (found,) = problems(data)
    assert found.startswith("search.grad_accum: got [1, 2, 4]; with limits.effective_batch 64")
    assert "1, 2 would give batch_size 16 x grad_accum != 64" in found
    assert "remove search.grad_accum" in found


def test_searched_grad_accum_without_effective_batch_is_fine():
    spec = spec_from_dict(tiny_spec_dict(search={"grad_accum": [1, 2, 4]}), "s.yaml")
    assert spec.search["grad_accum"] == [1, 2, 4]


@pytest.mark.parametrize(
    "text,expected",
    [
        ("model: {name: mlp\n", "YAML syntax error at line 2, column 1"),
        ("", "the document is empty"),
        ("- a\n- b\n", "the document is list"),
        ("model: [unclosed", "YAML syntax error at line 1"),
    ],
)
def test_file_level_errors(tmp_path, text, expected):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert expected in info.value.render()


def test_missing_binary_and_folder_files(tmp_path):
    with pytest.raises(SpecError, match="file not found"):
        load_spec(tmp_path / "nope.yaml")
    (tmp_path / "bin.yaml").write_bytes(b"\xff\xfe\x00\x01")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(tmp_path / "bin.yaml")
    with pytest.raises(SpecError, match="is a folder"):
        load_spec(tmp_path)


def test_yaml_tags_are_not_executed(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("model: !!python/object/apply:os.system ['echo hacked']\ndata: {name: synthetic-tabular}\n")
    with pytest.raises(SpecError, match="YAML"):
        load_spec(path)


def test_set_overrides_get_the_same_validation():
    assert parse_set(["batch_size=64", "amp=bf16", "pin_memory=true", "compile=off", "threads=null"]) == {
        "batch_size": 64, "amp": "bf16", "pin_memory": True, "compile": "off", "threads": None,
    }
    for bad, expected in [
        ("amp=fp8", "--set amp: 'fp8' is not one of off, bf16, fp16"),
        ("batch_size=-1", "--set batch_size: -1 is too small"),
        ("nope=1", "--set nope: unknown knob"),
        ("batch_size", "expected knob=value"),
    ]:
        with pytest.raises(SpecError) as info:
            parse_set([bad])
        assert expected in info.value.render()


def test_fingerprint_changes_with_the_spec_and_resolved_round_trips():
    a = spec_from_dict(tiny_spec_dict())
    b = spec_from_dict(tiny_spec_dict(seed=3))
    assert a.fingerprint() != b.fingerprint()
    again = spec_from_dict(yaml.safe_load(yaml.safe_dump(a.resolved())))
    assert again.fingerprint() == a.fingerprint()
