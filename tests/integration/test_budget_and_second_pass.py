"""Through the real CLI: a time budget that leaves stages out, what the win is worth, and a second
batch pass under a real memory cap (float32 runs out of memory where bf16 autocast fits)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, tiny_spec_dict

pytestmark = pytest.mark.integration

FAST = {"pairs": 3, "max_pairs": 4, "confidence": 0.75}


def _search(spec: dict, tmp_path: Path, env: dict, *extra: str) -> tuple[subprocess.CompletedProcess, dict, Path]:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "trainopt", "search", str(path), "--out", str(out), "--quiet", *extra],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads((out / "results.json").read_text()), out


def test_a_budget_too_short_for_any_stage_leaves_them_out_and_still_ends_checked(tmp_path, cli_env):
    spec = tiny_spec_dict(search={"amp": ["off", "bf16"], "sync_every": [1, 0]},
                          run={"steps": 1000, "device_hour_cost": 3.0, "currency": "EUR"})
    spec["measure"].update(FAST)
    proc, doc, out = _search(spec, tmp_path, cli_env, "--time-budget", "1s")
    assert doc["complete"] and doc["missing"] == []
    assert doc["time_budget"]["budget_s"] == 1.0
    left_out = doc["time_budget"]["not_tried"]
    assert sorted(n["knob"] for n in left_out) == ["amp", "sync_every"]
    assert all(n["reason"] == "not tried (time budget)" and n["eta_s"] > 0 for n in left_out)
    # Nothing but the baseline ran: no stage started.
    assert {t["role"] for t in doc["trials"]} == {"baseline"} and doc["decisions"] == []
    assert "budget: amp: not tried (time budget)" in proc.stdout
    assert "Not tried (time budget)" in (out / "report.html").read_text()
    # The run block: hours at the baseline, nothing saved, the search's own cost.
    worth = doc["worth"]
    assert worth["basis"] == "run" and worth["steps"] == 1000 and worth["money"]["currency"] == "EUR"
    assert worth["baseline_hours"] == pytest.approx(1000 * 16 / doc["baseline"]["samples_per_s"] / 3600)
    assert "the run (1,000 steps):" in proc.stdout and "EUR per device-hour" in proc.stdout
    best = yaml.safe_load((out / "best.yaml").read_text())
    assert best["provenance"]["worth"]["baseline_hours"] == pytest.approx(worth["baseline_hours"])


def test_a_deprecated_run_length_gets_a_note_and_no_run_block_gives_time_per_1000_steps(tmp_path, cli_env):
    spec = tiny_spec_dict(run_length_steps=5000)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    proc = subprocess.run([sys.executable, "-m", "trainopt", "validate", str(path)], capture_output=True, text=True,
                          env=cli_env, timeout=120)
    assert proc.returncode == 0
    assert "note: run_length_steps is deprecated; write run: {steps: 5000} instead" in proc.stderr
    spec = tiny_spec_dict()
    spec["measure"].update(FAST)
    proc, doc, _ = _search(spec, tmp_path, cli_env)
    assert doc["worth"]["basis"] == "per_steps" and doc["worth"]["money"] is None
    assert "time per 1,000 steps:" in proc.stdout and "device-hour" not in proc.stdout


PLANTED = ROOT / "tests" / "fixtures" / "memory_planted.py"


def memory_planted_spec() -> dict:
    """The workload of benchmarks/RESULTS.md's second-pass figures."""
    return {
        "name": "memory-planted",
        "device": "cpu",
        "model": {"name": f"{PLANTED}:wide_mlp_with_fixed_cost", "args": {"features": 256, "fixed": 256, "host_ms": 300}},
        "data": {"name": f"{PLANTED}:in_memory_tabular", "args": {"size": 8192, "features": 256}},
        "loss": "cross_entropy",
        "optimizer": {"name": "sgd", "args": {"lr": 0.05}},
        "baseline": {"batch_size": 1024, "threads": 1},
        "search": {"batch_size": {"max": 8192, "max_candidates": 2}, "amp": ["off", "bf16"]},
        "search_order": "as_written",
        # An address-space cap: float32 runs out of memory below 4096 samples, bf16 fits them.
        "limits": {"memory_gb": 1.1},
        "run": {"steps": 100000, "device_hour_cost": 2.5, "currency": "USD"},
        "measure": {"warmup_steps": 2, "warmup_seconds": 0.2, "window_seconds": 0.3, "windows": 4,
                    "trial_timeout_s": 120, **FAST},
    }


def test_bf16_frees_memory_under_a_real_cap_and_the_batch_is_searched_again(tmp_path, cli_env):
    proc, doc, out = _search(memory_planted_spec(), tmp_path, cli_env)
    first = doc["batch_size"]
    oom_fp32 = min(p["size"] for p in first["probes"] if not p["fits"] and p["status"] == "oom")
    amp = [d for d in doc["decisions"] if d["knob"] == "amp"]
    assert [d["kept"] for d in amp] == [True], amp
    # One real probe under the same cap: bf16 fits the size that ran float32 out of memory.
    edge = first["edge_probe"]
    assert edge["size"] == oom_fp32 and edge["fits"] and edge["after"]["knob"] == "amp"
    assert [t["settings"]["amp"] for t in doc["trials"] if t["tag"] == f"edge-{oom_fp32}"] == ["bf16"]
    second = first["second_pass"]
    assert second["probed_from"] == oom_fp32 and second["max_fitting"] > first["max_fitting"]
    assert all(p["pass"] == 2 for p in second["probes"])
    assert any(d["extra"].get("batch_pass") == 2 for d in doc["decisions"])
    assert "batch (second pass)" in (out / "speedups.csv").read_text()
    assert 'id="batch-second-pass"' in (out / "report.html").read_text()
