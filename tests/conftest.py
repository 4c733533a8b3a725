"""Shared fixtures: tiny specs that train in well under a second per step on a CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def tiny_spec_dict(**overrides):
    """A spec for an MLP on tabular data: a trial takes a few seconds, mostly interpreter start."""
    spec = {
        "name": "tiny",
        "device": "cpu",
        "model": {"name": "mlp", "args": {"hidden": 32, "layers": 1}},
        "data": {"name": "synthetic-tabular", "args": {"size": 512, "features": 16}},
        "loss": "cross_entropy",
        "optimizer": {"name": "sgd", "args": {"lr": 0.05}},
        "baseline": {"batch_size": 16, "threads": 1},
        "search": {},
        "measure": {
            "warmup_steps": 3,
            "warmup_seconds": 0.2,
            "window_seconds": 0.1,
            "windows": 4,
            "trial_timeout_s": 120,
            "pairs": 3,
            "max_pairs": 4,
            # Three pairs reach 75 % coverage at most; tests of the search's mechanics
            # (resume, faults, files) ask for no more, so they need not run six pairs.
            "confidence": 0.75,
        },
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    return spec


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec dict as YAML into tmp_path and return its path."""
    import yaml

    def _write(data, name="spec.yaml"):
        path = tmp_path / name
        path.write_text(yaml.safe_dump(data, sort_keys=False) if not isinstance(data, str) else data)
        return path

    return _write


@pytest.fixture
def cli_env():
    """Environment for running ``python -m trainopt`` from a checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
