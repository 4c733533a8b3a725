"""The example training script applies best.yaml for real, in its own process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_with_best.py"


def _run(args, timeout=300):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.integration
def test_example_trains_with_best_yaml(tmp_path):
    best = tmp_path / "best.yaml"
    best.write_text(
        yaml.safe_dump(
            {
                "schema_version": 1,
                "kind": "trainopt-settings",
                "device": "cpu",
                "settings": {
                    "amp": "bf16",
                    "channels_last": True,
                    "num_workers": 1,
                    "batch_size": 8,
                    "grad_accum": 2,
                    "sync_every": 2,
                },
            }
        )
    )
    report_path = tmp_path / "report.json"
    proc = _run([best, "--steps", 4, "--width", 16, "--report-json", report_path])
    assert proc.returncode == 0, proc.stderr
    report = json.loads(report_path.read_text())
    assert report["num_workers"] == 1
    assert report["batch_size"] == 8
    assert report["autocast_dtype"] == "torch.bfloat16"
    assert report["channels_last_weights"] is True
    # cudnn_benchmark left at false; tf32 left at null: PyTorch's defaults (matmul off, cuDNN on).
    assert report["backend_flags"] == {"cudnn.benchmark": False, "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": True}
    assert report["steps"] == 4
    assert report["micro_batches"] == 8
    assert math.isfinite(report["final_loss"])
    # The loss is read after optimizer steps 2 and 4 only (sync_every: 2).
    assert [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("step ")] == ["2/4", "4/4"]


@pytest.mark.integration
def test_example_reports_a_bad_file_without_traceback(tmp_path):
    best = tmp_path / "best.yaml"
    best.write_text("settings: {amp: fp8}\n")
    proc = _run([best, "--steps", 1])
    assert proc.returncode == 2
    assert "settings.amp: 'fp8' is not one of off, bf16, fp16" in proc.stderr
    assert "Traceback" not in proc.stderr


def _search(tmp_path, cli_env, **overrides) -> Path:
    """Run a real `trainopt search` on the tiny spec; return the best.yaml it wrote."""
    from tests.conftest import tiny_spec_dict

    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(**overrides), sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "trainopt", "search", str(spec), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, env=cli_env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "best.yaml"


SEARCHES = {
    "single-process": {"search": {"amp": ["off", "bf16"]}},
    "data-parallel": {"distributed": {"nproc_per_node": 2, "backend": "gloo"}},
}


@pytest.mark.integration
@pytest.mark.parametrize("kind", sorted(SEARCHES))
def test_example_trains_with_every_best_yaml_a_search_writes(tmp_path, cli_env, kind):
    best = _search(tmp_path, cli_env, **SEARCHES[kind])
    written = yaml.safe_load(best.read_text())
    report_path = tmp_path / "report.json"
    # Started as a plain script: data-parallel settings start themselves under torchrun.
    proc = _run([best, "--steps", 3, "--width", 8, "--dataset-size", 256, "--report-json", report_path])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(report_path.read_text())
    world = (written.get("distributed") or {}).get("nproc_per_node", 1)
    assert report["world_size"] == world and report["ddp"] == (world > 1)
    assert report["steps"] == 3 and report["batch_size"] == written["settings"]["batch_size"]
    assert report["final_loss_finite"]
    assert report["autocast_dtype"] == {"off": "torch.float32", "bf16": "torch.bfloat16"}[written["settings"]["amp"]]
    if world > 1:
        assert "measured data-parallel on 2 processes; starting: torchrun" in proc.stderr
        # Only rank 0 prints.
        assert sum(line.startswith("trained ") for line in proc.stdout.splitlines()) == 1
    else:
        _train_in_both_frameworks(best, tmp_path)


def _train_in_both_frameworks(best: Path, tmp_path: Path) -> None:
    """The same best.yaml, unedited, trains in Lightning's Trainer and Hugging Face's Trainer."""
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from tests.integration.test_framework_hf import build_trainer
    from tests.integration.test_framework_lightning import fit
    from trainopt.settings.production import load_settings

    s = load_settings(best, warn=False)
    trainer, _ = fit(s)
    assert trainer.global_step == 3
    hf = build_trainer(s, tmp_path / "hf")
    hf.train()
    assert hf.state.global_step == 3 and hf.args.use_cpu
