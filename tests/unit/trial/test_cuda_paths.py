"""The CUDA branches of the trial process, exercised with fakes on a machine without a GPU.

Each fake replaces one torch.cuda function with a recording stand-in, so the test shows
which device call the code makes and with which figures, not just that nothing raised.
"""

from __future__ import annotations

import resource
from types import SimpleNamespace

import pytest
import torch

from trainopt.contract.boundary import SLOT_CPUS_VAR
from trainopt.contract.protocol import TrialRequest
from trainopt.knobs import catalog as knobs
from trainopt.knobs.catalog import default_settings
from trainopt.knobs.kwargs import loader_kwargs
from trainopt.trial import arm, faults, memory, workloads
from trainopt.trial import environment as fingerprint
from trainopt.trial.applier import Applier
from trainopt.trial.memory import PeakMemory

CUDA0 = torch.device("cuda", 0)
GIB = 1024**3


# ---- out-of-memory classification ------------------------------------------------------


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)"),
        RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"),
        MemoryError(),
        RuntimeError("std::bad_alloc"),  # torch.stack in the DataLoader's collate, under an address-space cap
    ],
    ids=["OutOfMemoryError", "cuda-message", "cpu-allocator", "MemoryError", "cpp-bad-alloc"],
)
def test_out_of_memory_errors_are_oom(exc):
    assert faults.is_out_of_memory(exc)


@pytest.mark.parametrize(
    "exc",
    [
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("CUDA error: device-side assert triggered"),
        ValueError("out of memory"),  # not an allocator error type
    ],
    ids=["illegal-access", "device-assert", "value-error"],
)
def test_other_cuda_errors_are_not_oom(exc):
    assert not faults.is_out_of_memory(exc)


def test_torch_out_of_memory_error_is_classified_by_type_not_message():
    assert issubclass(torch.OutOfMemoryError, RuntimeError)
    assert faults.is_out_of_memory(torch.OutOfMemoryError("allocation failed"))


# ---- peak memory from the CUDA allocator ------------------------------------------------


def test_peak_memory_on_cuda_comes_from_the_allocator(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: calls.append(("max", device)) or 3 * GIB)
    mem = PeakMemory(CUDA0)
    mem.sample()  # no RSS sampling on CUDA
    assert mem.peak() == 3 * GIB
    assert calls == [("reset", CUDA0), ("max", CUDA0)]
    assert mem.children_peak == 0


# ---- applicability ------------------------------------------------------------------------


@pytest.mark.parametrize("knob", ["pin_memory", "cudnn_benchmark", "tf32"])
def test_cuda_only_knobs_apply_on_cuda_and_not_on_cpu(knob):
    settings = {**default_settings(), knob: True}
    assert knobs.not_applicable_reason(settings, "cuda") is None
    assert knobs.not_applicable_reason(settings, "cpu") == f"{knob} applies to CUDA devices only; this trial runs on cpu"


def test_worker_rules_still_apply_on_cuda():
    settings = {**default_settings(), "pin_memory": True, "persistent_workers": True}
    assert knobs.not_applicable_reason(settings, "cuda") == "persistent_workers needs num_workers > 0"


def test_pinning_and_non_blocking_only_towards_cuda():
    settings = {**default_settings(), "pin_memory": True}
    assert loader_kwargs(settings, "cuda")["pin_memory"] is True
    assert loader_kwargs(settings, "cpu")["pin_memory"] is False


# ---- memory cap --------------------------------------------------------------------------


def test_memory_cap_on_cuda_uses_the_allocator_fraction_not_rlimit(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: seen.update(fraction=f, device=d))
    monkeypatch.setattr(resource, "setrlimit", lambda *a: pytest.fail("RLIMIT_AS must not be set for a CUDA trial"))
    memory.cap_memory(20.0, CUDA0)
    assert seen == {"fraction": pytest.approx(0.25), "device": 0}


