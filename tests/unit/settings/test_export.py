"""``trainopt export``: every format, every knob named, and clear errors."""

from __future__ import annotations

import re

import pytest
import yaml

from trainopt.errors import UserError
from trainopt.knobs.catalog import KNOBS, default_settings
from trainopt.settings.export import FORMATS, ExportError, render_export
from trainopt.settings.production import load_settings
from trainopt.settings.record import SettingsError

PROVENANCE = {
    "search": "resnet",
    "measured_at": "2025-01-01T00:00:00+00:00",
    "trainopt_version": "0.1.0",
    "complete": True,
    "samples_per_s": 900.0,
    "baseline_samples_per_s": 500.0,
    "speedup": 1.8,
    "speedup_ci": [1.7, 1.9],
    "verdict": "improved",
    "kept": [],
    "lr_hint": None,
    "env": {"torch": "2.13.0", "device_type": "cuda", "device_name": "NVIDIA H200", "cpu_model": "Xeon", "cuda": "12.8"},
}

COMBOS = {
    "defaults": ("auto", {}),
    "bf16-workers": (
        "cuda",
        {"batch_size": 64, "amp": "bf16", "num_workers": 4, "pin_memory": True, "persistent_workers": True, "prefetch_factor": 4},
    ),
    "everything": (
        "cuda:1",
        {
            "batch_size": 128,
            "grad_accum": 4,
            "amp": "fp16",
            "tf32": True,
            "channels_last": True,
            "num_workers": 8,
            "pin_memory": True,
            "persistent_workers": True,
            "prefetch_factor": 2,
            "sync_every": 50,
            "optimizer_impl": "fused",
            "threads": 8,
            "cudnn_benchmark": True,
            "compile": "max-autotune",
        },
    ),
    "cpu-quiet": ("cpu", {"sync_every": 0, "optimizer_impl": "foreach", "compile": "default", "threads": 4, "pin_memory": True}),
}


def _best(tmp_path, device="cuda", provenance=True, name="best.yaml", **settings):
    doc = {"schema_version": 1, "kind": "trainopt-settings", "device": device, "settings": {**default_settings(), **settings}}
    if provenance:
        doc["provenance"] = dict(PROVENANCE)
    path = tmp_path / name
    path.write_text("# written by a search\n" + yaml.safe_dump(doc, sort_keys=False))
    return path


def _code_lines(text):
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("combo", sorted(COMBOS))
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_knob_appears_in_every_format(tmp_path, fmt, combo):
    device, settings = COMBOS[combo]
    text = render_export(_best(tmp_path, device=device, **settings), fmt)
    for name in KNOBS:
        assert re.search(rf"\b{name}\b", text), f"{name} missing from the {fmt} export"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_header_names_machine_and_speedup(tmp_path, fmt):
    text = render_export(_best(tmp_path), fmt)
    head = text.splitlines()[0]
    assert head.startswith("# trainopt settings from")
    assert "# measured on: NVIDIA H200 (cuda), torch 2.13.0" in text
    assert "1.80x over the baseline (interval 1.70x to 1.90x)" in text


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_header_without_provenance(tmp_path, fmt):
    text = render_export(_best(tmp_path, provenance=False, amp="bf16"), fmt)
    assert text.startswith("# trainopt settings from")
    assert "measured on: unknown" in text
    assert "speedup" not in text


