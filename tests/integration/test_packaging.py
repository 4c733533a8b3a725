"""The wheel: license, typing marker, starter specs and metadata, and the starters found where it installs.

The wheel is built with the installed setuptools (``pip wheel . --no-deps
--no-build-isolation``) from a copy of the project's packaging files and package, so the
build leaves nothing in the checkout.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from trainopt.cli import STARTERS
from trainopt.version import __version__

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "trainopt", src / "trainopt", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-w", str(out)],
        cwd=src, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (built,) = out.glob("trainopt-*.whl")
    return built


def test_the_wheel_ships_the_license_the_typing_marker_and_the_starters(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "trainopt/py.typed" in names
    assert {f"trainopt/starter/{m}.yaml" for m in STARTERS} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), sorted(n for n in names if "dist-info" in n)
    assert any(n.startswith("trainopt/outputs/report/templates/") and n.endswith(".j2") for n in names)
    # Only the package: no tests, configs or benchmarks.
    assert all(n.startswith(("trainopt/", "trainopt-")) for n in names)


def test_the_metadata_names_the_license_as_spdx_and_no_urls(wheel):
    archive = zipfile.ZipFile(wheel)
    (meta_name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(archive.read(meta_name))
    assert meta["License-Expression"] == "MIT"
    assert meta.get_all("License-File") == ["LICENSE"]
    classifiers = meta.get_all("Classifier")
    assert "Programming Language :: Python :: 3.10" in classifiers and "Typing :: Typed" in classifiers
    assert any(c.startswith("Operating System ::") for c in classifiers)
    assert any(c.startswith("Topic ::") for c in classifiers)
    assert not any(c.startswith("License ::") for c in classifiers)  # the SPDX expression says it
    assert meta.get_all("Project-URL") is None and meta["Home-page"] is None
    # The version is read from trainopt/version.py, the one place it is written.
    assert meta["Version"] == __version__
    assert sum(c.startswith("Development Status ::") for c in classifiers) == 1
    # Ray is its own extra, not part of the test extra.
    requires = meta.get_all("Requires-Dist")
    assert any(r.startswith("ray") and 'extra == "ray"' in r for r in requires)
    assert not any(r.startswith("ray") and 'extra == "test"' in r for r in requires)
    assert any(r.startswith("optuna-dashboard") and 'extra == "test"' in r for r in requires)
    license_text = archive.read(next(n for n in archive.namelist() if n.endswith("/licenses/LICENSE"))).decode()
    assert license_text.startswith("MIT License") and "the trainopt authors" in license_text


def test_init_finds_its_starters_where_the_wheel_installs(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    # The unpacked wheel alone on the path: the checkout's trainopt must not be what answers.
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-m", "trainopt", "init", "--model", "gpt", "first.yaml"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    probe = subprocess.run([sys.executable, "-c", "import trainopt; print(trainopt.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.strip().startswith(str(site))
    assert yaml.safe_load((work / "first.yaml").read_text())["model"]["name"] == "gpt"
    proc = subprocess.run([sys.executable, "-m", "trainopt", "validate", "first.yaml"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
