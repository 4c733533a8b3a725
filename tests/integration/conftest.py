"""After every integration test module: no process started by it is still alive.

Every process this test session starts (trial workers, loader workers, reference checks,
CLI runs) inherits ``TRAINOPT_TEST_SESSION`` from this process's environment, so a
process that carries this session's value and is not pytest itself was left behind by a
timeout, a crash, an interrupt or a kill in the module that just ran. Checked per
module, so the result does not depend on which test runs last, and the module that
leaked is the one that fails.
"""

from __future__ import annotations

import os
import time
import uuid

import psutil
import pytest

SESSION_VAR = "TRAINOPT_TEST_SESSION"
os.environ.setdefault(SESSION_VAR, uuid.uuid4().hex)


def leftover_processes() -> list[psutil.Process]:
    """Processes other than this one that carry this session's marker."""
    token = os.environ[SESSION_VAR]
    me = os.getpid()
    found = []
    for p in psutil.process_iter(["pid", "uids"]):
        try:
            if p.pid == me or p.info["uids"] is None or p.info["uids"].real != os.getuid():
                continue
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(SESSION_VAR) == token:
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module", autouse=True)
def no_orphan_processes():
    yield
    deadline = time.monotonic() + 5.0
    left = leftover_processes()
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftover_processes()
    if left:
        described = []
        for p in left:
            try:
                parent = p.parent()
                described.append(f"{p.pid}: {' '.join(p.cmdline())[:200]} (status {p.status()}, parent "
                                 f"{parent.pid if parent else None}: "
                                 f"{' '.join(parent.cmdline())[:120] if parent else ''})")
                p.kill()  # so the next module starts clean
            except psutil.Error:
                pass
        pytest.fail(f"{len(left)} process(es) outlived this test module: {described}")
