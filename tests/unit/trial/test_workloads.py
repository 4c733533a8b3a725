"""Built-in models and data sets, reference resolution and workload assembly."""

from __future__ import annotations

import pickle
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
import torch
from torch import nn

from trainopt.contract import spec as spec_module
from trainopt.trial.workloads import (
    BUILTIN_DATA,
    BUILTIN_LOSSES,
    BUILTIN_MODELS,
    BUILTIN_OPTIMIZERS,
    Workload,
    WorkloadError,
    build_workload,
    resolve_reference,
)
from trainopt.trial.workloads import mse as mse_loss
from trainopt.trial.workloads.data import (
    SyntheticImages,
    SyntheticTabular,
    SyntheticTokens,
    build_dataset,
)
from trainopt.trial.workloads.models import gpt, mlp, resnet18, resnet50


@pytest.fixture(autouse=True)
def _restore_sys_path(monkeypatch):
    # Resolving a reference puts the spec's folder on sys.path; keep tests independent.
    monkeypatch.setattr(sys, "path", list(sys.path))


@pytest.fixture
def user_module(tmp_path):
    """Write a module into tmp_path under a fresh name and return that name."""

    def write(source: str) -> str:
        name = f"user_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    return write


def make_spec(model="mlp", model_args=None, data="synthetic-tabular", data_args=None, loss="cross_entropy",
              optimizer="sgd", optimizer_args=None, seed=0):
    return {
        "model": {"name": model, "args": model_args or {}},
        "data": {"name": data, "args": data_args or {}},
        "loss": loss,
        "optimizer": {"name": optimizer, "args": optimizer_args if optimizer_args is not None else {"lr": 0.01}},
        "seed": seed,
    }


def train_step(w: Workload, batch_size: int = 4, impl: str = "default") -> torch.Tensor:
    loader = torch.utils.data.DataLoader(w.dataset, batch_size=batch_size)
    x, y = next(iter(loader))
    opt = w.optimizer_factory(w.model.parameters(), impl)
    out = w.model(x)
    loss = w.loss_fn(out, y)
    loss.backward()
    opt.step()
    assert loss.dim() == 0 and torch.isfinite(loss)
    return out


# --- built-in names agree with the spec's lists -------------------------------------


def test_builtin_names_match_spec():
    assert set(BUILTIN_MODELS) == set(spec_module.BUILTIN_MODELS)
    assert set(BUILTIN_DATA) == set(spec_module.BUILTIN_DATA)
    assert set(BUILTIN_LOSSES) == set(spec_module.BUILTIN_LOSSES)
    assert set(BUILTIN_OPTIMIZERS) == set(spec_module.BUILTIN_OPTIMIZERS)


# --- models --------------------------------------------------------------------------


@pytest.mark.parametrize("factory", [resnet18, resnet50])
def test_resnet_forward_backward(factory):
    torch.manual_seed(0)
    model = factory(num_classes=7, width=4, input_shape=(3, 32, 32))
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 7)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_resnet_stem_depends_on_image_size():
    small = resnet18(width=4, input_shape=(3, 32, 32))
    large = resnet18(width=4, input_shape=(1, 96, 96))
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, nn.Identity)
    assert large.conv1.kernel_size == (7, 7) and large.conv1.stride == (2, 2)
    assert isinstance(large.maxpool, nn.MaxPool2d)
    assert large.conv1.in_channels == 1
    assert large(torch.randn(2, 1, 96, 96)).shape == (2, 10)


def test_resnet50_uses_bottleneck_expansion():
    model = resnet50(width=4, input_shape=(3, 32, 32))
    assert model.fc.in_features == 4 * 8 * 4
    assert [len(s) for s in (model.layer1, model.layer2, model.layer3, model.layer4)] == [3, 4, 6, 3]


def test_mlp_forward_backward():
    model = mlp(input_shape=(2, 5), hidden=8, layers=3, num_classes=4)
    out = model(torch.randn(6, 2, 5))
    assert out.shape == (6, 4)
    out.sum().backward()
    assert sum(isinstance(m, nn.Linear) for m in model.modules()) == 4


def test_gpt_forward_backward_causal_and_tied():
    torch.manual_seed(0)
    model = gpt(vocab_size=50, seq_len=16, n_layer=2, n_head=2, n_embd=16)
    idx = torch.randint(50, (3, 16))
    logits = model(idx)
    assert logits.shape == (3, 16, 50)
    logits.sum().backward()
    assert model.lm_head.weight is model.tok_emb.weight
    # Changing the last token must not change any earlier position's logits.
    changed = idx.clone()
    changed[:, -1] = (changed[:, -1] + 1) % 50
    with torch.no_grad():
        assert torch.allclose(model(idx)[:, :-1], model(changed)[:, :-1], atol=1e-5)


