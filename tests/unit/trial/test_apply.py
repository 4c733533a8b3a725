"""The knob semantics in trainopt.knobs.kwargs and trainopt.trial.applier: pure data first, then the applier on torch objects."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from trainopt.knobs import kwargs
from trainopt.knobs.catalog import KNOBS, default_settings
from trainopt.trial import applier as apply


def _s(**values):
    return {**default_settings(), **values}


def test_apply_and_export_import_without_torch():
    code = "import sys, trainopt.trial.applier, trainopt.settings.export; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("benchmark", [False, True])
def test_backend_flags_set_both_tf32_flags(tf32, benchmark):
    assert kwargs.backend_flags(_s(tf32=tf32, cudnn_benchmark=benchmark)) == {
        "torch.backends.cudnn.benchmark": benchmark,
        "torch.backends.cuda.matmul.allow_tf32": tf32,
        "torch.backends.cudnn.allow_tf32": tf32,
    }


def test_loader_kwargs_follow_workers_and_device():
    assert kwargs.loader_kwargs(_s(batch_size=16, persistent_workers=True, prefetch_factor=4), "cuda") == {
        "batch_size": 16, "num_workers": 0, "pin_memory": False, "drop_last": True,
    }
    assert kwargs.loader_kwargs(_s(num_workers=2, pin_memory=True, prefetch_factor=4), "cuda") == {
        "batch_size": 32, "num_workers": 2, "pin_memory": True, "drop_last": True,
        "persistent_workers": False, "prefetch_factor": 4,
    }
    assert kwargs.loader_kwargs(_s(num_workers=2, pin_memory=True), "cpu")["pin_memory"] is False


@pytest.mark.parametrize("value, expected", [("off", (False, None)), ("default", (True, None)),
                                             ("reduce-overhead", (True, "reduce-overhead")),
                                             ("max-autotune", (True, "max-autotune"))])
def test_compile_mode(value, expected):
    assert kwargs.compile_mode(_s(compile=value)) == expected


def test_every_choice_has_a_meaning():
    assert set(kwargs.AMP_DTYPES) == set(KNOBS["amp"].choices)
    assert set(kwargs.COMPILE_MODES) | {"off"} == set(KNOBS["compile"].choices)
    assert set(kwargs.OPTIMIZER_KWARGS) == set(KNOBS["optimizer_impl"].choices)
    with pytest.raises(ValueError, match="'turbo' is not one of default, foreach, fused"):
        kwargs.optimizer_kwargs("turbo")


def test_should_read_loss_counts_run_wide_optimizer_steps():
    assert [n for n in range(1, 13) if kwargs.should_read_loss(4, n)] == [4, 8, 12]
    assert not any(kwargs.should_read_loss(0, n) for n in range(20))
    assert not kwargs.should_read_loss(1, 0)


def test_device_type_of():
    assert [kwargs.device_type_of(d) for d in ("cpu", "cuda", "cuda:3", "auto")] == ["cpu", "cuda", "cuda", "cuda"]


def test_resolve_device():
    assert apply.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(apply.DeviceUnavailableError, match="'gpu' is not one of"):
        apply.resolve_device("gpu")
    if not torch.cuda.is_available():
        assert apply.resolve_device("auto") == torch.device("cpu")
        with pytest.raises(apply.DeviceUnavailableError, match="'cuda:1' was asked for but CUDA is not available"):
            apply.resolve_device("cuda:1")


def test_applier_counts_steps_and_reads():
    a = apply.Applier(_s(grad_accum=3, sync_every=2), torch.device("cpu"))
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    stepped, reads = [], []
    for _ in range(12):
        stepped.append(a.backward_and_step(model(torch.ones(1, 2)).sum(), opt))
        reads.append(stepped[-1] and a.should_read_loss())
    assert stepped == [False, False, True] * 4
    assert [i for i, r in enumerate(reads) if r] == [5, 11]
    assert (a.micro_steps, a.optimizer_steps) == (12, 4)
    assert a.scaler_state() is None


def test_applier_fp16_scaler_state():
    a = apply.Applier(_s(amp="fp16"), torch.device("cpu"))
    assert a.grad_scaler is a.grad_scaler
    state = a.scaler_state()
    assert state == {"initial_scale": 65536.0, "scale": 65536.0, "growth_interval": 2000, "optimizer_steps": 0}
