"""The integration tier's orphan check finds a process left behind, and only this session's."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.integration.conftest import SESSION_VAR, leftover_processes


def test_a_child_left_running_is_found_and_another_session_is_not():
    mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=dict(os.environ))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env={**os.environ, SESSION_VAR: "another-session"})
    try:
        pids = {p.pid for p in leftover_processes()}
        assert mine.pid in pids
        assert other.pid not in pids
    finally:
        for proc in (mine, other):
            proc.kill()
            proc.wait()
    assert mine.pid not in {p.pid for p in leftover_processes()}
