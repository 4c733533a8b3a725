"""The framework dict API as pure data: which keyword arguments the settings give Lightning and Hugging Face.

No framework is imported here; ``tests/integration/test_framework_*.py`` build the real
``Trainer`` and ``TrainingArguments`` from the same kwargs and train with them.
"""

from __future__ import annotations

import ast
import re

import pytest

from trainopt.knobs.catalog import KNOBS
from trainopt.settings.export import render_settings
from trainopt.settings.frameworks import Call, FrameworkError, framework_args
from trainopt.settings.production import TrainSettings
from trainopt.settings.record import validate_record

GLOO = {"nproc_per_node": 2, "backend": "gloo"}


def rec(device="cpu", env=None, kept=(), distributed=None, **settings):
    provenance = {"kept": [{"knob": k, "from": f, "to": t} for k, f, t in kept]}
    if env:
        provenance["env"] = {"device_type": env}
    return validate_record(device, settings, provenance, distributed=distributed)


def kw(record, fw, device_type="cpu", buffer_kwarg="forward_sync_buffers"):
    return framework_args(record, fw, device_type, buffer_kwarg).kwargs()


def missing(record, fw, device_type="cpu", buffer_kwarg="forward_sync_buffers"):
    return {u.setting: u for u in framework_args(record, fw, device_type, buffer_kwarg).unexpressed}


# ---- what counts as established ------------------------------------------------------------

def test_established_is_what_the_search_kept_or_set_off_the_default():
    r = rec(amp="bf16", kept=[("sync_every", 10, 1)])
    assert r.established == {"amp", "sync_every"}
    assert rec().established == frozenset()


@pytest.mark.parametrize("device, env, expected", [
    ("cpu", None, "cpu"), ("cuda:1", None, "cuda"), ("auto", "cpu", "cpu"), ("auto", "cuda", "cuda"), ("auto", None, None),
    ("cpu", "cuda", "cpu"),  # device: cpu trains on a CPU whatever a copied fingerprint says
])
def test_measured_device_type(device, env, expected):
    assert rec(device=device, env=env).measured_device_type == expected


# ---- the device ----------------------------------------------------------------------------

def test_use_cpu_whenever_the_measurement_ran_on_a_cpu():
    assert kw(rec(device="cpu", amp="bf16"), "hf")["use_cpu"] is True
    auto = framework_args(rec(device="auto", env="cpu", amp="bf16"), "hf", "cpu")
    assert auto.kwargs()["use_cpu"] is True and auto.kwargs()["bf16"] is True
    assert "device: auto, measured on cpu" in auto.arguments[0].note
    assert "use_cpu" not in kw(rec(device="auto", env="cuda"), "hf", "cuda")


def test_a_gpu_index_is_a_device_list_in_lightning_and_unexpressed_in_hf():
    r = rec(device="cuda:1")
    assert kw(r, "lightning", "cuda")["accelerator"] == "gpu" and kw(r, "lightning", "cuda")["devices"] == [1]
    assert "CUDA_VISIBLE_DEVICES=1" in missing(r, "hf", "cuda")["device"].instead
    assert kw(rec(device="auto", env="cpu"), "lightning")["accelerator"] == "cpu"


# ---- framework defaults stay unless the search established a value ----------------------------

def test_default_settings_change_no_framework_default_beyond_what_was_measured():
    r = rec()
    assert kw(r, "lightning") == {"accelerator": "cpu", "devices": 1}
    # No clipping was measured: the Trainer's own clips at 1.0.
    assert kw(r, "hf") == {"use_cpu": True, "per_device_train_batch_size": 32, "optim": "adamw_torch", "max_grad_norm": 0.0}


def test_the_default_sync_every_leaves_the_logging_cadence_alone():
    text = " ".join(a.note for a in framework_args(rec(), "hf", "cpu").arguments)
    assert "logging_steps (500) stays" in text
    assert "log_every_n_steps" not in kw(rec(), "lightning")


@pytest.mark.parametrize("every", [0, 5])
def test_sparse_loss_reads_turn_off_the_nan_filter(every):
    hf = kw(rec(sync_every=every), "hf")
    assert hf["logging_nan_inf_filter"] is False
    if every:
        assert hf["logging_steps"] == every and kw(rec(sync_every=every), "lightning")["log_every_n_steps"] == every
    else:
        assert hf["logging_strategy"] == "no"
        assert "never read the loss" in missing(rec(sync_every=0), "lightning")["sync_every"].reason