def test_models_are_deterministic_given_seed():
    def weights():
        torch.manual_seed(3)
        return torch.cat([p.flatten() for p in gpt(n_embd=16, n_head=2).parameters()])

    assert torch.equal(weights(), weights())


@pytest.mark.parametrize(
    "call, text",
    [
        (lambda: resnet18(input_shape=(3, 32)), "model.args.input_shape"),
        (lambda: resnet18(width=0), "model.args.width"),
        (lambda: gpt(n_embd=10, n_head=3), "model.args.n_embd"),
        (lambda: mlp(layers=-1), "model.args.layers"),
    ],
)
def test_model_arg_validation(call, text):
    with pytest.raises(WorkloadError, match=text):
        call()


# --- data sets -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (SyntheticImages, {"size": 8, "shape": [3, 8, 8]}),
        (SyntheticTokens, {"size": 8, "seq_len": 12, "vocab_size": 30}),
        (SyntheticTabular, {"size": 8, "features": 5}),
        (SyntheticTabular, {"size": 8, "features": 5, "task": "regression"}),
    ],
)
def test_datasets_are_deterministic(cls, kwargs):
    a, b, other = cls(**kwargs, seed=1), cls(**kwargs, seed=1), cls(**kwargs, seed=2)
    assert len(a) == 8
    for i in (0, 5):
        assert all(torch.equal(u, v) for u, v in zip(a[i], b[i]))
        assert all(torch.equal(u, v) for u, v in zip(a[i], a[i]))
    assert not torch.equal(a[0][0], other[0][0])
    assert not torch.equal(a[0][0], a[1][0])
    # Loader workers receive a pickled copy; it must yield the same items.
    copy = pickle.loads(pickle.dumps(a))
    assert all(torch.equal(u, v) for u, v in zip(a[3], copy[3]))
    with pytest.raises(IndexError):
        a[8]


def test_item_types_and_shapes():
    x, y = SyntheticImages(size=2, shape=[1, 4, 6], num_classes=3)[0]
    assert x.dtype == torch.float32 and x.shape == (1, 4, 6)
    assert y.dtype == torch.int64 and y.dim() == 0 and 0 <= int(y) < 3

    tokens = SyntheticTokens(size=2, seq_len=10, vocab_size=7)
    x, y = tokens[1]
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (10,)
    assert torch.equal(x[1:], y[:-1])
    assert tokens.vocab_size == 7 and tokens.seq_len == 10

    x, y = SyntheticTabular(size=2, features=6)[0]
    assert x.dtype == torch.float32 and x.shape == (6,) and y.dtype == torch.int64 and y.dim() == 0
    x, y = SyntheticTabular(size=2, features=6, task="regression")[0]
    assert y.dtype == torch.float32 and y.shape == (1,)


def test_transform_cost_is_real_cpu_work():
    data = SyntheticImages(size=4, shape=(1, 2, 2), transform_cost_ms=5.0)
    start = time.process_time()
    for i in range(4):
        data[i]
    spent = time.process_time() - start
    assert spent >= 0.8 * 4 * 0.005, f"only {spent * 1000:.1f} ms of CPU time for 20 ms requested"


def test_latency_sleeps():
    data = SyntheticTabular(size=2, latency_ms=10.0)
    start = time.perf_counter()
    data[0]
    assert time.perf_counter() - start >= 0.009


@pytest.mark.parametrize(
    "name, args, text",
    [
        ("synthetic-images", {"size": -1}, "data.args.size"),
        ("synthetic-images", {"shape": [3, 32]}, "data.args.shape"),
        ("synthetic-images", {"transform_cost_ms": -2}, "data.args.transform_cost_ms"),
        ("synthetic-tokens", {"latency_ms": "slow"}, "data.args.latency_ms"),
        ("synthetic-tokens", {"vocab_size": 0}, "data.args.vocab_size"),
        ("synthetic-tabular", {"task": "ranking"}, "data.args.task"),
        ("synthetic-tabular", {"seed": -1}, "data.args.seed"),
    ],
)
def test_bad_data_args(name, args, text):
    with pytest.raises(WorkloadError, match=text):
        build_dataset(name, args)


def test_unknown_data_arg_names_allowed_keys():
    with pytest.raises(WorkloadError) as info:
        build_workload(make_spec(data="synthetic-images", data_args={"colour": True}), Path("."))
    message = str(info.value)
    assert "data.args" in message and "'colour'" in message and "transform_cost_ms" in message


# --- references ----------------------------------------------------------------------


def test_resolve_module_callable(tmp_path, user_module):
    name = user_module(
        """
        def make():
            return 42

        class Factory:
            @staticmethod
            def build():
                return "built"
        """
    )
    assert resolve_reference(f"{name}:make", tmp_path)() == 42
    assert resolve_reference(f"{name}:Factory.build", tmp_path)() == "built"
    assert sys.path[0] == str(tmp_path.resolve())


