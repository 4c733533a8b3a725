"""A spec's references are checked in a child process, never in the orchestrator's.

(That the orchestrator's modules never import torch is checked in ``tests/unit/test_layers.py``.)
"""

from __future__ import annotations

import pytest

from tests.conftest import tiny_spec_dict
from trainopt.contract.reference import WorkloadError, resolve_reference
from trainopt.contract.spec import spec_from_dict
from trainopt.execute.refcheck import check_references, spec_references


def _spec(tmp_path, **parts):
    return spec_from_dict(tiny_spec_dict(**parts), "s.yaml", tmp_path)


BAD = {
    "missing module": ("model", "no_such_module_xyz:make"),
    "missing attribute": ("model", "factories.py:nope"),
    "missing file": ("data", "nope/data.py:make"),
    "not callable": ("model", "factories.py:VALUE"),
    "error at import": ("model", "broken.py:make"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_the_child_check_gives_the_same_message_as_resolving_in_process(tmp_path, case):
    (tmp_path / "factories.py").write_text("VALUE = 3\ndef make():\n    return 1\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('broken at import')\n")
    section, ref = BAD[case]
    spec = _spec(tmp_path, **{section: {"name": ref, "args": {}}})
    field = f"{section}.name"
    with pytest.raises(WorkloadError) as in_process:
        resolve_reference(ref, tmp_path, field=field)
    with pytest.raises(WorkloadError) as child:
        check_references(spec)
    first_line = str(child.value).split("\n")[0]
    assert first_line == str(in_process.value)
    if case == "error at import":
        log = str(child.value).split("tracebacks: ")[1]
        assert "RuntimeError: broken at import" in open(log).read()


def test_every_bad_reference_is_named_once(tmp_path):
    spec = _spec(tmp_path, model={"name": "nomod_a:make"}, loss="nomod_b:loss")
    with pytest.raises(WorkloadError) as info:
        check_references(spec)
    text = str(info.value)
    assert text.startswith("model.name 'nomod_a:make': module 'nomod_a' could not be imported")
    assert "\n  loss 'nomod_b:loss': module 'nomod_b' could not be imported" in text


def test_a_spec_without_references_starts_no_child(tmp_path, monkeypatch):
    import trainopt.execute.runner

    monkeypatch.setattr(trainopt.execute.runner, "run_child", lambda *a, **k: pytest.fail("a child was started"))
    spec = _spec(tmp_path)
    assert spec_references(spec) == []
    check_references(spec)


def test_a_reference_whose_import_hangs_is_stopped(tmp_path):
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(60)\ndef make():\n    return 1\n")
    spec = _spec(tmp_path, model={"name": "slow.py:make"})
    with pytest.raises(WorkloadError, match=r"did not finish within 2 s \(model.name 'slow.py:make'\)"):
        check_references(spec, timeout_s=2)
