"""A user's factory module is imported in trial and check processes only, never in the CLI's."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import FIXTURES, tiny_spec_dict

pytestmark = pytest.mark.integration

MODEL_REF = f"{FIXTURES / 'marker_model.py'}:make"


def run_cli(tmp_path, cli_env, *args):
    """Run the CLI; return (process, stderr, the pids that imported the marker module)."""
    marker = tmp_path / "imported-by.txt"
    env = {**cli_env, "TRAINOPT_TEST_MARKER": str(marker)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainopt", *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    _, err = proc.communicate(timeout=300)
    pids = [int(line) for line in marker.read_text().split()] if marker.exists() else []
    return proc, err, pids


def write_spec(tmp_path, model_ref=MODEL_REF):
    data = tiny_spec_dict(model={"name": model_ref, "args": {"features": 16, "classes": 10}})
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_validate_imports_the_factory_only_in_a_check_process(tmp_path, cli_env):
    proc, err, pids = run_cli(tmp_path, cli_env, "validate", str(write_spec(tmp_path)))
    assert proc.returncode == 0, err
    assert len(pids) == 1 and proc.pid not in pids


def test_measure_imports_the_factory_only_in_child_processes(tmp_path, cli_env):
    proc, err, pids = run_cli(tmp_path, cli_env, "measure", str(write_spec(tmp_path)), "--out", str(tmp_path / "m"))
    assert proc.returncode == 0, err
    # One check process and one trial process, neither of them the CLI.
    assert len(set(pids)) == 2 and proc.pid not in pids


def test_a_bad_reference_is_exit_2_with_the_precise_message(tmp_path, cli_env):
    ref = f"{FIXTURES / 'marker_model.py'}:nope"
    proc, err, pids = run_cli(tmp_path, cli_env, "validate", str(write_spec(tmp_path, ref)))
    assert proc.returncode == 2
    assert err.strip() == (
        f"trainopt: error: model.name {ref!r}: file {str(FIXTURES / 'marker_model.py')!r} has no attribute 'nope'; "
        f"it defines: make"
    )
    assert proc.pid not in pids and len(pids) == 1
