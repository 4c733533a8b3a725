"""A spec's references are checked in a child process, never in the orchestrator's.

(That the orchestrator's modules never import torch is checked in ``tests/unit/test_layers.py``.)
"""

from __future__ import annotations

import pytest

from tests.conftest import tiny_spec_dict
from trainopt.contract.reference import WorkloadError, resolve_reference
from trainopt.contract.spec import spec_from_dict
from trainopt.execute.refcheck import check_references, spec_factories, spec_references


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


def test_a_spec_without_references_or_builtin_arguments_starts_no_child(tmp_path, monkeypatch):
    import trainopt.execute.runner

    monkeypatch.setattr(trainopt.execute.runner, "run_child", lambda *a, **k: pytest.fail("a child was started"))
    spec = _spec(tmp_path, model={"name": "mlp", "args": {}}, data={"name": "synthetic-tabular", "args": {}},
                 optimizer={"name": "sgd", "args": {}})
    assert spec_references(spec) == [] and spec_factories(spec) == []
    check_references(spec)


FACTORIES = """
import torch

class Config:
    def __init__(self, n_layer=1, n_head=1):
        self.n_layer, self.n_head = n_layer, n_head

class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()

    @classmethod
    def from_sizes(cls, n_layer=1, n_head=1):
        return cls(Config(n_layer, n_head))

def build(n_layer=1, n_head=1):
    return GPT(Config(n_layer, n_head))

def make_optimizer(params, lr=0.1):
    return torch.optim.SGD(params, lr=lr)

def collate(items, pad=0):
    return items

def step(model):
    return 0
"""


@pytest.mark.parametrize(
    "parts, message",
    [
        ({"model": {"name": "gpt_code.py:GPT", "args": {"n_layer": 2, "n_head": 2}}},
         "model.args: unknown key(s) 'n_layer', 'n_head' for 'gpt_code.py:GPT'; allowed: config (it takes a config object"),
        ({"model": {"name": "gpt_code.py:build", "args": {"n_layers": 2}}},
         "model.args: unknown key(s) 'n_layers' for 'gpt_code.py:build'; allowed: n_layer, n_head (did you mean 'n_layers' -> 'n_layer'?)"),
        ({"model": {"name": "gpt_code.py:GPT.from_sizes", "args": {"n_heads": 2}}},
         "model.args: unknown key(s) 'n_heads' for 'gpt_code.py:GPT.from_sizes'; allowed: n_layer, n_head"),
        ({"model": {"name": "resnet18", "args": {"depth": 3}}},
         "model.args: unknown key(s) 'depth' for resnet18; allowed: "),
        ({"data": {"name": "synthetic-images", "args": {"sizes": 64}}},
         "data.args: unknown key(s) 'sizes' for synthetic-images; allowed: "),
        ({"optimizer": {"name": "adamw", "args": {"learning_rate": 0.1}}},
         "optimizer.args: unknown key(s) 'learning_rate' for adamw; allowed: lr, "),
        ({"optimizer": {"name": "gpt_code.py:make_optimizer", "args": {"momentum": 0.9}}},
         "optimizer.args: unknown key(s) 'momentum' for 'gpt_code.py:make_optimizer'; allowed: lr"),
        ({"step": "gpt_code.py:step", "loss": "cross_entropy"},
         "step: 'gpt_code.py:step' must take 2 positional argument(s) first"),
    ],
    ids=["class taking a config", "function typo", "classmethod", "builtin model", "builtin data", "builtin optimizer",
         "optimizer function", "step positional"],
)
def test_a_factory_argument_its_signature_does_not_take_is_one_line_naming_it_and_the_accepted_ones(tmp_path, parts, message):
    (tmp_path / "gpt_code.py").write_text(FACTORIES)
    spec = _spec(tmp_path, **parts)
    with pytest.raises(WorkloadError) as info:
        check_references(spec)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_arguments_the_signatures_take_pass(tmp_path):
    (tmp_path / "gpt_code.py").write_text(FACTORIES)
    spec = _spec(tmp_path, model={"name": "gpt_code.py:GPT.from_sizes", "args": {"n_layer": 2}},
                 optimizer={"name": "gpt_code.py:make_optimizer", "args": {"lr": 0.01}})
    check_references(spec)


def test_a_reference_whose_import_hangs_is_stopped(tmp_path):
    (tmp_path / "slow.py").write_text("import time\ntime.sleep(60)\ndef make():\n    return 1\n")
    spec = _spec(tmp_path, model={"name": "slow.py:make"})
    with pytest.raises(WorkloadError, match=r"did not finish within 2 s \(model.name 'slow.py:make'\)"):
        check_references(spec, timeout_s=2)
