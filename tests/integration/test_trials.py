"""Real trial processes: every status a trial can end with, through `trainopt measure --json`."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import FIXTURES, tiny_spec_dict

pytestmark = pytest.mark.integration


def measure(write_spec, cli_env, spec, *sets, timeout=180):
    path = write_spec(spec)
    out = path.parent / "out"
    cmd = [sys.executable, "-m", "trainopt", "measure", str(path), "--json", "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=cli_env, timeout=timeout, cwd=path.parent)
    data = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else None
    return proc, data, out


def faulty_spec(model_args=None, data_args=None, **overrides):
    spec = tiny_spec_dict(**overrides)
    spec["model"] = {"name": f"{FIXTURES / 'faulty.py'}:model", "args": model_args or {}}
    spec["data"] = {"name": f"{FIXTURES / 'faulty.py'}:data", "args": data_args or {}}
    return spec


def test_ok_trial_reports_every_required_field(write_spec, cli_env):
    proc, r, out = measure(write_spec, cli_env, tiny_spec_dict(), "batch_size=32", "num_workers=1")
    assert proc.returncode == 0, proc.stderr
    assert r["status"] == "ok" and r["error"] is None
    assert r["settings"]["batch_size"] == 32 and r["settings"]["num_workers"] == 1
    assert len(r["windows"]) == 4 and all(w > 0 for w in r["windows"])
    kept = r["windows"][r["steady_from"]:]
    assert r["median"] == pytest.approx(statistics.median(kept))
    q1, _, q3 = statistics.quantiles(kept, n=4, method="inclusive")
    assert r["iqr"] == pytest.approx(q3 - q1)
    # Throughput and step time describe the same kept windows: samples per step / step time.
    assert r["samples_per_s"] == pytest.approx(32 / r["step_time_s"])
    assert min(kept) <= r["samples_per_s"] <= max(kept)
    assert 0 <= r["data_wait_fraction"] < 1
    assert r["peak_memory_bytes"] > 50 * 2**20  # at least the interpreter with torch
    assert r["warmup_s"] >= 0.2  # measure.warmup_seconds of the tiny spec
    assert r["compile_s"] is None  # compile: off
    assert r["grad_scaler"] is None  # amp: off
    assert r["steps"] >= 3 + 4 * r["window_steps"]  # warm-up steps (at least 3) and the timed ones
    assert r["env"]["torch"] and r["env"]["device_type"] == "cpu" and r["env"]["cpu_model"]
    assert r["first_loss"] is not None and r["last_loss"] is not None
    # The resolved spec and the result are saved beside each other; the child's output went to a log.
    assert (out / "spec.resolved.yaml").exists() and (out / "result.json").exists()
    assert (out / "logs" / "measure.log").exists()


def test_real_out_of_memory_under_a_memory_cap(write_spec, cli_env):
    spec = tiny_spec_dict(
        model={"name": "mlp", "args": {"hidden": 16384, "layers": 2}},
        data={"name": "synthetic-tabular", "args": {"size": 256, "features": 4096}},
        limits={"memory_gb": 2.0},
    )
    proc, r, _ = measure(write_spec, cli_env, spec)
    assert proc.returncode == 1
    assert r["status"] == "oom", r["error"]
    assert "allocate" in r["error"].lower() or "memory" in r["error"].lower()
    # The same cap with a small model is fine: the cap, not the machine, made the OOM.
    small = tiny_spec_dict(limits={"memory_gb": 2.0})
    proc, r, _ = measure(write_spec, cli_env, small)
    assert r["status"] == "ok", r["error"]


def test_timeout_stops_the_trial(write_spec, cli_env):
    spec = faulty_spec({"fault": "hang"}, measure={"trial_timeout_s": 8})
    start = time.monotonic()
    proc, r, _ = measure(write_spec, cli_env, spec)
    assert r["status"] == "timeout"
    assert time.monotonic() - start < 40


@pytest.mark.parametrize("fault,expect", [("segfault", "SIGSEGV"), ("abort", "SIGABRT"), ("exit3", "code 3")])
def test_crashed_child_is_classified_with_its_signal_or_code(write_spec, cli_env, fault, expect):
    proc, r, _ = measure(write_spec, cli_env, faulty_spec({"fault": fault}))
    assert proc.returncode == 1
    assert r["status"] == "crashed"
    assert expect in r["error"]


def test_nonfinite_loss(write_spec, cli_env):
    proc, r, _ = measure(write_spec, cli_env, faulty_spec({"fault": "nan"}))
    assert r["status"] == "nonfinite"
    assert "nan" in r["error"].lower()


def test_error_in_a_user_factory_keeps_the_traceback_in_the_log(write_spec, cli_env):
    spec = faulty_spec()
    spec["model"]["name"] = f"{FIXTURES / 'faulty.py'}:broken_model"
    proc, r, out = measure(write_spec, cli_env, spec)
    assert proc.returncode == 1
    assert r["status"] == "error"
    assert r["error"] == "ValueError: layer sizes do not match: 16 != 17"
    log = (out / "logs" / "measure.log").read_text()
    assert "Traceback" in log and "broken_model" in log


def test_not_applicable_knob_is_reported_not_run(write_spec, cli_env):
    proc, r, _ = measure(write_spec, cli_env, tiny_spec_dict(), "pin_memory=true")
    assert r["status"] == "not_applicable"
    assert "CUDA" in r["error"]
    proc, r, _ = measure(write_spec, cli_env, tiny_spec_dict(), "channels_last=true")
    assert r["status"] == "not_applicable"
    assert "image" in r["error"]


def _orphans(marker: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_hung_loader_worker_times_out_and_leaves_no_orphans(write_spec, cli_env):
    spec = faulty_spec(data_args={"fault": "worker-hang"}, measure={"trial_timeout_s": 10})
    proc, r, out = measure(write_spec, cli_env, spec, "num_workers=2")
    assert r["status"] == "timeout"
    time.sleep(0.5)
    # Forked loader workers keep the trial process's command line, so this finds both.
    assert _orphans(str(out / "trials" / "measure.request.json")) == []


def test_killed_loader_worker_is_an_error_with_the_loader_message(write_spec, cli_env):
    spec = faulty_spec(data_args={"fault": "worker-killed"})
    proc, r, _ = measure(write_spec, cli_env, spec, "num_workers=2")
    assert r["status"] in ("error", "crashed")
    assert "worker" in r["error"].lower()
