"""A real search keeps its trials in a real PostgreSQL server and resumes from it after kill -9.

The server is a throwaway cluster made with Debian's ``postgresql`` binaries, owned by the
``postgres`` user (``initdb`` refuses to run as root), listening only on a Unix socket in
its own temporary folder, and removed afterwards. Without those binaries the test is
skipped; ``.ci/run`` installs them.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import tiny_spec_dict

pytestmark = pytest.mark.integration

psycopg2 = pytest.importorskip("psycopg2", reason='psycopg2 is missing; pip install -e ".[test]"')

DATABASE = "trainopt"
SEARCH = {"amp": ["off", "bf16"]}
FAST = {"pairs": 3, "max_pairs": 4, "confidence": 0.75}
SERVER: dict = {}


def _postgres_bin() -> Path | None:
    """The newest installed Debian PostgreSQL's bin folder, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parent.parent.name))
    return Path(found[-1]).parent if found else None


def _as_postgres() -> list[str]:
    """The argv prefix that runs a server command as the ``postgres`` user when we are root."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


@pytest.fixture(scope="module")
def postgres_url():
    """A fresh database on a throwaway PostgreSQL server; yields its SQLAlchemy URL."""
    bindir = _postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql; .ci/run installs it)")
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' user to run initdb as")
        if shutil.which("runuser") is None:
            pytest.skip("running as root and runuser is missing, so initdb cannot run as 'postgres'")
    # Short path under /tmp: a Unix socket path must stay under ~100 characters, and the
    # postgres user must be able to reach it (pytest's tmp_path sits in a root-only folder).
    root = Path(tempfile.mkdtemp(prefix="trainopt-pg-"))
    if os.geteuid() == 0:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    data = root / "data"
    log = root / "server.log"
    # The server is not one of this test session's processes: keep it out of the orphan check.
    env = {k: v for k, v in os.environ.items() if k != "TRAINOPT_TEST_SESSION"}
    prefix = _as_postgres()

    def run(argv: list[str]) -> None:
        proc = subprocess.run(prefix + argv, capture_output=True, text=True, env=env, cwd=root, timeout=120)
        assert proc.returncode == 0, f"{argv[0]} failed: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"

    started = False
    try:
        run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
        # No TCP at all: only a socket in our own folder, so nothing else on the machine can
        # collide with it or reach it.
        with open(data / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write(f"\nlisten_addresses = ''\nunix_socket_directories = '{root}'\nfsync = off\n")
        run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", "start"])
        started = True
        run([str(bindir / "createdb"), "-h", str(root), "-U", "postgres", DATABASE])
        # How a test stops and starts this server (the connection-loss test).
        SERVER["pg_ctl"] = lambda *args: run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-w", "-t", "60", *args])
        yield f"postgresql+psycopg2://postgres@/{DATABASE}?host={root}"
    finally:
        if started:
            subprocess.run(prefix + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], env=env, cwd=root, capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def _connect(url: str):
    socket_dir = url.split("host=", 1)[1]
    return psycopg2.connect(dbname=DATABASE, user="postgres", host=socket_dir)


def finished_trials(url: str, states: str = "'COMPLETE', 'FAIL'", study: str | None = None) -> int:
    """Trials in ``states`` (default: finished), of every study or of one, read straight from PostgreSQL."""
    try:
        con = _connect(url)
    except psycopg2.Error:
        return 0
    try:
        with con.cursor() as cur:
            if study is None:
                cur.execute(f"select count(*) from trials where state in ({states})")
            else:
                cur.execute(f"select count(*) from trials t join studies s on t.study_id = s.study_id "
                            f"where s.study_name = %s and t.state in ({states})", (study,))
            return cur.fetchone()[0]
    except psycopg2.Error:
        return 0  # the search has not created Optuna's tables yet
    finally:
        con.close()


def search_cmd(spec: Path, out: Path, url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "trainopt", "search", str(spec), "--out", str(out), "--storage", url, *extra]


def test_search_stores_its_study_in_postgres_and_resumes_from_it_after_kill_9(tmp_path, cli_env, postgres_url):
    import optuna

    # The input-bound search (a real win, so a confirmation of several pair sessions follows
    # its screen): there is always a session in flight to kill.
    from tests.integration.test_search_cli import INPUT_BOUND

    data = tiny_spec_dict(**INPUT_BOUND)
    data["measure"].update(FAST)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    out = tmp_path / "out"

    # Kill the orchestrator once two trials are in PostgreSQL and a whole session's arms are
    # running (at least two RUNNING: a session's arms are stored one by one when it ends, and a
    # half-stored session is rightly measured again as a whole, not reused).
    proc = subprocess.Popen(search_cmd(spec, out, postgres_url, "--quiet"), env=cli_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    end = time.monotonic() + 300
    while finished_trials(postgres_url) < 2 or finished_trials(postgres_url, "'RUNNING'") < 2:
        assert proc.poll() is None, f"the search ended before it could be killed: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < end, "no trial reached PostgreSQL"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    before = finished_trials(postgres_url)
    assert before >= 2
    assert not (out / "trials.db").exists(), "the trials went to SQLite instead of --storage"

    # The same command resumes from the study in PostgreSQL.
    resumed = subprocess.run(search_cmd(spec, out, postgres_url), capture_output=True, text=True, env=cli_env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "left running by an interrupted search" in resumed.stderr
    assert f"store: study 'tiny' in {postgres_url}" in resumed.stdout
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"]
    assert doc["storage"] == {"url": postgres_url, "study": "tiny"}
    assert doc["counts"]["trials_reused"] >= before, "finished trials were run again"
    result_keys = [t["key"] for t in doc["trials"]]
    assert len(result_keys) == len(set(result_keys)), "a trial was duplicated"

    # Read back with Optuna from the same URL, as optuna-dashboard would: every trial of the
    # search is there once, and the one killed mid-run is marked stale rather than reused.
    study = optuna.load_study(study_name="tiny", storage=postgres_url)
    finished = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished() and not t.user_attrs.get("stale")]
    stored_keys = [t.user_attrs["key"] for t in finished]
    assert len(stored_keys) == len(set(stored_keys)), "a trial was run twice"
    assert set(stored_keys) == set(result_keys)
    assert sum(1 for t in study.get_trials(deepcopy=False) if t.user_attrs.get("stale")) >= 1
    assert study.user_attrs["spec_fingerprint"] == doc["spec_fingerprint"]

    # A third run, after a complete search, runs nothing: everything comes from PostgreSQL.
    again = subprocess.run(search_cmd(spec, out, postgres_url, "--quiet"), capture_output=True, text=True, env=cli_env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert doc["counts"] == {"trials_run": 0, "trials_reused": len(result_keys)}
    assert len(optuna.load_study(study_name="tiny", storage=postgres_url).get_trials(deepcopy=False)) == len(study.get_trials(deepcopy=False))


def test_a_missing_database_is_a_clear_error(tmp_path, cli_env, postgres_url):
    data = tiny_spec_dict(search=SEARCH)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    url = postgres_url.replace(f"/{DATABASE}?", "/nosuchdb?")
    proc = subprocess.run(search_cmd(spec, tmp_path / "out", url), capture_output=True, text=True, env=cli_env, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"trainopt: error: --storage {url}: cannot connect")
    assert '"nosuchdb" does not exist' in proc.stderr and "Traceback" not in proc.stderr


def _input_bound_spec(tmp_path: Path, name: str) -> Path:
    from tests.integration.test_search_cli import INPUT_BOUND

    data = tiny_spec_dict(**INPUT_BOUND)
    data["name"] = name
    data["measure"].update(FAST)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    return spec


def test_two_searches_never_share_a_study_and_a_lost_server_stops_the_search_cleanly(tmp_path, cli_env, postgres_url):
    import optuna

    study = "tiny-busy"
    spec = _input_bound_spec(tmp_path, study)
    first = subprocess.Popen(search_cmd(spec, tmp_path / "a", postgres_url, "--quiet"), env=cli_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 300
        while True:
            try:
                if any(s.study_name == study for s in optuna.get_all_study_summaries(postgres_url, include_best_trial=False)):
                    break
            except Exception:  # noqa: BLE001 - Optuna's tables may not exist yet
                pass
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < end, "the first search never created its study"
            time.sleep(0.2)

        # A second search on the same study, from another output folder: refused, at once.
        second = subprocess.run(search_cmd(spec, tmp_path / "b", postgres_url), capture_output=True, text=True,
                                env=cli_env, timeout=120)
        assert second.returncode == 2, second.stderr[-3000:]
        assert f"another trainopt search is using the study '{study}' in {postgres_url}" in second.stderr
        assert "Traceback" not in second.stderr
        assert not (tmp_path / "b" / "results.json").exists()

        # The server goes away while the first search runs: one clear error, no traceback.
        # As above: a whole session in flight, none half-stored, when the server goes.
        while finished_trials(postgres_url, study=study) < 2 or finished_trials(postgres_url, "'RUNNING'", study=study) < 2:
            assert first.poll() is None, first.stderr.read()[-3000:]
            assert time.monotonic() < end, "no trial reached PostgreSQL"
            time.sleep(0.1)
        SERVER["pg_ctl"]("-m", "immediate", "stop")
        try:
            err = first.communicate(timeout=300)[1]
        finally:
            SERVER["pg_ctl"]("start")
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 2, err[-3000:]
    assert "lost the connection to the trial store" in err and "run the same command again" in err, err[-3000:]
    assert "Traceback" not in err
    partial = json.loads((tmp_path / "a" / "results.json").read_text())
    assert partial["complete"] is False

    # Once the server is back, the same command resumes and finishes; the lock died with the first search.
    resumed = subprocess.run(search_cmd(spec, tmp_path / "a", postgres_url, "--quiet"), capture_output=True, text=True,
                             env=cli_env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    doc = json.loads((tmp_path / "a" / "results.json").read_text())
    assert doc["complete"] and doc["counts"]["trials_reused"] >= 2


def test_a_lost_study_lock_stops_the_search_while_the_server_stays_up(tmp_path, postgres_url):
    from trainopt.contract.protocol import TrialResult
    from trainopt.search.store import StoreLost, TrialStore

    store = TrialStore(postgres_url, "tiny-lock-lost", "fp-1")
    try:
        trial = store.begin("k1", {"role": "baseline"})
        store.finish(trial, "k1", {"role": "baseline"}, TrialResult(status="error", settings={}, error="x"))
        # The connection that holds the advisory lock ends (as in a server restart); Optuna's
        # own pool still reaches the server, so nothing else would notice.
        con = _connect(postgres_url)
        try:
            con.autocommit = True
            with con.cursor() as cur:
                cur.execute("select pg_terminate_backend(pid) from pg_locks where locktype = 'advisory' "
                            "and database = (select oid from pg_database where datname = current_database())")
                assert cur.rowcount == 1
        finally:
            con.close()
        with pytest.raises(StoreLost, match="lost the hold on the study 'tiny-lock-lost'.*run the same command again"):
            store.begin("k2", {"role": "baseline"})
    finally:
        store.close()
    # The study is free again and keeps what finished before.
    again = TrialStore(postgres_url, "tiny-lock-lost", "fp-1")
    try:
        assert again.lookup("k1") is not None and again.lookup("k2") is None
    finally:
        again.close()
