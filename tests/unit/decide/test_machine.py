"""The machine check's judgement: busy, noisy, whether an arm may be cut early, the warnings."""

from __future__ import annotations

from trainopt.decide import machine
from trainopt.decide.session_plan import hopeless_arms


def snap(t, procs, load1=0.1, cpus=2, hz=100):
    return {"t": t, "cpus": cpus, "hz": hz, "procs": procs, "load1": load1}


def test_a_busy_loop_beside_the_search_makes_the_machine_busy_and_is_named():
    before = snap(0.0, {10: ("python", 0), 11: ("yes", 1000), 12: ("sshd", 5)})
    after = snap(2.0, {10: ("python", 150), 11: ("yes", 1200), 12: ("sshd", 5)}, load1=1.2)
    load = machine.other_load(before, after, own=[10])
    assert abs(load.others - 1.0) < 1e-9 and load.top == [("yes", 1.0)]
    check = machine.judge(load)
    assert check.busy and "yes 1.00" in check.reason and "1.00 of 2 CPUs" in check.reason
    # The search's own processes are not "others": alone, the same machine is quiet.
    assert not machine.judge(machine.other_load(before, after, own=[10, 11])).busy


def test_a_trailing_load_average_alone_does_not_make_the_machine_busy():
    # The search before this one leaves a high 1-minute load behind; nothing runs now.
    quiet = machine.other_load(snap(0, {}), snap(1, {}, load1=1.5))
    assert not machine.judge(quiet).busy and not machine.judge(quiet, before_search=True).busy
    busy = machine.other_load(snap(0, {7: ("yes", 0)}), snap(1, {7: ("yes", 90)}, load1=1.5))
    assert "load average 1.50 on 2 CPUs" in machine.judge(busy, before_search=True).reason


def test_a_reused_pid_or_a_new_process_counts_from_zero():
    load = machine.other_load(snap(0, {5: ("old", 900)}), snap(1, {5: ("new", 30), 6: ("fresh", 20)}))
    assert abs(load.others - 0.5) < 1e-9


def test_noise_is_steady_only_in_its_normal_band():
    assert machine.noise_label({"amp": 0.05, "threads": machine.NORMAL_NOISE}) == "steady"
    assert machine.noise_label({"amp": 0.05, "threads": 0.32}) == "noisy (window noise up to 32%)"
    assert machine.noise_label({"amp": 0.05}, unstable_verdicts=2) == "2 unstable"


def test_no_cut_after_one_window_while_busy_or_when_the_incumbent_spreads_over_twice():
    windows = [[300.0], [60.0]]  # the candidate at 0.2x after one window: hopeless by the ratio alone
    assert hopeless_arms(windows) == [1]
    assert machine.cut_allowed(windows[0], busy=False)
    assert not machine.cut_allowed(windows[0], busy=True)
    # The incumbent's windows in the previous session spanned 316-814 samples/s.
    assert not machine.cut_allowed(windows[0], busy=False, usual_spread=814 / 316)
    assert not machine.cut_allowed([316.0, 814.0], busy=False)
    assert machine.cut_allowed([300.0, 330.0], busy=False, usual_spread=814 / 316)


def test_cpu_share_is_cpu_time_over_wall_time_and_threads():
    assert machine.cpu_share(1.0, 1.0, 2) == 0.5
    assert machine.cpu_share(None, 1.0, 2) is None


def test_warnings_name_the_busy_machine_the_noise_and_a_threads_change_kept_while_busy():
    doc = {"before": {"busy": True, "reason": "other processes used 1.00 of 2 CPUs (yes 1.00)"},
           "during": [{"busy": True, "others": 1.0, "reason": "other processes used 1.00 of 2 CPUs (yes 1.00)"},
                      {"busy": False, "others": 0.0, "reason": ""}]}
    text = " | ".join(machine.warnings(doc, {"amp": 0.3}, ["threads"]))
    assert "busy before the search" in text and "yes 1.00" in text
    assert "busy in 1 of 2 samples" in text
    assert "threads change was kept while the machine was busy" in text
    assert "noisy (window noise up to 30%)" in text
    assert machine.warnings({"before": {"busy": False}, "during": []}, {"amp": 0.05}, ["threads"]) == []


def test_an_arm_that_ran_on_half_a_core_is_named_in_the_session_note():
    full = [{"elapsed_s": 1.0, "cpu_s": 1.6}, {"elapsed_s": 1.0, "cpu_s": 0.9}]  # two threads, one core's worth or more
    half = [{"elapsed_s": 1.0, "cpu_s": 0.5}, {"elapsed_s": 2.0, "cpu_s": 1.0}]
    note = machine.starved_arms([(full, 2), (half, 2), ([], 2), (half, None)])
    assert note == "arm 1 ran on 50% of a core (2 threads); arm 3 ran on 50% of a core over its windows: other processes held the cores"
    assert machine.starved_arms([(full, 2), ([], 1)]) == ""
