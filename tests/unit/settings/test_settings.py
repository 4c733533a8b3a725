"""The production settings API: loading best.yaml and applying every knob as measured."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
import yaml

import trainopt
from trainopt.errors import UserError
from trainopt.knobs.catalog import KNOBS, default_settings
from trainopt.settings.environment_check import TrainSettingsWarning
from trainopt.settings.production import (
    TrainSettings,
    load_settings,
    settings_from_dict,
)
from trainopt.settings.record import (
    SettingsError,
    SettingsRecord,
    read_settings_file,
    record_from_document,
    validate_record,
)
from trainopt.trial.environment import environment

FULL = {
    "batch_size": 64,
    "grad_accum": 1,
    "amp": "bf16",
    "tf32": False,
    "channels_last": False,
    "num_workers": 2,
    "pin_memory": False,
    "persistent_workers": False,
    "prefetch_factor": None,
    "sync_every": 1,
    "optimizer_impl": "default",
    "threads": None,
    "cudnn_benchmark": False,
    "compile": "off",
    "ddp_bucket_cap_mb": None,
    "ddp_gradient_as_bucket_view": False,
    "ddp_static_graph": False,
    "ddp_find_unused_parameters": False,
    "ddp_broadcast_buffers": True,
}


def _write(tmp_path, text, name="best.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def _doc(**settings):
    return {"schema_version": 1, "kind": "trainopt-settings", "device": "cpu", "settings": {**FULL, **settings}}


@pytest.fixture(autouse=True)
def _restore_torch_flags():
    threads = torch.get_num_threads()
    flags = (torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    yield
    torch.set_num_threads(threads)
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags


# ---- loading -------------------------------------------------------------------------


def test_exported_from_package():
    assert trainopt.load_settings is load_settings
    assert trainopt.TrainSettings is TrainSettings
    assert {"load_settings", "TrainSettings", "__version__"} <= set(trainopt.__all__)


def test_import_trainopt_does_not_import_torch():
    code = "import sys, trainopt; from trainopt import settings; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_full_file_as_search_writes_it(tmp_path):
    doc = _doc()
    doc["provenance"] = {"search": "demo", "speedup": 1.5, "speedup_ci": [1.4, 1.6], "lr_hint": "multiply lr by 2", "env": {}}
    s = load_settings(_write(tmp_path, "# comment\n" + yaml.safe_dump(doc, sort_keys=False)))
    assert s.settings == FULL
    assert s.device == "cpu"
    assert s.provenance["search"] == "demo"
    assert s.lr_scale_hint == "multiply lr by 2"


def test_minimal_hand_written_file_takes_defaults(tmp_path):
    s = load_settings(_write(tmp_path, "settings:\n  amp: bf16\n  batch_size: 128\n"))
    assert s.settings == {**default_settings(), "amp": "bf16", "batch_size": 128}
    assert s.device == "auto"
    assert s.provenance == {}
    assert s.lr_scale_hint is None


@pytest.mark.parametrize("text", ["settings:\n", "settings: {}\n"])
def test_empty_settings_are_all_defaults(tmp_path, text):
    assert load_settings(_write(tmp_path, text)).settings == default_settings()


def test_yaml_off_is_accepted_for_amp_and_compile(tmp_path):
    s = load_settings(_write(tmp_path, "device: cpu\nsettings:\n  amp: off\n  compile: off\n"))
    assert s.settings["amp"] == "off" and s.settings["compile"] == "off"


def test_settings_are_frozen_and_copied():
    given = {"batch_size": 8}
    s = TrainSettings(device="cpu", settings=given)
    given["batch_size"] = 99
    assert s.settings["batch_size"] == 8
    with pytest.raises(AttributeError):
        s.device = "cuda"  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.settings["batch_size"] = 16  # type: ignore[index]
    assert s.settings["batch_size"] == 8


# ---- schema, file reading and applying are separate --------------------------------------


def test_record_is_validated_plain_data():
    record = validate_record("cuda:1", {"amp": "bf16"}, {"search": "demo"}, source="x.yaml")
    assert isinstance(record, SettingsRecord)
    assert record.device == "cuda:1" and record.source == "x.yaml"
    assert dict(record.settings) == {**default_settings(), "amp": "bf16"}
    assert dict(record.provenance) == {"search": "demo"}
    # Building the record needs no device: cuda:1 is only resolved when applied.
    assert TrainSettings.from_record(record).record is record


def test_file_reading_returns_the_document_unvalidated(tmp_path):
    path = _write(tmp_path, "settings: {amp: fp8}\nextra: 1\n")
    assert read_settings_file(path) == {"settings": {"amp": "fp8"}, "extra": 1}
    with pytest.raises(SettingsError) as err:
        record_from_document(read_settings_file(path), source=str(path))
    assert {p.split(":")[0] for p in err.value.problems} == {"extra", "settings.amp"}


def test_settings_equal_by_value():
    assert TrainSettings(device="cpu", settings={"amp": "bf16"}) == TrainSettings(device="cpu", settings={"amp": "bf16"})
    assert TrainSettings(device="cpu") != TrainSettings(device="cpu", settings={"amp": "bf16"})


def test_backward_and_step_counts_micro_batches_without_a_step_index():
    s = TrainSettings(device="cpu", settings={"grad_accum": 2})
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    stepped = [s.backward_and_step(model(torch.ones(1, 2)).sum(), optimizer) for _ in range(4)]
    assert stepped == [False, True, False, True]
    assert s.applier.optimizer_steps == 2


# ---- errors --------------------------------------------------------------------------


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(SettingsError, match="file not found") as err:
        load_settings(path)
    assert str(path) in str(err.value)
    assert isinstance(err.value, UserError)


def test_folder_instead_of_file(tmp_path):
    with pytest.raises(SettingsError, match="folder"):
        load_settings(tmp_path)


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    path = _write(tmp_path, "settings:\n  amp: bf16\n  batch_size: [1, 2\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: YAML syntax error at line ")
    assert "column" in msg


def test_yaml_syntax_error_line_number_is_right(tmp_path):
    path = _write(tmp_path, "settings:\n  amp: bf16\n\tbatch_size: 4\n")
    with pytest.raises(SettingsError, match=r"line 3, column 1"):
        load_settings(path)


def test_bad_value_names_field_value_and_allowed(tmp_path):
    path = _write(tmp_path, "settings:\n  amp: fp8\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    assert str(err.value) == f"{path}: settings.amp: 'fp8' is not one of off, bf16, fp16"


def test_unknown_knob_suggests_the_right_one(tmp_path):
    path = _write(tmp_path, "settings:\n  batchsize: 8\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    msg = str(err.value)
    assert "settings.batchsize: unknown knob" in msg
    assert "did you mean 'batch_size'" in msg


def test_unknown_top_level_key(tmp_path):
    path = _write(tmp_path, "settings: {}\nsetings: {amp: bf16}\n")
    with pytest.raises(SettingsError, match=r"setings: unknown top-level key .*allowed: schema_version"):
        load_settings(path)


def test_every_problem_is_listed(tmp_path):
    path = _write(tmp_path, "device: gpu\nsettings:\n  batch_size: 0\n  num_workers: two\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    problems = err.value.problems
    assert len(problems) == 3
    assert any(p.startswith("device: 'gpu' is not one of auto, cpu, cuda, cuda:N") for p in problems)
    assert any(p.startswith("settings.batch_size: 0 is too small") for p in problems)
    assert any(p.startswith("settings.num_workers: 'two' is not an integer") for p in problems)
    assert "3 problems" in str(err.value)


def test_bad_schema_version_names_both_versions(tmp_path):
    path = _write(tmp_path, "schema_version: 2\nsettings: {}\n")
    with pytest.raises(SettingsError) as err:
        load_settings(path)
    msg = str(err.value)
    assert "schema_version" in msg and "version 2" in msg and "version 1" in msg


def test_boolean_schema_version_is_rejected(tmp_path):
    with pytest.raises(SettingsError, match="schema_version"):
        load_settings(_write(tmp_path, "schema_version: true\nsettings: {}\n"))


def test_wrong_kind(tmp_path):
    with pytest.raises(SettingsError, match="kind: 'trainopt-results' is not 'trainopt-settings'"):
        load_settings(_write(tmp_path, '{"kind": "trainopt-results", "schema_version": 1}'))


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty"),
        ("- a\n- b\n", "expected a mapping"),
        ("device: cpu\n", "settings: missing"),
        ("settings: [1, 2]\n", "settings: expected a mapping of knob: value, got list"),
        ("settings: {}\nprovenance: 3\n", "provenance: expected a mapping"),
        ("settings: {}\nprovenance: {env: 3}\n", "provenance.env: expected a mapping"),
        ("settings: {prefetch_factor: null, amp: null}\n", "settings.amp: null is not allowed"),
    ],
)
def test_structural_errors(tmp_path, text, match):
    with pytest.raises(SettingsError, match=match):
        load_settings(_write(tmp_path, text))


def test_python_tags_are_not_executed(tmp_path):
    path = _write(tmp_path, "settings: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(SettingsError, match="YAML"):
        load_settings(path)


def test_direct_construction_validates():
    with pytest.raises(SettingsError, match="settings.compile: 'fast' is not one of"):
        TrainSettings(settings={"compile": "fast"})


def test_cuda_device_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    s = TrainSettings(device="cuda:0", source="best.yaml")
    with pytest.raises(SettingsError, match="best.yaml: device: 'cuda:0' was asked for but CUDA is not available"):
        s.device_obj()


# ---- environment warning -------------------------------------------------------------


def _with_env(tmp_path, env):
    doc = _doc()
    # Through JSON, as the search stores it (torch.__version__ is a str subclass).
    doc["provenance"] = {"search": "demo", "env": json.loads(json.dumps(env))}
    return _write(tmp_path, yaml.safe_dump(doc))


def test_warns_once_when_measured_elsewhere(tmp_path):
    here = environment(None)
    fake = {**here, "device_name": "Imaginary GPU 9000", "torch": "0.0.1"}
    with pytest.warns(TrainSettingsWarning) as record:
        load_settings(_with_env(tmp_path, fake))
    assert len(record) == 1
    msg = str(record[0].message)
    assert "Imaginary GPU 9000" in msg and "0.0.1" in msg
    assert "device_name" in msg and "torch" in msg


def test_no_warning_for_this_machine(tmp_path):
    path = _with_env(tmp_path, environment(torch.device("cpu")))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainSettingsWarning)
        load_settings(path)


def test_no_warning_without_fingerprint_or_when_disabled(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainSettingsWarning)
        load_settings(_write(tmp_path, "device: cpu\nsettings: {}\n"))
        load_settings(_with_env(tmp_path, {"device_name": "Imaginary GPU 9000"}), warn=False)


def test_only_recorded_keys_are_compared(tmp_path):
    here = environment(None)
    path = _with_env(tmp_path, {"torch": here["torch"]})
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainSettingsWarning)
        load_settings(path)


# ---- applying the knobs --------------------------------------------------------------


def test_device_auto_resolves():
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert TrainSettings().device_obj().type == expected
    assert TrainSettings(device="cpu").device_obj() == torch.device("cpu")


def test_apply_backend_flags():
    TrainSettings(device="cpu", settings={"threads": 1, "cudnn_benchmark": True, "tf32": True}).apply_backend_flags()
    assert torch.get_num_threads() == 1
    assert torch.backends.cudnn.benchmark is True
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert torch.backends.cudnn.allow_tf32 is True
    TrainSettings(device="cpu", settings={"tf32": False}).apply_backend_flags()
    assert torch.get_num_threads() == 1  # threads: null leaves the count alone
    assert torch.backends.cudnn.benchmark is False
    assert torch.backends.cuda.matmul.allow_tf32 is False
    # tf32: false means no TF32 anywhere, though PyTorch's cuDNN default is TF32 on.
    assert torch.backends.cudnn.allow_tf32 is False
    # tf32: null (the default) leaves both flags as they are, as a plain script does.
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True
    TrainSettings(device="cpu").apply_backend_flags()
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == (False, True)


def test_dataloader_kwargs_without_workers():
    s = TrainSettings(device="cpu", settings={"batch_size": 4, "num_workers": 0, "persistent_workers": True, "prefetch_factor": 3})
    kwargs = s.dataloader_kwargs()
    assert kwargs == {"batch_size": 4, "num_workers": 0, "pin_memory": False, "drop_last": True}
    # DataLoader accepts exactly these.
    torch.utils.data.DataLoader(list(range(8)), **kwargs)


def test_dataloader_kwargs_with_workers():
    s = TrainSettings(device="cpu", settings={"batch_size": 4, "num_workers": 2, "persistent_workers": True, "prefetch_factor": 3})
    kwargs = s.dataloader_kwargs()
    assert kwargs == {
        "batch_size": 4,
        "num_workers": 2,
        "pin_memory": False,
        "drop_last": True,
        "persistent_workers": True,
        "prefetch_factor": 3,
    }
    torch.utils.data.DataLoader(list(range(8)), **kwargs)


def test_pin_memory_only_on_cuda():
    s = TrainSettings(device="cpu", settings={"pin_memory": True})
    assert s.dataloader_kwargs()["pin_memory"] is False


def test_prepare_model_and_to_device_channels_last():
    s = TrainSettings(device="cpu", settings={"channels_last": True})
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten())
    model.eval()
    out = s.prepare_model(model)
    assert out is model and model.training
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    x, y = s.to_device(torch.randn(2, 3, 8, 8), torch.tensor([0, 1]))
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert y.device.type == "cpu"
    flat, _ = s.to_device(torch.randn(2, 5), torch.tensor([0, 1]))
    assert flat.is_contiguous()


def test_prepare_model_compiles_when_asked(monkeypatch):
    seen = {}

    def fake_compile(model, mode=None):
        seen["mode"] = mode
        return ("compiled", model)

    monkeypatch.setattr(torch, "compile", fake_compile)
    model = torch.nn.Linear(2, 2)
    assert TrainSettings(device="cpu", settings={"compile": "max-autotune"}).prepare_model(model) == ("compiled", model)
    assert seen["mode"] == "max-autotune"
    TrainSettings(device="cpu", settings={"compile": "default"}).prepare_model(model)
    assert seen["mode"] is None
    assert TrainSettings(device="cpu").prepare_model(model) is model


def test_autocast_bf16_on_cpu_gives_bfloat16():
    s = TrainSettings(device="cpu", settings={"amp": "bf16"})
    layer = torch.nn.Linear(4, 4)
    with s.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16
    assert s.autocast_dtype() == torch.bfloat16


def test_autocast_off_is_full_precision():
    s = TrainSettings(device="cpu")
    with s.autocast():
        out = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert out.dtype == torch.float32
    assert s.autocast_dtype() is None and s.grad_scaler is None


def _train_steps(s, n):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, **s.optimizer_kwargs())
    history, stepped = [], []
    for step in range(n):
        before = model.weight.detach().clone()
        with s.autocast():
            loss = model(torch.randn(8, 4)).float().pow(2).mean()
        stepped.append(s.backward_and_step(loss, optimizer, step))
        history.append(not torch.equal(before, model.weight.detach()))
    return stepped, history, model


def test_backward_and_step_accumulates():
    s = TrainSettings(device="cpu", settings={"grad_accum": 3})
    stepped, changed, model = _train_steps(s, 6)
    assert stepped == [False, False, True, False, False, True]
    assert changed == stepped
    assert model.weight.grad is None  # zero_grad(set_to_none=True) after the step


def test_backward_and_step_divides_loss_by_accum():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1, bias=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    s = TrainSettings(device="cpu", settings={"grad_accum": 2})
    x = torch.ones(1, 2)
    s.backward_and_step(model(x).sum(), optimizer, 0)
    # d(loss / 2)/dw = x / 2
    assert torch.allclose(model.weight.grad, torch.full((1, 2), 0.5))


def test_fp16_scaler_path_on_cpu():
    s = TrainSettings(device="cpu", settings={"amp": "fp16", "grad_accum": 2})
    try:
        scaler = s.grad_scaler
        with s.autocast():
            torch.nn.Linear(2, 2)(torch.randn(1, 2))
    except (RuntimeError, TypeError) as exc:
        pytest.skip(f"fp16 autocast or GradScaler unsupported on CPU in this torch: {exc}")
    assert isinstance(scaler, torch.amp.GradScaler)
    assert s.grad_scaler is scaler  # created once, kept
    stepped, changed, _ = _train_steps(s, 4)
    assert stepped == [False, True, False, True]
    assert changed == stepped


@pytest.mark.parametrize("impl, expected", [("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})])
def test_optimizer_kwargs(impl, expected):
    assert TrainSettings(settings={"optimizer_impl": impl}).optimizer_kwargs() == expected


def test_should_log_follows_sync_every():
    s = TrainSettings(settings={"sync_every": 3})
    assert [st for st in range(10) if s.should_log(st)] == [2, 5, 8]
    assert not any(TrainSettings(settings={"sync_every": 0}).should_log(st) for st in range(10))
    assert all(TrainSettings(settings={"sync_every": 1}).should_log(st) for st in range(5))


def test_should_log_counts_optimizer_steps_with_accumulation():
    s = TrainSettings(settings={"sync_every": 2, "grad_accum": 2})
    # Micro-batches 0..7 are optimizer steps 1..4; the loss is read after steps 2 and 4.
    assert [st for st in range(8) if s.should_log(st)] == [3, 7]


def test_every_knob_is_covered_by_full():
    assert set(FULL) == set(KNOBS)


def test_settings_from_dict_matches_load(tmp_path):
    doc = _doc(amp="fp16")
    assert settings_from_dict(doc).settings == load_settings(_write(tmp_path, yaml.safe_dump(doc))).settings
