"""The fault matrix inside real searches: each fault is classified, the search goes on,
nothing is lost, and no process is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import FIXTURES, tiny_spec_dict

pytestmark = pytest.mark.integration

FAULTY = str(FIXTURES / "faulty.py")


def run_search(tmp_path: Path, spec: dict, env: dict, timeout: float = 600):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "trainopt", "search", str(path), "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    doc = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else None
    return proc, doc, out


def leftover_processes(out: Path) -> list[int]:
    """Trial processes (and their forked loader workers) still alive for this output folder."""
    time.sleep(0.5)
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["pid"] != os.getpid() and str(out) in " ".join(p.info["cmdline"] or []):
                found.append(p.info["pid"])
        except psutil.Error:
            pass
    return found


def test_each_failing_candidate_gets_its_status_and_the_search_goes_on(tmp_path, cli_env):
    spec = tiny_spec_dict(
        model={"name": f"{FAULTY}:model", "args": {"fault_under_amp": "segfault", "fault_with_threads": "hang"}},
        data={"name": f"{FAULTY}:data", "args": {"fault": "worker-nan"}},
        search={
            "amp": ["off", "bf16"],          # segfault under autocast -> crashed
            "threads": [1, 2],               # hangs with two threads  -> timeout
            "num_workers": [0, 1],           # NaN from loader workers -> nonfinite
            "compile": ["off", "default"],   # no working C++ compiler -> error
            "pin_memory": [False, True],     # CUDA only               -> not_applicable
        },
        measure={"trial_timeout_s": 20},
    )
    env = dict(cli_env, CXX="/bin/false", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor-cache"))
    proc, doc, out = run_search(tmp_path, spec, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdicts = {d["knob"]: d for d in doc["decisions"]}
    assert verdicts["amp"]["verdict"] == "crashed" and "SIGSEGV" in verdicts["amp"]["reason"]
    assert verdicts["threads"]["verdict"] == "timeout"
    assert verdicts["num_workers"]["verdict"] == "nonfinite"
    assert verdicts["compile"]["verdict"] == "error" and "compiler" in verdicts["compile"]["reason"].lower()
    assert verdicts["pin_memory"]["verdict"] == "not_applicable"
    assert not any(d["kept"] for d in doc["decisions"])
    assert doc["best"]["settings"]["amp"] == "off" and doc["complete"]
    assert leftover_processes(out) == []


def test_real_oom_in_the_batch_search_means_does_not_fit(tmp_path, cli_env):
    # 64 Ki input features: a batch of b samples needs about b x 0.75 MiB for the input,
    # its collated copy and its gradient, so the cap is crossed between 256 and 2048.
    spec = tiny_spec_dict(
        model={"name": "mlp", "args": {"hidden": 8, "layers": 1}},
        data={"name": "synthetic-tabular", "args": {"size": 4096, "features": 65536}},
        baseline={"batch_size": 64, "threads": 1},
        search={"batch_size": {"max": 4096, "max_candidates": 1}},
        limits={"memory_gb": 2.0},
        measure={"pairs": 3, "max_pairs": 4},
    )
    proc, doc, out = run_search(tmp_path, spec, cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probes = doc["batch_size"]["probes"]
    assert any(p["status"] == "oom" for p in probes), probes
    assert all(p["status"] in ("ok", "oom") for p in probes)
    fit, fail = doc["batch_size"]["max_fitting"], min(p["size"] for p in probes if not p["fits"])
    assert 64 <= fit < fail <= 4096
    assert fail - fit <= max(0.05 * fit, 8)
    assert doc["batch_size"]["safe_max"] < fit
    assert doc["best"]["settings"]["batch_size"] <= doc["batch_size"]["safe_max"]


def test_failing_baseline_exits_1_with_what_to_fix_and_keeps_results(tmp_path, cli_env):
    spec = tiny_spec_dict(model={"name": f"{FAULTY}:model", "args": {"fault": "raise"}}, search={"amp": ["off", "bf16"]},
                          data={"name": f"{FAULTY}:data", "args": {}})
    proc, doc, out = run_search(tmp_path, spec, cli_env)
    assert proc.returncode == 1
    assert "baseline" in proc.stderr and "user code failed mid-training" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert doc is not None and doc["complete"] is False
    assert doc["baseline"]["status"] == "error"
    log = next((out / "logs").glob("*baseline*.log")).read_text()
    assert "Traceback" in log and "faulty.py" in log


def test_a_factory_reference_that_does_not_import_is_bad_input(tmp_path, cli_env):
    spec = tiny_spec_dict(model={"name": "no_such_module_xyz:make", "args": {}})
    proc, doc, out = run_search(tmp_path, spec, cli_env)
    assert proc.returncode == 2
    assert "model.name 'no_such_module_xyz:make'" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()
