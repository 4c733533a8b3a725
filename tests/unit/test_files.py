"""Result files: atomic writes under a full disk, schema versions, unusable output folders."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from trainopt import atomic
from trainopt.contract.protocol import SchemaVersionError, TrialResult
from trainopt.outputs.results import RESULTS_SCHEMA_VERSION, ResultsError, read_results
from trainopt.outputs.workspace import OutputFolder, OutputFolderError, default_folder


def test_a_full_disk_mid_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    atomic.write_json_atomic(target, {"v": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    with pytest.raises(OSError, match="No space"):
        atomic.write_json_atomic(target, {"v": 2, "big": "x" * 10000})
    assert json.loads(target.read_text()) == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_nan_is_refused_rather_than_written_as_invalid_json(tmp_path):
    with pytest.raises(ValueError):
        atomic.write_json_atomic(tmp_path / "x.json", {"v": float("nan")})
    assert list(tmp_path.iterdir()) == []


def test_results_of_another_schema_version_are_refused_naming_both(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"kind": "trainopt-results", "schema_version": 0}))
    with pytest.raises(ResultsError) as info:
        read_results(tmp_path)
    assert "version 0" in str(info.value) and f"version {RESULTS_SCHEMA_VERSION}" in str(info.value)


@pytest.mark.parametrize("content,expected", [(None, "no results here"), ("{oops", "cannot read"), ("[1]", "not a trainopt results file")])
def test_missing_corrupt_or_foreign_results(tmp_path, content, expected):
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    with pytest.raises(ResultsError, match=expected):
        read_results(tmp_path)


def test_trial_result_of_another_version_is_refused():
    data = TrialResult(status="ok").to_dict()
    data["schema_version"] = 99
    with pytest.raises(SchemaVersionError, match="99"):
        TrialResult.from_dict(data)


def test_an_output_folder_that_cannot_be_created_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(OutputFolderError, match="cannot be written"):
        with OutputFolder(blocker / "out"):
            pass


def test_the_lock_refuses_a_second_holder_and_is_released(tmp_path):
    with OutputFolder(tmp_path / "out"):
        pid = os.fork()
        if pid == 0:  # a second process must be refused while the first holds the folder
            try:
                with OutputFolder(tmp_path / "out"):
                    os._exit(1)
            except OutputFolderError:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0
    with OutputFolder(tmp_path / "out"):
        pass


@pytest.mark.parametrize("name", ["../../etc", "/abs/path", "a/b", ".hidden", "ok-name_1.2"])
def test_spec_names_cannot_steer_where_results_are_written(name):
    path = default_folder(name)
    assert path.parts[0] == "runs" and len(path.parts) == 2
    assert ".." not in path.parts and not path.parts[1].startswith(".")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_get_the_mode_the_umask_gives_a_plain_file(tmp_path, umask, mode):
    previous = os.umask(umask)
    try:
        assert atomic.current_umask() == umask
        plain = tmp_path / "plain.txt"
        plain.write_text("x")
        target = tmp_path / "results.json"
        atomic.write_json_atomic(target, {"v": 1})
        atomic.write_json_atomic(target, {"v": 2})  # replacing keeps it too
    finally:
        os.umask(previous)
    assert stat.S_IMODE(target.stat().st_mode) == mode == stat.S_IMODE(plain.stat().st_mode)


def test_the_umask_is_read_without_changing_it_where_proc_is_missing(tmp_path, monkeypatch):
    previous = os.umask(0o027)
    real_open = open

    def no_proc(path, *args, **kwargs):
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    try:
        monkeypatch.setattr("builtins.open", no_proc)
        assert atomic.current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # left as it was
    finally:
        os.umask(previous)
