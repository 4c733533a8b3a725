"""A real optuna-dashboard server reads a search's study: it lists it and answers its parameter importances.

The study comes from a small search through the fake runner (``tests/fakes.py``) over an
SQLite file; the dashboard runs as its own process on a free port of 127.0.0.1 and is
stopped at the end (the integration conftest checks that nothing outlived the module).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner
from trainopt.contract.spec import spec_from_dict
from trainopt.search.search import Search
from trainopt.search.store import TrialStore, param_space

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {"body": exc.read().decode(errors="replace")}


def dashboard_command(url: str, port: int) -> list[str]:
    script = Path(sys.executable).parent / "optuna-dashboard"
    if not script.exists():
        pytest.fail("optuna-dashboard is not installed; pip install -e '.[test]'")
    return [sys.executable, str(script), url, "--host", "127.0.0.1", "--port", str(port), "--server", "wsgiref"]


@pytest.fixture
def searched_study(tmp_path):
    spec = spec_from_dict(
        tiny_spec_dict(search={"amp": ["off", "bf16"], "num_workers": [0, 2], "batch_size": {"max": 64}},
                       measure={"pairs": 4, "max_pairs": 8}),
        "t.yaml", tmp_path,
    )
    url = f"sqlite:///{tmp_path / 'trials.db'}"
    store = TrialStore(url, spec.name, spec.fingerprint(), space=param_space(spec))
    doc = Search(spec, tmp_path, FakeRunner({("amp", "bf16"): 1.5, ("num_workers", 2): 1.2}, seed=1), store).run()
    store.record_recommendation(doc["best"])
    store.close()
    return url, spec


@pytest.fixture
def dashboard(searched_study, tmp_path):
    url, spec = searched_study
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")
    proc = subprocess.Popen(dashboard_command(url, port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"optuna-dashboard exited with {proc.returncode}: {(tmp_path / 'dashboard.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{base}/api/studies", timeout=2):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                if time.monotonic() > deadline:
                    pytest.fail(f"optuna-dashboard did not answer within {START_TIMEOUT_S:.0f} s")
                time.sleep(0.3)
        yield base, spec
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)
        log.close()
    assert proc.returncode is not None


def test_the_dashboard_lists_the_study_and_answers_its_param_importances(dashboard):
    base, spec = dashboard
    status, body = get(f"{base}/api/studies")
    assert status == 200
    (study,) = [s for s in body["study_summaries"] if s["study_name"] == spec.name]

    status, body = get(f"{base}/api/studies/{study['study_id']}/param_importances")
    assert status == 200, body
    (importances,) = body["param_importances"]  # one objective: samples per second
    names = {entry["name"] for entry in importances}
    assert names == set(param_space(spec))
    assert all(entry["importance"] >= 0 for entry in importances)
    assert sum(entry["importance"] for entry in importances) == pytest.approx(1.0, abs=1e-6)

    # The study's attributes say which settings are recommended, beside Optuna's fastest arm.
    status, body = get(f"{base}/api/studies/{study['study_id']}?after=0")
    assert status == 200
    attrs = {a["key"]: a["value"] for a in body.get("user_attrs", [])}
    assert "recommended_settings" in attrs and "recommended_trials" in attrs
