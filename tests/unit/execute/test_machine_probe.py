"""Sampling /proc for the machine check: a fake /proc tree, and the real one with a busy loop beside it."""

from __future__ import annotations

import subprocess
import sys
import time

from trainopt.execute.machine_probe import MachineProbe, snapshot


def write_proc(root, procs, load1, kernel=()):
    root.mkdir(exist_ok=True)
    (root / "stat").write_text("cpu 0 0 0 0\n")
    (root / "loadavg").write_text(f"{load1} 0.5 0.5 1/100 999\n")
    for pid, (name, ppid, ticks) in procs.items():
        d = root / str(pid)
        d.mkdir(exist_ok=True)
        # pid (comm) state ppid pgrp session tty tpgid flags(9) ... utime(14) stime(15)
        flags = str(0x00200000 if pid in kernel else 0x00400000)
        fields = ["S", str(ppid), "0", "0", "0", "0", flags] + ["0"] * 4 + [str(ticks), "0"] + ["0"] * 20
        (d / "stat").write_text(f"{pid} ({name}) " + " ".join(fields) + "\n")


def test_a_fake_proc_tree_reads_names_with_spaces_and_parents(tmp_path):
    root = tmp_path / "proc"
    write_proc(root, {101: ("tmux: server", 1, 50), 102: ("yes", 101, 7)}, 0.4)
    s = snapshot(root)
    assert s["procs"][101] == ("tmux: server", 50) and s["procs"][102] == ("yes", 7)
    assert s["load1"] == 0.4
    assert snapshot(tmp_path / "nothing") is None


def test_kernel_threads_are_not_other_processes(tmp_path):
    root = tmp_path / "proc"
    write_proc(root, {2: ("kthreadd", 0, 1), 40: ("kworker/u8:2-writeback", 2, 80), 101: ("yes", 1, 7)}, 0.4, kernel={2, 40})
    assert set(snapshot(root)["procs"]) == {101}


def test_the_real_proc_counts_a_busy_loop_that_is_not_the_search_s():
    if snapshot() is None:
        return  # no /proc on this system: the check says nothing, which the CLI handles
    # Started through a shell that exits at once, so the loop is no descendant of this
    # process (not one of the search's own) and counts as another process.
    out = subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                         capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    try:
        time.sleep(0.3)
        probe = MachineProbe()
        check = probe.check_before(1.0)
        assert pid not in probe._last["own"]
        before = probe.before
        assert before["others"] >= 0.5 and check.busy, before
        # The same interval with the loop counted as the search's own: about one CPU less.
        from trainopt.decide.machine import other_load

        first = snapshot()
        time.sleep(1.0)
        second = snapshot()
        counted = other_load(first, second).others
        mine = other_load(first, second, own=[pid]).others
        assert counted - mine >= 0.5, (counted, mine)
        assert probe.to_dict()["before"]["busy"]
    finally:
        import os
        import signal

        os.kill(pid, signal.SIGKILL)


def test_processes_added_as_the_search_s_own_bring_their_descendants(tmp_path):
    # A Ray slot's actor started apart from the search (``ray start``): not this process's
    # descendant, so only ``add_own`` makes it and its arms the search's own.
    root = tmp_path / "proc"
    procs = {300: ("raylet", 1, 5), 301: ("ray::_SlotActor", 300, 9), 302: ("python", 301, 40), 400: ("yes", 1, 7)}
    write_proc(root, procs, 0.4)
    assert not {300, 301, 302} & set(snapshot(root)["own"])
    own = set(snapshot(root, roots=[301, 999])["own"])
    assert {301, 302} <= own and not {300, 400, 999} & own

    probe = MachineProbe(root=root)
    probe.add_own([301])
    # Both the actor's arm and the other process use a CPU-second's worth of ticks.
    hz = snapshot(root)["hz"]
    write_proc(root, {**procs, 302: ("python", 301, 40 + hz), 400: ("yes", 1, 7 + hz)}, 0.4)
    time.sleep(0.6)
    check = probe.sample()
    assert check is not None
    point = probe.during[-1]
    # Only "yes" is another process: about one CPU-second over the ~0.6 s interval.
    assert [name for name, _ in point["top"]] == ["yes"], point