def test_a_kept_change_back_to_a_default_is_written():
    r = rec(kept=[("sync_every", 10, 1), ("amp", "bf16", "off")])
    assert kw(r, "hf")["logging_steps"] == 1 and "logging_nan_inf_filter" not in kw(r, "hf")
    assert kw(r, "lightning")["log_every_n_steps"] == 1
    assert kw(r, "lightning")["precision"] == "32-true"


# ---- precision -----------------------------------------------------------------------------

def test_fp16_on_a_cpu_keeps_fp16_in_lightning_with_its_scaler():
    lt = framework_args(rec(amp="fp16"), "lightning", "cpu")
    (plugin,) = lt.kwargs()["plugins"]
    assert (plugin.name, plugin.args) == ("MixedPrecision", ("16-mixed", "cpu"))
    assert dict(plugin.kwargs)["scaler"] == Call("torch.amp", "GradScaler", ("cpu",))
    assert "would train bf16 on a CPU" in next(a.note for a in lt.arguments if a.keyword == "plugins")
    assert kw(rec(device="cuda", amp="fp16"), "lightning", "cuda")["precision"] == "16-mixed"
    assert kw(rec(amp="fp16"), "hf")["fp16"] is True


# ---- the optimizer -------------------------------------------------------------------------

@pytest.mark.parametrize("impl, optim", [("default", "adamw_torch"), ("foreach", "adamw_torch"), ("fused", "adamw_torch_fused")])
def test_hf_optimizer_is_always_explicit(impl, optim):
    assert kw(rec(optimizer_impl=impl), "hf")["optim"] == optim
    # foreach: adamw_torch is foreach on CUDA; on a CPU it would be the per-parameter loop.
    assert ("optimizer_impl" in missing(rec(optimizer_impl=impl), "hf", "cpu")) == (impl == "foreach")
    assert "optimizer_impl" not in missing(rec(device="cuda", optimizer_impl=impl), "hf", "cuda")


def test_lightning_optimizer_kernels_go_to_configure_optimizers():
    assert "fused=True" in missing(rec(optimizer_impl="fused"), "lightning")["optimizer_impl"].instead
    assert "optimizer_impl" not in missing(rec(), "lightning")


# ---- compile -------------------------------------------------------------------------------

def test_lightning_compiles_the_inner_module():
    u = missing(rec(compile="max-autotune"), "lightning")["compile"]
    assert "self.net = torch.compile(self.net, mode='max-autotune')" in u.instead
    assert "self.log" in u.reason


def test_hf_compile_with_tf32_defaults_on_cuda_is_flagged():
    r = rec(device="cuda", compile="reduce-overhead")
    hf = kw(r, "hf", "cuda")
    assert hf["torch_compile"] is True and hf["torch_compile_mode"] == "reduce-overhead" and hf["dataloader_drop_last"] is True
    assert "switches TF32 on" in missing(r, "hf", "cuda")["tf32"].reason
    assert "tf32" not in missing(rec(compile="default"), "hf", "cpu")


def test_hf_tf32_is_written_on_cuda_only():
    assert kw(rec(device="cuda", tf32=True), "hf", "cuda")["tf32"] is True
    assert "tf32" not in kw(rec(device="cpu", tf32=False), "hf", "cpu")


# ---- data parallel -------------------------------------------------------------------------

def test_ddp_buffer_argument_uses_the_installed_name():
    r = rec(distributed=GLOO, ddp_broadcast_buffers=False, ddp_bucket_cap_mb=4)
    strategy = kw(r, "lightning")["strategy"]
    assert strategy.name == "DDPStrategy"
    assert dict(strategy.kwargs) == {"process_group_backend": "gloo", "bucket_cap_mb": 4, "forward_sync_buffers": False}
    old = kw(r, "lightning", buffer_kwarg="broadcast_buffers")["strategy"]
    assert dict(old.kwargs)["broadcast_buffers"] is False and "forward_sync_buffers" not in dict(old.kwargs)
    # The Trainer can pass only the old name: unexpressed where torch renamed it, written where it did not.
    assert "forward_sync_buffers" in missing(r, "hf")["ddp_broadcast_buffers"].instead
    assert kw(r, "hf", buffer_kwarg="broadcast_buffers")["ddp_broadcast_buffers"] is False


