"""Property-based bad input: every malformed spec gets exit 2, one message, no traceback, no files."""

from __future__ import annotations

import copy
import string

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import tiny_spec_dict
from trainopt import cli
from trainopt.contract import spec as spec_mod

BASE = tiny_spec_dict(search={"batch_size": {"max": 64}, "amp": ["off", "bf16"], "num_workers": [0, 1]})

# Leaves of the spec with a value of the wrong type for each (never valid there).
WRONG_TYPE = {
    ("model", "name"): [123, ["mlp"], {"a": 1}, None],
    ("model", "args"): ["x", 5, [1]],
    ("data", "args"): ["x", 5],
    ("baseline", "batch_size"): ["64x", 1.5, [64], True, 0, -3, 10**12],
    ("baseline", "amp"): ["fp8", 1, ["bf16"], True],
    ("baseline", "num_workers"): [-1, "two", 2.5],
    ("baseline", "pin_memory"): ["yes please", 3, [True]],
    ("measure", "windows"): [0, -1, "many", 10**9, [3]],
    ("measure", "window_seconds"): [0, -0.5, "1s", 10**9],
    ("measure", "confidence"): [0, 1, 1.5, "high"],
    ("measure", "pairs"): [0, 2, "six", 10**6],
    ("limits", "memory_gb"): [0, -1, "4GB", 10**12],
    ("search", "amp"): [[], "bf16", [1], ["fp8"], {"a": 1}],
    ("search", "batch_size"): [5, "max", [1], {"max": -1}, {"max": "big"}, {"maxx": 1}],
    ("device",): ["tpu", 3, "cuda:x", ["cpu"]],
    ("loss",): ["hinge", 3, "no spaces: allowed"],
    ("run_length_steps",): [0, -5, "long", 10**15],
}

SECTIONS = [(), ("model",), ("data",), ("optimizer",), ("measure",), ("limits",), ("search", "batch_size")]
# Every field any section has (a key that is valid in one section is skipped everywhere).
KNOWN = {name for model in (spec_mod.Spec, spec_mod.ModelSection, spec_mod.DataSection, spec_mod.OptimizerSection,
                            spec_mod.MeasureSection, spec_mod.LimitsSection, spec_mod.DistributedSection,
                            spec_mod.BatchSearch)
         for field, info in model.model_fields.items() for name in (field, info.alias) if name}
identifiers = st.text(string.ascii_lowercase + "_", min_size=1, max_size=12).filter(lambda s: s not in KNOWN)


def _set(doc, path, value):
    target = doc
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value


@st.composite
def wrong_type_specs(draw):
    path = draw(st.sampled_from(sorted(WRONG_TYPE)))
    value = draw(st.sampled_from(WRONG_TYPE[path]))
    doc = copy.deepcopy(BASE)
    _set(doc, path, value)
    return yaml.safe_dump(doc), path[0]


@st.composite
def unknown_key_specs(draw):
    section = draw(st.sampled_from(SECTIONS))
    key = draw(identifiers)
    doc = copy.deepcopy(BASE)
    _set(doc, section + (key,), draw(st.one_of(st.integers(), st.text(max_size=5), st.none())))
    return yaml.safe_dump(doc), (section + (key,))[0]


broken_yaml = st.sampled_from(
    ["model: {name: mlp", "a: b: c", "- [", "model:\n  - x\n - y", "\tmodel: mlp", "{{{{", ": :", "key: 'unterminated"]
)
binary = st.binary(min_size=1, max_size=200).filter(lambda b: b"\x00" in b or not _utf8(b))
scalars = st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=30).map(repr), st.just("[]"), st.just("")).map(str)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _run(tmp_path_factory, capsys, payload) -> tuple[int, str, object]:
    folder = tmp_path_factory.mktemp("fuzz")
    path = folder / "spec.yaml"
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        path.write_text(payload)
    out = folder / "out"
    capsys.readouterr()
    code = cli.main(["search", str(path), "--out", str(out), "--quiet"])
    captured = capsys.readouterr()
    return code, captured.err, out


def _assert_clean(code, err, out, field=None):
    assert code == 2, err
    assert err.count("trainopt: error:") == 1, err
    assert "Traceback" not in err
    assert not out.exists(), "a bad spec must not create the output folder"
    if field:
        assert field in err, err


FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(wrong_type_specs())
def test_wrong_types_and_out_of_range_values(tmp_path_factory, capsys, case):
    text, field = case
    _assert_clean(*_run(tmp_path_factory, capsys, text), field=field)


@FUZZ
@given(unknown_key_specs())
def test_unknown_keys_at_every_level(tmp_path_factory, capsys, case):
    text, field = case
    code, err, out = _run(tmp_path_factory, capsys, text)
    _assert_clean(code, err, out, field=field)
    assert "unknown key" in err


@FUZZ
@given(st.one_of(broken_yaml, scalars))
def test_broken_yaml_and_documents_that_are_not_mappings(tmp_path_factory, capsys, text):
    _assert_clean(*_run(tmp_path_factory, capsys, text))


@FUZZ
@given(binary)
def test_binary_files(tmp_path_factory, capsys, data):
    _assert_clean(*_run(tmp_path_factory, capsys, data))


@FUZZ
@given(st.sampled_from(["batch_size", "amp", "num_workers", "pin_memory", "compile", "nope", ""]),
       st.sampled_from(["-1", "fp8", "2.5", "maybe", "[1, 2]", "{a: 1}", "", "10000000000000"]))
def test_set_overrides_are_validated_like_the_spec(tmp_path_factory, capsys, knob, value):
    folder = tmp_path_factory.mktemp("set")
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(BASE))
    out = folder / "out"
    capsys.readouterr()
    code = cli.main(["measure", str(path), "--out", str(out), "--set", f"{knob}={value}"])
    err = capsys.readouterr().err
    _assert_clean(code, err, out, field="--set")


def test_huge_document_is_answered_cleanly(tmp_path_factory, capsys):
    doc = copy.deepcopy(BASE)
    doc["model"]["args"] = {f"k{i}": i for i in range(20000)}
    doc["colour"] = "x" * 100000
    code, err, out = _run(tmp_path_factory, capsys, yaml.safe_dump(doc))
    _assert_clean(code, err, out, field="colour")
    assert len(err) < 2000, "the message must stay readable"


def test_deeply_nested_yaml(tmp_path_factory, capsys):
    _assert_clean(*_run(tmp_path_factory, capsys, "a: " + "[" * 5000 + "]" * 5000))
