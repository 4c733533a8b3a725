"""The version is written once and shown everywhere a result can be traced by it.

``trainopt/version.py`` holds it; pyproject.toml reads it from there; CHANGELOG.md's newest
release is it; ``trainopt --version``, results.json, best.yaml and the report show it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import yaml

from tests.conftest import ROOT, tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore
from trainopt.contract.spec import spec_from_dict
from trainopt.search.search import Search
from trainopt.version import __version__

RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def test_pyproject_reads_the_version_from_the_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"], "the version is written in trainopt/version.py only"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "trainopt.version.__version__"}


def test_pyproject_has_a_development_status_and_python_from_3_10():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert sum(c.startswith("Development Status :: ") for c in project["classifiers"]) == 1
    assert project["requires-python"] == ">=3.10"


def test_the_changelog_s_newest_release_is_the_package_s_version():
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    releases = RELEASE.findall(text)
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' section"
    assert releases[0][0] == __version__
    # Newest first, each version once, dates never going forward down the page.
    versions = [tuple(int(p) for p in v.split(".")) for v, _ in releases]
    assert versions == sorted(set(versions), reverse=True)
    assert [d for _, d in releases] == sorted((d for _, d in releases), reverse=True)
    assert versions[-1] == (0, 1, 0)


def test_the_command_line_prints_the_version():
    out = subprocess.run([sys.executable, "-m", "trainopt", "--version"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"trainopt {__version__}"


def test_results_best_yaml_and_the_report_carry_the_version(tmp_path):
    from trainopt.outputs.report import write_report
    from trainopt.outputs.results import write_outputs

    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={"pairs": 4, "max_pairs": 8}),
                          "t.yaml", tmp_path)
    out = tmp_path / "out"
    doc = Search(spec, out, FakeRunner({("amp", "bf16"): 1.5}), MemoryStore()).run()
    write_outputs(out, doc, spec.resolved())
    write_report(out, doc)
    assert doc["trainopt_version"] == __version__
    best = yaml.safe_load((out / "best.yaml").read_text(encoding="utf-8"))
    assert best["provenance"]["trainopt_version"] == __version__
    assert f"trainopt {__version__}" in (out / "report.html").read_text(encoding="utf-8")