def test_hf_ddp_fields():
    r = rec(distributed=GLOO, ddp_static_graph=True, ddp_gradient_as_bucket_view=True)
    hf = kw(r, "hf")
    # The Trainer's default find_unused_parameters is True: the measured False is written.
    assert hf["ddp_find_unused_parameters"] is False and hf["ddp_backend"] == "gloo" and hf["ddp_static_graph"] is True
    assert "ddp_broadcast_buffers" not in hf
    assert "ddp_gradient_as_bucket_view" in missing(r, "hf")
    lt = kw(r, "lightning")
    assert lt["devices"] == 2 and dict(lt["strategy"].kwargs) == {
        "process_group_backend": "gloo", "gradient_as_bucket_view": True, "static_graph": True}


def test_auto_backend_is_left_to_the_framework():
    r = rec(distributed={"nproc_per_node": 2})
    assert "ddp_backend" not in kw(r, "hf")
    assert kw(r, "lightning")["strategy"].kwargs == ()


# ---- every knob is accounted for, and the export writes exactly these kwargs -------------------

COMBOS = {
    "defaults": dict(),
    "everything-cpu": dict(batch_size=8, grad_accum=2, amp="fp16", channels_last=True, num_workers=2, persistent_workers=True,
                           prefetch_factor=3, sync_every=4, optimizer_impl="foreach", threads=2, compile="default"),
    "ddp": dict(distributed=GLOO, ddp_bucket_cap_mb=2, ddp_gradient_as_bucket_view=True, ddp_broadcast_buffers=False,
                ddp_find_unused_parameters=True, sync_every=0),
}


@pytest.mark.parametrize("combo", sorted(COMBOS))
@pytest.mark.parametrize("fw", ["lightning", "hf"])
def test_every_knob_is_an_argument_a_comment_or_unexpressed(fw, combo):
    fa = framework_args(rec(**COMBOS[combo]), fw, "cpu")
    named = {n for a in fa.arguments for n in a.settings} | {u.setting for u in fa.unexpressed}
    assert set(KNOBS) <= named, set(KNOBS) - named


def _call_keywords(text, name):
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == name:
            return node.keywords
    raise AssertionError(f"no {name}( call")


def _value(node):
    if isinstance(node, ast.Call):
        return node.func.id
    if isinstance(node, ast.List):
        return [_value(e) for e in node.elts]
    return ast.literal_eval(node)


@pytest.mark.parametrize("combo", sorted(COMBOS))
@pytest.mark.parametrize("fw, call", [("lightning", "Trainer"), ("hf", "TrainingArguments")])
def test_the_export_writes_exactly_the_framework_kwargs(fw, call, combo):
    settings = dict(COMBOS[combo])
    distributed = settings.pop("distributed", None)
    s = TrainSettings("cpu", settings, distributed=distributed)
    expected = {k: (v.name if isinstance(v, Call) else [e.name for e in v] if k == "plugins" else v)
                for k, v in s.framework_args(fw).kwargs().items()}
    written = {k.arg: _value(k.value) for k in _call_keywords(render_settings(s, fw), call)}
    written.pop("output_dir", None)
    assert written == expected


def test_unexpressed_are_plain_records():
    (u,) = [u for u in TrainSettings("cpu", {"threads": 2}).unexpressed("hf")]
    assert u.as_dict() == {"setting": "threads", "value": "2", "reason": u.reason, "instead": u.instead}
    assert re.search(r"torch\.set_num_threads\(2\)", u.instead)


def test_unknown_framework_names_the_choices():
    with pytest.raises(FrameworkError, match="framework 'keras' is not one of lightning, hf"):
        TrainSettings("cpu").trainer_kwargs("keras")


def test_a_call_builds_nested_arguments():
    value = Call("fractions", "Fraction", (Call("fractions", "Fraction", (1, 3)),), (("denominator", 2),))
    from fractions import Fraction

    assert value.build() == Fraction(1, 6)


def test_plain_torch_ddp_export_uses_the_installed_buffer_name():
    from trainopt.settings.production import ddp_buffer_kwarg

    s = TrainSettings("cpu", {"ddp_broadcast_buffers": False}, distributed=GLOO)
    code = [line for line in render_settings(s, "torch").splitlines() if not line.lstrip().startswith("#")]
    name = ddp_buffer_kwarg()
    assert any(line.strip().startswith(f"{name}=False") for line in code)
    other = "broadcast_buffers" if name == "forward_sync_buffers" else "forward_sync_buffers"
    assert not any(line.strip().startswith(f"{other}=") for line in code)
