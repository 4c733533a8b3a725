"""The trial store's URL: passwords never shown, and every unusable URL is one clear user error."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import tiny_spec_dict
from trainopt.cli import main
from trainopt.errors import UserError
from trainopt.search.store import StorageError, masked_url, open_storage


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql+psycopg2://alice:s3cret@db.example:5432/trials", "postgresql+psycopg2://alice:***@db.example:5432/trials"),
        # An unescaped "@" in the password: everything up to the last "@" is hidden.
        ("postgresql+psycopg2://alice:p@ss@db/trials", "postgresql+psycopg2://alice:***@db/trials"),
        ("postgresql+psycopg2://alice@/trials?host=/run/pg&password=s3cret", "postgresql+psycopg2://alice@/trials?host=/run/pg&password=***"),
        ("not a url://bob:s3cret@x", "not a url://bob:***@x"),
        ("postgresql+psycopg2://postgres@/trials?host=/tmp/pg", "postgresql+psycopg2://postgres@/trials?host=/tmp/pg"),
        ("sqlite:////tmp/out/trials.db", "sqlite:////tmp/out/trials.db"),
    ],
)
def test_masked_url_hides_only_the_password(url, shown):
    assert masked_url(url) == shown
    assert "s3cret" not in masked_url(url)


def test_storage_error_is_a_user_error():
    assert issubclass(StorageError, UserError)


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nonsense", "not a database URL"),
        ("nosuchdb://u:s3cret@h/db", "unknown database or driver"),
        ("mysql+nosuchdriver://u:s3cret@h/db", "unknown database or driver"),
        ("postgresql+psycopg2://u:s3cret@127.0.0.1:1/db", "cannot connect"),
    ],
)
def test_unusable_urls_name_the_flag_and_what_is_allowed(url, expected):
    with pytest.raises(StorageError) as info:
        open_storage(url)
    text = str(info.value)
    assert text.startswith("--storage ") and expected in text
    assert "s3cret" not in text
    if "s3cret" in url:
        assert "***" in text
    if expected != "cannot connect":
        assert "postgresql+psycopg2://USER:PASSWORD@HOST" in text


def test_an_unwritable_sqlite_path_says_to_check_the_folder(tmp_path):
    with pytest.raises(StorageError, match="folder exists and is writable"):
        open_storage(f"sqlite:///{tmp_path / 'missing' / 'trials.db'}")


def test_a_missing_postgres_driver_says_which_extra_to_install(monkeypatch):
    # None in sys.modules makes `import psycopg2` fail as on a machine without the driver.
    monkeypatch.setitem(sys.modules, "psycopg2", None)
    with pytest.raises(StorageError) as info:
        open_storage("postgresql+psycopg2://u:s3cret@localhost/db")
    text = str(info.value)
    assert "'psycopg2' is not installed" in text and 'pip install "trainopt[postgres]"' in text
    assert "s3cret" not in text


def test_the_cli_answers_an_unreachable_store_with_exit_2(tmp_path, write_spec, capsys):
    spec = write_spec(tiny_spec_dict(search={"amp": ["off"]}))
    code = main(["search", str(spec), "--out", str(tmp_path / "out"), "--storage", "postgresql+psycopg2://u:s3cret@127.0.0.1:1/db"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("trainopt: error: --storage postgresql+psycopg2://u:***@127.0.0.1:1/db: cannot connect")
    assert "s3cret" not in err and "Traceback" not in err
    assert not (tmp_path / "out" / "results.json").exists()


_HOLD = """
import sys, time
from trainopt.search.store import TrialStore
TrialStore(sys.argv[1], "shared", "fp")
print("holding", flush=True)
time.sleep(120)
"""


def test_a_second_search_on_the_same_study_is_refused_until_the_first_is_gone(tmp_path):
    import signal
    import subprocess

    from tests.conftest import ROOT
    from trainopt.search.store import StudyBusy, TrialStore

    # Two output folders, one store: the folder locks do not meet, the study lock does.
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, url], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(StudyBusy, match="another trainopt search is using the study 'shared' in sqlite:///"):
            TrialStore(url, "shared", "fp")
        # Another study in the same database is free.
        TrialStore(url, "other", "fp").close()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # kill -9 leaves no stale lock behind; within one process the study opens twice.
    first = TrialStore(url, "shared", "fp")
    second = TrialStore(url, "shared", "fp")
    first.close()
    second.close()
    TrialStore(url, "shared", "fp").close()


def test_a_store_that_fails_mid_search_is_one_user_error_naming_the_url(tmp_path):
    import sqlalchemy.exc

    from trainopt.contract.protocol import TrialResult
    from trainopt.search.store import StoreLost, TrialStore

    store = TrialStore(f"sqlite:///{tmp_path / 't.db'}", "s", "fp")
    trial = store.begin("k", {})

    def broken(*args, **kwargs):
        raise sqlalchemy.exc.OperationalError("UPDATE trials", {}, Exception("server closed the connection unexpectedly"))

    store.study.tell = broken
    with pytest.raises(StoreLost) as info:
        store.finish(trial, "k", {}, TrialResult(status="ok", settings={}, mode="measure", samples_per_s=1.0))
    text = info.value.render()
    assert text.startswith(f"--storage sqlite:///{tmp_path / 't.db'}: lost the connection to the trial store")
    assert "server closed the connection unexpectedly" in text and "run the same command again" in text
    assert isinstance(info.value, UserError) and store.lookup("k") is None
    store.close()