def test_header_text_cannot_inject_code(tmp_path):
    path = _best(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["provenance"]["lr_hint"] = "scale lr\nimport os; os.system('x')"
    doc["provenance"]["env"]["device_name"] = "GPU\n\nboom()"
    path.write_text(yaml.safe_dump(doc))
    text = render_export(path, "torch")
    assert not any("boom()" in line or "os.system" in line for line in _code_lines(text))


def test_incomplete_search_is_flagged(tmp_path):
    path = _best(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["provenance"]["complete"] = False
    path.write_text(yaml.safe_dump(doc))
    assert "did not finish" in render_export(path, "torch")


@pytest.mark.parametrize("combo", sorted(COMBOS))
@pytest.mark.parametrize("fmt", ["torch", "lightning", "hf"])
def test_python_formats_compile(tmp_path, fmt, combo):
    device, settings = COMBOS[combo]
    text = render_export(_best(tmp_path, device=device, **settings), fmt)
    compile(text, "<export>", "exec")


def test_torch_snippet_contents(tmp_path):
    device, settings = COMBOS["everything"]
    text = render_export(_best(tmp_path, device=device, **settings), "torch")
    for needle in [
        'torch.device("cuda:1")',
        "torch.set_num_threads(8)",
        "torch.backends.cudnn.benchmark = True",
        "torch.backends.cuda.matmul.allow_tf32 = True",
        "batch_size=128",
        "num_workers=8",
        "pin_memory=True",
        "persistent_workers=True",
        "prefetch_factor=2",
        "drop_last=True",
        "model.to(memory_format=torch.channels_last)",
        "x.contiguous(memory_format=torch.channels_last)",
        'torch.compile(model, mode="max-autotune")',
        "torch.amp.GradScaler(device.type)",
        "torch.autocast(device.type, dtype=torch.float16)",
        "scaler.scale(loss / grad_accum).backward()",
        "scaler.step(optimizer)",
        "scaler.update()",
        "grad_accum = 4",
        "optimizer.zero_grad(set_to_none=True)",
        "fused=True",
        "non_blocking=True",
        "% 50 == 0",
        "loss.item()",
    ]:
        assert needle in text, needle


def test_torch_snippet_defaults_has_no_extras(tmp_path):
    code = "\n".join(_code_lines(render_export(_best(tmp_path, device="cpu"), "torch")))
    for absent in ["GradScaler", "autocast", "torch.compile", "channels_last", "set_num_threads", "non_blocking", "prefetch_factor"]:
        assert absent not in code, absent
    assert "loss.backward()" in code
    assert "% 1 == 0" in code


def test_torch_snippet_without_loss_reads(tmp_path):
    code = "\n".join(_code_lines(render_export(_best(tmp_path, device="cpu", sync_every=0), "torch")))
    assert ".item()" not in code


@pytest.mark.parametrize("fmt", ["torch", "lightning", "hf"])
@pytest.mark.parametrize("tf32", [False, True])
def test_tf32_is_code_for_both_flags(tmp_path, fmt, tf32):
    """PyTorch's cuDNN TF32 default is on: tf32: false must switch it off in code, not a comment."""
    code = _code_lines(render_export(_best(tmp_path, device="cuda", tf32=tf32), fmt))
    for flag in ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32"):
        assert any(line.startswith(f"{flag} = {tf32}") for line in code), (flag, code)


@pytest.mark.parametrize("fmt", ["torch", "lightning", "hf"])
def test_tf32_null_sets_neither_flag_and_says_so(tmp_path, fmt):
    text = render_export(_best(tmp_path, device="cuda"), fmt)
    assert not any("allow_tf32" in line for line in _code_lines(text))
    if fmt != "hf":
        assert "tf32: null -> PyTorch's TF32 defaults" in text


def test_every_non_default_value_is_code(tmp_path):
    """A value that differs from PyTorch's own default must appear in the code lines, not only in comments."""
    device, settings = COMBOS["everything"]
    code = "\n".join(_code_lines(render_export(_best(tmp_path, device=device, **settings), "torch")))
    for needle in ["set_num_threads(8)", "benchmark = True", "allow_tf32 = True", "batch_size=128", "num_workers=8",
                   "pin_memory=True", "persistent_workers=True", "prefetch_factor=2", "channels_last", "float16",
                   "GradScaler", "grad_accum = 4", "fused=True", 'mode="max-autotune"', "% 50 == 0"]:
        assert needle in code, needle


class _StepCounter:
    """Counts optimizer steps of every optimizer, through torch's global step hook."""

    def __enter__(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.steps = 0

        def hook(optimizer, args, kwargs):
            self.steps += 1

        self._handle = register_optimizer_step_post_hook(hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()


@pytest.fixture
def restore_torch_flags():
    import torch

    saved = (torch.get_num_threads(), torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    yield
    torch.set_num_threads(saved[0])
    torch.backends.cudnn.benchmark, torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[1:]


def _exec_torch_export(text):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 2))
    data = [(torch.randn(3, 8, 8), torch.tensor(i % 2)) for i in range(16)]
    printed = []
    scope = {"model": model, "dataset": data, "loss_fn": torch.nn.functional.cross_entropy,
             "print": lambda *a: printed.append(a)}
    before = model[0].weight.detach().clone()
    with _StepCounter() as counter:
        exec(compile(text, "<export>", "exec"), scope)
    return scope, model, before, counter.steps, printed


@pytest.mark.parametrize(
    "settings",
    [
        {"grad_accum": 2, "amp": "bf16", "channels_last": True, "batch_size": 4, "sync_every": 1},
        {"grad_accum": 1, "amp": "off", "batch_size": 2, "tf32": False, "cudnn_benchmark": True, "threads": 1,
         "optimizer_impl": "foreach", "sync_every": 3},
        {"grad_accum": 4, "amp": "fp16", "batch_size": 2, "sync_every": 0, "optimizer_impl": "fused"},
    ],
    ids=["bf16-accum-channels-last", "flags-foreach", "fp16-accum-fused"],
)
def test_torch_export_executes_as_measured(tmp_path, restore_torch_flags, settings):
    """The pasted torch code, run for real, sets what the trial set and steps as the trial stepped."""
    import torch

    from trainopt.knobs.kwargs import backend_flags

    # The opposite of what the export should set, so a flag left alone is caught; with
    # tf32: null, the opposite of PyTorch's defaults, which the export must leave alone.
    full = {**default_settings(), **settings}
    tf32 = (True, False) if full["tf32"] is None else (full["tf32"], full["tf32"])
    torch.backends.cuda.matmul.allow_tf32 = tf32[0] if full["tf32"] is None else not tf32[0]
    torch.backends.cudnn.allow_tf32 = tf32[1] if full["tf32"] is None else not tf32[1]
    torch.backends.cudnn.benchmark = not settings.get("cudnn_benchmark", False)
    text = render_export(_best(tmp_path, device="cpu", **settings), "torch")
    scope, model, before, steps, printed = _exec_torch_export(text)

    assert torch.backends.cudnn.benchmark is backend_flags(full)["torch.backends.cudnn.benchmark"]
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == tf32
    if full["threads"] is not None:
        assert torch.get_num_threads() == full["threads"]
    micro = 16 // full["batch_size"]
    assert steps == micro // full["grad_accum"]
    assert len(printed) == (steps // full["sync_every"] if full["sync_every"] else 0)
    loader = scope["loader"]
    assert (loader.batch_size, loader.num_workers, loader.drop_last, loader.pin_memory) == (
        full["batch_size"], full["num_workers"], True, False)
    if full["channels_last"]:
        assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert ("scaler" in scope) is (full["amp"] == "fp16")
    optimizer = scope["optimizer"]
    impl = full["optimizer_impl"]
    assert optimizer.defaults.get("foreach") is (True if impl == "foreach" else None)
    assert bool(optimizer.defaults.get("fused")) is (impl == "fused")
    assert not torch.equal(before, model[0].weight.detach())


def _kwargs_of_call(text, call):
    """Keyword names passed to ``call(`` in rendered code (parsed, not executed)."""
    import ast

    names = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == call:
                names += [kw.arg for kw in node.keywords]
    assert names, f"no {call}( call in the export"
    return names


@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_lightning_kwargs_match_the_real_signature(tmp_path, combo):
    lightning = pytest.importorskip("lightning", reason="lightning is not installed; its signature cannot be checked")
    import inspect

    device, settings = COMBOS[combo]
    params = inspect.signature(lightning.Trainer).parameters
    for name in _kwargs_of_call(render_export(_best(tmp_path, device=device, **settings), "lightning"), "Trainer"):
        assert name in params, name


@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_hf_kwargs_match_the_real_signature(tmp_path, combo):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed; its signature cannot be checked")
    import inspect

    device, settings = COMBOS[combo]
    params = inspect.signature(transformers.TrainingArguments).parameters
    for name in _kwargs_of_call(render_export(_best(tmp_path, device=device, **settings), "hf"), "TrainingArguments"):
        assert name in params, name


@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_dataloader_kwargs_in_exports_match_the_real_signature(tmp_path, combo):
    """DataLoader is always here: every keyword the torch and Lightning exports pass exists."""
    import inspect

    import torch

    device, settings = COMBOS[combo]
    params = inspect.signature(torch.utils.data.DataLoader).parameters
    for fmt in ("torch", "lightning"):
        for name in _kwargs_of_call(render_export(_best(tmp_path, device=device, **settings), fmt), "DataLoader"):
            assert name in params, (fmt, name)


@pytest.mark.parametrize("amp, precision", [("bf16", "bf16-mixed"), ("fp16", "16-mixed")])
def test_lightning_precision(tmp_path, amp, precision):
    assert f'precision="{precision}"' in render_export(_best(tmp_path, amp=amp), "lightning")


def test_lightning_full_precision_keeps_the_default(tmp_path):
    text = render_export(_best(tmp_path, amp="off"), "lightning")
    assert "precision=" not in "\n".join(_code_lines(text))
    assert "amp: off -> Lightning's default precision, 32-true" in text


@pytest.mark.parametrize(
    "device, expected",
    # auto: the fingerprint says the search ran on CUDA.
    [("auto", ['accelerator="gpu"', "devices=1"]), ("cpu", ['accelerator="cpu"', "devices=1"]),
     ("cuda", ['accelerator="gpu"', "devices=1"]), ("cuda:2", ['accelerator="gpu"', "devices=[2]"])],
)
def test_lightning_device(tmp_path, device, expected):
    text = render_export(_best(tmp_path, device=device), "lightning")
    for needle in expected:
        assert needle in text


def test_lightning_trainer_kwargs(tmp_path):
    device, settings = COMBOS["everything"]
    text = render_export(_best(tmp_path, device=device, **settings), "lightning")
    for needle in [
        "accumulate_grad_batches=4",
        "benchmark=True",
        "log_every_n_steps=50",
        "torch.backends.cuda.matmul.allow_tf32 = True",
        "torch.backends.cudnn.allow_tf32 = True",
        "torch.set_num_threads(8)",
        '#   compile: max-autotune -> in __init__ (or configure_model): self.net = torch.compile(self.net, mode="max-autotune")',
        "channels_last",
        "fused=True",
        "batch_size=128",
        "num_workers=8",
    ]:
        assert needle in text, needle


def test_hf_training_arguments(tmp_path):
    device, settings = COMBOS["everything"]
    text = render_export(_best(tmp_path, device=device, **settings), "hf")
    for needle in [
        "TrainingArguments(",
        "per_device_train_batch_size=128",
        "gradient_accumulation_steps=4",
        "fp16=True",
        "tf32=True",
        "dataloader_num_workers=8",
        "# pin_memory: true -> the Trainer pins towards CUDA by default",
        "dataloader_persistent_workers=True",
        "dataloader_prefetch_factor=2",
        "torch_compile=True",
        'torch_compile_mode="max-autotune"',
        "logging_steps=50",
        'optim="adamw_torch_fused"',
        "torch.backends.cudnn.benchmark = True",
        "torch.set_num_threads(8)",
    ]:
        assert needle in text, needle
    assert "bf16=True" not in text
    assert "dataloader_drop_last=True" in text  # compiled: every batch the same shape


def test_hf_without_workers_or_compile(tmp_path):
    text = render_export(_best(tmp_path, device="cpu", amp="bf16", pin_memory=False), "hf")
    code = "\n".join(_code_lines(text))
    assert "bf16=True" in code and "fp16=True" not in code
    assert "use_cpu=True" in code
    assert "dataloader_pin_memory" not in code  # use_cpu=True turns the Trainer's pinning off
    assert "dataloader_prefetch_factor" not in code and "dataloader_persistent_workers" not in code
    assert "torch_compile" not in code
    # sync_every: 1 is trainopt's default, no decision: the Trainer's own logging cadence stays.
    assert "logging_steps" not in code and "logging_nan_inf_filter" not in code
    assert "sync_every: 1 -> trainopt's default, not a decision" in text


def test_hf_compile_default_mode_and_no_logging(tmp_path):
    code = "\n".join(_code_lines(render_export(_best(tmp_path, compile="default", sync_every=0), "hf")))
    assert "torch_compile=True" in code and "torch_compile_mode" not in code
    assert 'logging_strategy="no"' in code
    assert "logging_nan_inf_filter=False" in code


def test_yaml_round_trips(tmp_path):
    device, settings = COMBOS["everything"]
    text = render_export(_best(tmp_path, device=device, **settings), "yaml")
    out = tmp_path / "exported.yaml"
    out.write_text(text)
    loaded = load_settings(out, warn=False)
    assert loaded.device == "cuda:1"
    assert loaded.settings == {**default_settings(), **settings}


def test_folder_is_accepted(tmp_path):
    _best(tmp_path, amp="bf16")
    assert "amp: bf16" in render_export(tmp_path, "yaml")


def test_missing_path(tmp_path):
    with pytest.raises(ExportError, match="no such file or folder") as err:
        render_export(tmp_path / "nope", "torch")
    assert isinstance(err.value, UserError)


def test_folder_without_best_yaml(tmp_path):
    with pytest.raises(ExportError, match="no best.yaml in this folder; run `trainopt search"):
        render_export(tmp_path, "torch")


def test_unknown_format(tmp_path):
    with pytest.raises(ExportError, match="'jax' is not one of torch, lightning, hf, yaml"):
        render_export(_best(tmp_path), "jax")


def test_invalid_best_yaml_is_a_settings_error(tmp_path):
    path = tmp_path / "best.yaml"
    path.write_text("settings: {amp: fp8}\n")
    with pytest.raises(SettingsError, match="settings.amp: 'fp8' is not one of off, bf16, fp16"):
        render_export(tmp_path, "torch")


def test_cli_export(tmp_path, capsys):
    from trainopt.cli import main

    _best(tmp_path, amp="bf16")
    assert main(["export", str(tmp_path), "--format", "lightning"]) == 0
    assert 'precision="bf16-mixed"' in capsys.readouterr().out
    assert main(["export", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
