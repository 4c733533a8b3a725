"""Every problem a user can fix is a UserError, and the CLI answers each with exit 2 and no traceback."""

from __future__ import annotations

import pytest

from trainopt.cli import main
from trainopt.contract.protocol import SchemaVersionError
from trainopt.contract.reference import WorkloadError
from trainopt.contract.spec import SpecError
from trainopt.errors import UserError
from trainopt.outputs.results import ResultsError
from trainopt.outputs.workspace import OutputFolderError
from trainopt.search.store import SpecChangedError
from trainopt.settings.export import ExportError
from trainopt.settings.record import SettingsError


@pytest.mark.parametrize(
    "cls",
    [SpecError, WorkloadError, ResultsError, SpecChangedError, ExportError, SettingsError, OutputFolderError, SchemaVersionError],
)
def test_every_user_error_is_one_family(cls):
    assert issubclass(cls, UserError)


def test_a_spec_error_renders_one_line_per_problem():
    err = SpecError(["a: bad", "b: worse"], "s.yaml")
    assert err.render() == "invalid spec s.yaml:\n  - a: bad\n  - b: worse"
    assert UserError("plain").render() == "plain"


def test_the_cli_answers_user_errors_with_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainopt: error: {tmp_path / 'results.json'}: no results here") and "Traceback" not in err
    bad = tmp_path / "spec.yaml"
    bad.write_text("model: {name: mlp}\ndata: {name: synthetic-tabular}\nsearch: {amp: [fp8]}\n")
    assert main(["validate", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"trainopt: error: invalid spec {bad}: search.amp[0]: 'fp8' is not one of off, bf16, fp16\n"
    )