def test_resolve_file_callable(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "helper_mod_for_file_ref.py").write_text("VALUE = 7\n")
    (tmp_path / "sub" / "factories.py").write_text(
        "import helper_mod_for_file_ref\n\ndef make(scale=1):\n    return helper_mod_for_file_ref.VALUE * scale\n"
    )
    assert resolve_reference("sub/factories.py:make", tmp_path)(scale=2) == 14
    absolute = str(tmp_path / "sub" / "factories.py")
    assert resolve_reference(f"{absolute}:make", Path("/"))() == 7


def test_missing_module(tmp_path):
    ref = "nosuchpkg_xyz.models:make"
    with pytest.raises(WorkloadError) as info:
        resolve_reference(ref, tmp_path, field="model.name")
    message = str(info.value)
    assert message.startswith(f"model.name {ref!r}: module 'nosuchpkg_xyz.models' could not be imported")
    assert "ModuleNotFoundError: No module named 'nosuchpkg_xyz'" in message
    assert str(tmp_path.resolve()) in message


def test_missing_file(tmp_path):
    with pytest.raises(WorkloadError, match=r"data.name 'nope/data.py:make': file .*data.py' does not exist"):
        resolve_reference("nope/data.py:make", tmp_path, field="data.name")


def test_missing_attribute(tmp_path, user_module):
    name = user_module("def build():\n    pass\n")
    with pytest.raises(WorkloadError) as info:
        resolve_reference(f"{name}:make", tmp_path)
    message = str(info.value)
    assert f"'{name}:make'" in message and "has no attribute 'make'" in message and "build" in message


def test_not_callable(tmp_path, user_module):
    name = user_module("make = 3\n")
    with pytest.raises(WorkloadError, match=r"'make' is a int, not a callable"):
        resolve_reference(f"{name}:make", tmp_path, field="loss")


def test_error_while_importing_user_module(tmp_path, user_module):
    name = user_module("raise RuntimeError('broken at import')\n")
    with pytest.raises(WorkloadError, match=r"could not be imported \(RuntimeError: broken at import\)") as info:
        resolve_reference(f"{name}:make", tmp_path)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_malformed_reference(tmp_path):
    with pytest.raises(WorkloadError, match=r"model.name 'mod:': expected"):
        resolve_reference("mod:", tmp_path)


# --- build_workload ------------------------------------------------------------------


def test_build_gpt_with_tokens():
    spec = make_spec(
        model="gpt",
        model_args={"n_layer": 1, "n_head": 2, "n_embd": 16},
        data="synthetic-tokens",
        data_args={"size": 8, "seq_len": 12, "vocab_size": 40},
        optimizer="adamw",
        optimizer_args={"lr": 1e-3},
    )
    w = build_workload(spec, Path("."))
    assert w.model.tok_emb.num_embeddings == 40 and w.model.seq_len == 12
    assert not w.image_like
    assert train_step(w).shape == (4, 12, 40)


def test_gpt_smaller_than_the_data_is_rejected():
    spec = make_spec(model="gpt", model_args={"vocab_size": 10}, data="synthetic-tokens", data_args={"size": 8})
    with pytest.raises(WorkloadError, match="model.args.vocab_size"):
        build_workload(spec, Path("."))


def test_build_mlp_with_tabular_regression():
    spec = make_spec(
        model="mlp", model_args={"hidden": 8}, data_args={"size": 8, "features": 6, "task": "regression"}, loss="mse"
    )
    w = build_workload(spec, Path("."))
    assert not w.image_like
    assert train_step(w).shape == (4, 1)


def test_build_resnet18_with_images():
    spec = make_spec(
        model="resnet18",
        model_args={"width": 4},
        data="synthetic-images",
        data_args={"size": 8, "shape": [3, 16, 16], "num_classes": 5},
    )
    w = build_workload(spec, Path("."))
    assert w.image_like
    assert w.model.conv1.kernel_size == (3, 3)
    assert train_step(w).shape == (4, 5)


def test_build_is_reproducible():
    spec = make_spec(model_args={"hidden": 8}, data_args={"size": 8}, seed=5)
    a = build_workload(spec, Path(".")).model.state_dict()
    b = build_workload(spec, Path(".")).model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resnet_on_non_image_data_is_rejected():
    with pytest.raises(WorkloadError, match="needs image inputs"):
        build_workload(make_spec(model="resnet18", data_args={"size": 8}), Path("."))


def test_unknown_model_arg_names_allowed_keys():
    with pytest.raises(WorkloadError) as info:
        build_workload(make_spec(model="resnet18", model_args={"depth": 18}, data="synthetic-images"), Path("."))
    message = str(info.value)
    assert "model.args" in message and "'depth'" in message and "width" in message and "num_classes" in message


