"""Runs last in the integration tier: no trial process or loader worker outlived its test.

Every trial process (and every loader worker it forked, which keeps its command line)
carries a path under this session's pytest temporary folder, so anything still alive
with that path is an orphan left by a timeout, a crash, an interrupt or a kill above.
"""

import os
import time

import psutil
import pytest

pytestmark = pytest.mark.integration


def test_no_orphan_processes_after_the_fault_and_interrupt_tests(tmp_path_factory):
    base = str(tmp_path_factory.getbasetemp())
    time.sleep(1.0)
    orphans = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if p.info["pid"] != os.getpid() and base in line and "trainopt" in line:
            orphans.append((p.info["pid"], line[:200]))
    print(f"orphan trial processes found: {len(orphans)}")
    assert orphans == []
