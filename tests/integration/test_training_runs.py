"""The training check for real: trial processes that train, searches of planted workloads through the CLI, verify."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FIXTURES, tiny_spec_dict
from trainopt.contract.protocol import TrialRequest
from trainopt.contract.spec import spec_from_dict
from trainopt.execute.runner import SubprocessRunner
from trainopt.knobs import catalog as knobs

pytestmark = pytest.mark.integration

CODE = FIXTURES / "numerics.py"
FAST = {"warmup_steps": 2, "warmup_seconds": 0.1, "window_seconds": 0.1, "windows": 3, "pairs": 3, "max_pairs": 4,
        "confidence": 0.75, "trial_timeout_s": 120}


def planted(tmp_path: Path, search: dict, **model_args) -> Path:
    """A spec of the planted CNN (SGD at 0.05 with momentum: fp32 learns the patterns in 40 steps)."""
    data = tiny_spec_dict(
        name="planted", model={"name": f"{CODE}:ShiftedCNN", "args": model_args},
        data={"name": f"{CODE}:Patterns", "args": {"size": 512}},
        optimizer={"name": "sgd", "args": {"lr": 0.05, "momentum": 0.9}}, search=search, measure=FAST)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainopt", *map(str, args)], capture_output=True, text=True, timeout=timeout)


def train(tmp_path: Path, spec_path: Path, settings: dict, order_seed: int, name: str) -> dict:
    spec = spec_from_dict(yaml.safe_load(spec_path.read_text()), str(spec_path), tmp_path)
    request = TrialRequest(spec=spec.resolved(), source_dir=str(tmp_path), settings={**knobs.default_settings(), **settings},
                           mode="train", result_path=str(tmp_path / f"{name}.result.json"),
                           training={"steps": 12, "order_seed": order_seed})
    result = SubprocessRunner().run(request, tmp_path / f"{name}.log", 120)
    assert result.ok, result.error
    return result.training


def test_runs_in_one_data_order_are_identical_another_order_is_not_and_nan_stops_a_run(tmp_path):
    spec = planted(tmp_path, {}, nan_when="channels_last")
    base = {"batch_size": 16, "threads": 1}
    a = train(tmp_path, spec, base, 0, "a")
    b = train(tmp_path, spec, {**base, "num_workers": 1}, 0, "b")
    twin = train(tmp_path, spec, base, 1, "twin")
    assert len(a["losses"]) == 12 and a["losses"] == b["losses"] and a["losses"] != twin["losses"]
    assert a["order_seed"] == 0 and a["scaler_skipped"] is None
    broken = train(tmp_path, spec, {**base, "channels_last": True}, 0, "nan")
    assert broken["losses"] == [None]


def test_a_search_leaves_out_the_change_that_does_not_learn_and_keeps_the_harmless_one(tmp_path):
    spec = planted(tmp_path, {"amp": ["off", "bf16"], "channels_last": [False, True]},
                   shift=1024.0, slow_ms={"autocast": 8.0, "channels_last": 5.0})
    out = tmp_path / "out"
    done = cli("search", spec, "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    kept = {d["knob"]: d for d in doc["decisions"] if d["kept"]}
    assert set(kept) == {"amp", "channels_last"}, doc["decisions"]
    check = doc["training_check"]
    first = check["rounds"][0]
    assert first["verdict"] == "worse"
    assert {a["knob"]: a["verdict"] for a in first["alone"]} == {"amp": "worse", "channels_last": "same"}
    assert [d["knob"] for d in check["dropped"]] == ["amp"] and check["verdict"] == "same"
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["settings"]["amp"] == "off" and best["settings"]["channels_last"] is True
    reason = best["provenance"]["training_check"]["left_out"][0]["reason"]
    alone = next(a for a in first["alone"] if a["knob"] == "amp")
    assert f"{alone['candidate_tail']:.4g}" in reason and f"{alone['reference_tail']:.4g}" in reason
    assert "left out of best.yaml (faster, but trains differently): amp=bf16" in done.stdout
    # verify: the recommended settings hold today; bf16 on top of the baseline does not train.
    ok = cli("verify", out, "--quiet")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "verify planted: holds" in ok.stdout and "training check: same" in ok.stdout
    bad = cli("verify", out, "--set", "amp=bf16", "--json")
    assert bad.returncode == 1, bad.stderr
    report = json.loads(bad.stdout)
    assert report["training_check"]["verdict"] == "worse" and report["speed_holds"] and not report["ok"]
    assert report["recorded"]["speedup"] == pytest.approx(doc["speedup"])


def test_settings_whose_loss_turns_non_finite_fail_verify_as_diverged(tmp_path):
    # Timed trials already refuse a loss that is non-finite at a window's end, so the search
    # never keeps such a change; verify is where settings from elsewhere get checked.
    spec = planted(tmp_path, {"channels_last": [False, True]}, slow_ms={"channels_last": 8.0}, nan_when="channels_last")
    out = tmp_path / "out"
    done = cli("search", spec, "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    doc = json.loads((out / "results.json").read_text())
    assert not [d for d in doc["decisions"] if d["kept"]] and doc["best"]["settings"]["channels_last"] is False
    bad = cli("verify", out, "--set", "channels_last=true", "--json")
    assert bad.returncode == 1, bad.stderr
    report = json.loads(bad.stdout)
    assert report["training_check"]["verdict"] == "diverged" and "non-finite" in report["training_check"]["reason"]
    assert not report["speed_holds"] and report["speed"]["verdict"] == "nonfinite"


def test_verify_refuses_bad_input_with_one_message(tmp_path):
    missing = cli("verify", tmp_path / "nowhere")
    assert missing.returncode == 2 and "no best.yaml here" in missing.stderr and "Traceback" not in missing.stderr


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("example", ["your_code_pairs", "your_code_text", "your_code_scenes", "your_code_lightning",
                                     "your_code_hf"])
def test_every_form_of_training_code_trains_the_check_reproducibly(tmp_path, example):
    """Pairs and a named loss, loss: model, step:, a LightningModule, a Hugging Face model: one order, one trace."""
    from trainopt.contract.spec import load_spec

    spec = load_spec(EXAMPLES / f"{example}.yaml")
    settings = {**spec.baseline, "threads": 1}

    def run(order_seed: int, name: str) -> list:
        request = TrialRequest(spec=spec.resolved(), source_dir=str(EXAMPLES), settings=settings, mode="train",
                               result_path=str(tmp_path / f"{name}.result.json"), training={"steps": 6, "order_seed": order_seed})
        result = SubprocessRunner().run(request, tmp_path / f"{name}.log", 300)
        assert result.ok, f"{result.error} (log: {(tmp_path / f'{name}.log').read_text()[-2000:]})"
        return result.training["losses"]

    first, again, other = run(0, "first"), run(0, "again"), run(1, "other")
    assert len(first) == 6 and all(isinstance(v, float) for v in first)
    assert first == again and first != other


def test_a_data_parallel_run_reports_the_mean_loss_over_its_ranks(tmp_path):
    data = tiny_spec_dict(distributed={"nproc_per_node": 2, "backend": "gloo"}, baseline={"batch_size": 8, "threads": 1})
    spec = spec_from_dict(data, "ddp.yaml", tmp_path)

    def run(order_seed: int, name: str) -> dict:
        request = TrialRequest(spec=spec.resolved(), source_dir=str(tmp_path), settings=dict(spec.baseline), mode="train",
                               result_path=str(tmp_path / f"{name}.result.json"), training={"steps": 5, "order_seed": order_seed})
        result = SubprocessRunner().run(request, tmp_path / f"{name}.log", 300)
        assert result.ok, result.error
        assert result.world_size == 2
        return result.training

    a, b = run(0, "a"), run(0, "b")
    assert len(a["losses"]) == 5 and a["losses"] == b["losses"] and a["order_seed"] == 0