def test_user_model_data_loss_and_optimizer(tmp_path, user_module):
    name = user_module(
        """
        import torch
        from torch.utils.data import Dataset

        class Pairs(Dataset):
            def __init__(self, n):
                self.n = n
            def __len__(self):
                return self.n
            def __getitem__(self, i):
                return torch.full((3,), float(i)), torch.tensor(i % 2)

        def data(n=8):
            return Pairs(n)

        def model(out=2):
            return torch.nn.Linear(3, out)

        def optimizer(params, lr, foreach=None):
            return torch.optim.SGD(params, lr=lr, foreach=foreach)
        """
    )
    spec = make_spec(
        model=f"{name}:model",
        data=f"{name}:data",
        data_args={"n": 6},
        loss="torch.nn:CrossEntropyLoss",
        optimizer=f"{name}:optimizer",
        optimizer_args={"lr": 0.1},
    )
    w = build_workload(spec, tmp_path)
    assert isinstance(w.loss_fn, nn.CrossEntropyLoss) and len(w.dataset) == 6
    assert train_step(w, impl="foreach").shape == (4, 2)
    with pytest.raises(WorkloadError, match="takes no 'fused' argument"):
        w.optimizer_factory(w.model.parameters(), "fused")


def test_user_factory_exception_propagates(tmp_path, user_module):
    name = user_module(
        """
        class Boom(Exception):
            pass

        def model():
            raise Boom("model factory failed")

        def data():
            raise ValueError("data factory failed")
        """
    )
    with pytest.raises(ValueError, match="data factory failed") as info:
        build_workload(make_spec(data=f"{name}:data"), tmp_path)
    assert type(info.value) is ValueError
    with pytest.raises(Exception, match="model factory failed") as info:
        build_workload(make_spec(model=f"{name}:model", data_args={"size": 8}), tmp_path)
    assert type(info.value).__name__ == "Boom"


@pytest.mark.parametrize(
    "source, field, text",
    [
        (
            "def data(size):\n    return [1, 2]\n",
            "data",
            "data.name '{ref}': returned list, expected a torch.utils.data.Dataset yielding (input, target)",
        ),
        (
            "import torch\ndef data(size):\n    return torch.utils.data.TensorDataset(torch.zeros(4, 2))\n",
            "data",
            "item 0 is a tuple of length 1",
        ),
        ("def model():\n    return 'net'\n", "model", "model.name '{ref}': returned str, expected a torch.nn.Module"),
        ("def model(width):\n    pass\n", "model", "model.args: '{ref}' needs 'width'"),
        ("def data(n=1):\n    pass\n", "data", "data.args: unknown key(s) 'size'"),
        ("def optimizer(params):\n    pass\n", "optimizer", "optimizer.args: unknown key(s) 'lr'"),
    ],
)
def test_user_factory_spec_errors(tmp_path, user_module, source, field, text):
    name = user_module(source)
    ref = f"{name}:{field}"
    spec = make_spec(data_args={"size": 8})
    spec[field]["name"] = ref
    with pytest.raises(WorkloadError) as info:
        build_workload(spec, tmp_path)
    assert text.format(ref=ref) in str(info.value)


def test_unknown_builtin_name():
    with pytest.raises(WorkloadError, match="not a built-in model"):
        build_workload(make_spec(model="vgg16"), Path("."))


# --- losses and optimizers -----------------------------------------------------------


def test_mse_casts_target_and_rejects_size_mismatch():
    out = torch.zeros(4, 1, dtype=torch.bfloat16)
    assert mse_loss(out, torch.ones(4, dtype=torch.int64)).item() == 1.0
    with pytest.raises(ValueError, match="differ in size"):
        mse_loss(torch.zeros(4, 3), torch.zeros(4))


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
def test_optimizer_impls(optimizer, impl):
    spec = make_spec(model_args={"hidden": 4}, data_args={"size": 8}, optimizer=optimizer, optimizer_args={"lr": 0.01})
    w = build_workload(spec, Path("."))
    try:
        opt = w.optimizer_factory(w.model.parameters(), impl)
        w.loss_fn(w.model(torch.randn(2, 32)), torch.tensor([0, 1])).backward()
        opt.step()
    except RuntimeError as exc:
        if impl == "fused" and "fused" in str(exc).lower():
            pytest.skip(f"fused {optimizer} is not supported on this torch build: {exc}")
        raise
    if impl != "default":
        assert opt.defaults[impl] is True


def test_unknown_optimizer_arg():
    with pytest.raises(WorkloadError, match=r"optimizer.args: unknown key\(s\) 'beta'"):
        build_workload(make_spec(optimizer="adam", optimizer_args={"beta": 0.9}, data_args={"size": 8}), Path("."))