def test_memory_cap_on_cuda_above_the_device_is_the_whole_device(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=16 * GIB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: seen.update(fraction=f, device=d))
    memory.cap_memory(64.0, torch.device("cuda"))
    assert seen == {"fraction": 1.0, "device": 1}


def test_memory_cap_on_cpu_is_an_address_space_limit(monkeypatch):
    seen = []
    monkeypatch.setattr(resource, "setrlimit", lambda which, limits: seen.append((which, limits)))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: pytest.fail("no CUDA call on CPU"))
    memory.cap_memory(2.0, torch.device("cpu"))
    assert seen == [(resource.RLIMIT_AS, (2 * GIB, 2 * GIB))]
    memory.cap_memory(None, torch.device("cpu"))
    assert len(seen) == 1


class _StopAfterCap(Exception):
    """Raised by a fake workload factory: the arm's set-up got past the memory cap."""


def _set_up_an_arm(monkeypatch, device: str, memory_gb: float | None):
    """Run an arm's own set-up up to building the workload; return the address-space limits it set."""
    limits = []
    monkeypatch.setattr(resource, "setrlimit", lambda which, lim: limits.append((which, lim)))
    monkeypatch.setattr(fingerprint, "environment", lambda device=None: {"device_type": device.type})
    monkeypatch.setattr(workloads, "build_workload", lambda spec, source_dir: (_ for _ in ()).throw(_StopAfterCap()))
    monkeypatch.delenv(SLOT_CPUS_VAR, raising=False)
    request = TrialRequest(spec={"device": device, "seed": 0, "measure": {"window_seconds": 0.1}}, source_dir=".",
                           settings=default_settings(), mode="measure", result_path="/nonexistent/result.json",
                           memory_gb=memory_gb)
    with pytest.raises(_StopAfterCap):
        arm._Arm(request, None, 1).setup()
    return limits


def test_an_arm_on_cuda_with_a_memory_limit_caps_the_allocator_not_the_address_space(monkeypatch):
    # An address-space limit would stop the CUDA driver from starting in every arm of a session.
    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80 * GIB))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: seen.update(fraction=f, device=d))
    assert _set_up_an_arm(monkeypatch, "cuda:0", 20.0) == []
    assert seen == {"fraction": pytest.approx(0.25), "device": 0}


def test_an_arm_on_cpu_with_a_memory_limit_caps_the_address_space(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: pytest.fail("no CUDA call on CPU"))
    assert _set_up_an_arm(monkeypatch, "cpu", 2.0) == [(resource.RLIMIT_AS, (2 * GIB, 2 * GIB))]
    assert _set_up_an_arm(monkeypatch, "cpu", None) == []


# ---- environment fingerprint ---------------------------------------------------------------


def test_environment_on_cuda_records_the_device(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H200", total_memory=141 * GIB, major=9, minor=0)
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: asked.append(index) or props)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    env = fingerprint.environment(torch.device("cuda"))
    assert asked == [3]
    assert env["device_type"] == "cuda"
    assert env["device_name"] == "NVIDIA H200"
    assert env["device_memory_bytes"] == 141 * GIB
    assert env["device_capability"] == "9.0"
    env = fingerprint.environment(torch.device("cuda", 2))
    assert asked == [3, 2]


def test_environment_on_cpu_names_the_cpu():
    env = fingerprint.environment(torch.device("cpu"))
    assert env["device_type"] == "cpu"
    assert env["device_name"] == env["cpu_model"]
    assert "device_memory_bytes" not in env


# ---- the applier on a CUDA device ------------------------------------------------------------


def test_applier_sets_both_tf32_flags_and_benchmark_for_cuda():
    saved = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cudnn.allow_tf32 = True  # PyTorch's default
        Applier({**default_settings(), "tf32": False, "cudnn_benchmark": True}, CUDA0).apply_backend_flags()
        assert torch.backends.cudnn.allow_tf32 is False
        assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
