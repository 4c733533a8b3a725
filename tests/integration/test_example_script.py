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
