"""fp16 with a GradScaler in a real trial process on the CPU: the loss is scaled, and unscaled before the step."""

from __future__ import annotations

import math

import pytest

from tests.conftest import FIXTURES, tiny_spec_dict
from trainopt.contract.protocol import TrialRequest
from trainopt.contract.spec import load_spec
from trainopt.execute.runner import SubprocessRunner

pytestmark = pytest.mark.integration


def _run_trial(tmp_path, write_spec, settings, **spec_overrides):
    path = write_spec(tiny_spec_dict(**spec_overrides))
    spec = load_spec(path)
    request = TrialRequest(
        spec=spec.resolved(),
        source_dir=str(spec.source_dir()),
        settings={**spec.baseline, **settings},
        mode="measure",
        result_path=str(tmp_path / "result.json"),
        trial_id="fp16",
    )
    return SubprocessRunner().run(request, tmp_path / "trial.log", 120)


def test_fp16_trial_scales_skips_overflows_and_unscales(tmp_path, write_spec):
    ref = f"{FIXTURES / 'regression.py'}"
    result = _run_trial(
        tmp_path,
        write_spec,
        {"amp": "fp16", "grad_accum": 2},
        model={"name": f"{ref}:model", "args": {}},
        data={"name": f"{ref}:data", "args": {}},
        loss="mse",
        optimizer={"name": "sgd", "args": {"lr": 0.0005}},
    )
    assert result.status == "ok", (result.error, (tmp_path / "trial.log").read_text()[-2000:])
    scaler = result.grad_scaler
    assert scaler is not None, "an fp16 trial reports its GradScaler"
    assert scaler["initial_scale"] == 65536.0
    # The scale halves once per step skipped for overflowing fp16 gradients and grows only
    # after growth_interval clean steps, so the skipped steps are counted exactly.
    assert scaler["optimizer_steps"] < scaler["growth_interval"]
    skipped = math.log2(scaler["initial_scale"] / scaler["scale"])
    assert skipped == int(skipped) and skipped >= 1, scaler
    assert scaler["optimizer_steps"] == result.steps > skipped + 5
    # The steps after the skips were unscaled: a step with 2**k-times gradients at this
    # learning rate would blow the loss up; instead it finishes finite and lower.
    assert math.isfinite(result.last_loss) and result.last_loss < result.first_loss


def test_trial_without_fp16_reports_no_scaler(tmp_path, write_spec):
    result = _run_trial(tmp_path, write_spec, {"amp": "bf16"})
    assert result.status == "ok", result.error
    assert result.grad_scaler is None
    assert result.settings["amp"] == "bf16"
