"""Progress as the user sees it: a bar on a terminal, plain lines in a log, an ETA priced at
what this search's own trials cost."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from tests.conftest import tiny_spec_dict
from tests.fakes import FakeRunner, MemoryStore
from trainopt.contract.spec import spec_from_dict
from trainopt.decide import plan
from trainopt.search.progress import ConsoleProgress, NullProgress
from trainopt.search.search import Search


def arm(settings, session=None, wall_s=None, samples=100.0):
    return SimpleNamespace(status="ok", samples_per_s=samples, error=None, wall_s=wall_s, settings=settings,
                           session=session)


def drive(progress: ConsoleProgress) -> None:
    """What a search tells the progress: the baseline, then a two-arm confirmation session."""
    progress.stage("baseline", "measuring the baseline")
    progress.trial_started(stage="baseline", knob="baseline", role="baseline")
    progress.trial_finished(arm({"compile": "off"}, wall_s=5.0))
    progress.set_remaining(20.0)
    progress.set_expected(12)
    progress.stage("compile", "compile")
    progress.trial_started(stage="compile", knob="compile", role="confirm", detail="compile=off vs default", arms=2)
    for i in range(2):
        progress.trial_finished(arm({"compile": ["off", "default"][i]}, {"id": "confirm/compile/1", "arm": i, "arms": 2}),
                                wall_s=3.0, cost=1.0)
    progress.close()


def test_a_terminal_shows_a_bar_with_stage_trials_elapsed_and_eta():
    stream = io.StringIO()
    progress = ConsoleProgress(stream=stream, terminal=True)
    drive(progress)
    out = stream.getvalue()
    last = out.rsplit("\r", 1)[-1]
    assert "━" in out and "\x1b[" in out
    # At 80 columns the stage and trial are cut short before any figure is.
    assert "[compile] compile con" in last
    assert "3/~13 trials" in last
    assert "elapsed" in last and "0:00:0" in last
    assert "ETA " in last and "ETA ?" not in last
    # The trial lines stay above the bar.
    assert "compile confirm compile=off vs default [arm 1 of 2: compile=off]: ok 100.0 samples/s" in out


def test_a_log_gets_plain_lines_and_no_bar():
    stream = io.StringIO()
    drive(ConsoleProgress(stream=stream, terminal=False))
    out = stream.getvalue()
    assert "━" not in out and "\x1b[" not in out and "\r" not in out
    lines = out.splitlines()
    assert lines[0] == "== baseline: measuring the baseline"
    assert lines[1].startswith("  baseline baseline: ok 100.0 samples/s  (ETA ?)")
    assert lines[2] == "== compile: compile"
    assert len(lines) == 5 and all("ETA" in line for line in lines[3:])


def test_each_arm_line_names_its_arm():
    stream = io.StringIO()
    drive(ConsoleProgress(stream=stream, terminal=False))
    lines = stream.getvalue().splitlines()
    assert "compile confirm compile=off vs default [arm 1 of 2: compile=off]: ok" in lines[3]
    assert "compile confirm compile=off vs default [arm 2 of 2: compile=default]: ok" in lines[4]
    # A one-shot trial is no arm of a session.
    assert "[arm" not in lines[1]


def test_a_log_file_gets_whole_lines_however_long(tmp_path):
    # Outside a terminal no line is wrapped at a width: grep finds "(ETA 5m25s)" on one line.
    log = tmp_path / "search.log"
    detail = "num_workers=" + " vs ".join(str(n) for n in range(40))
    with log.open("w") as stream:
        progress = ConsoleProgress(stream=stream)
        progress.stage("input pipeline", "screening " + detail)
        progress.trial_started(stage="input pipeline", knob="num_workers", role="screen", detail=detail, arms=2)
        progress.trial_finished(arm({"num_workers": 0}, {"id": "screen/num_workers/1", "arm": 0, "arms": 2}), wall_s=3.0)
        progress.close()
    lines = log.read_text().splitlines()
    assert len(lines) == 2, lines
    assert lines[0] == f"== input pipeline: screening {detail}"
    assert lines[1].startswith(f"  num_workers screen {detail} [arm 1 of 2: num_workers=0]: ok 100.0 samples/s  (ETA")
    assert lines[1].endswith(")") and len(lines[1]) > 200


def test_quiet_prints_nothing_even_on_a_terminal():
    stream = io.StringIO()
    drive(ConsoleProgress(stream=stream, terminal=True, quiet=True))
    assert stream.getvalue() == ""


def test_the_progress_learns_a_session_as_a_whole_and_counts_down_at_the_learned_price():
    progress = ConsoleProgress(quiet=True, stream=io.StringIO())
    progress.set_remaining(100.0)
    for n in range(4):
        for i in range(2):
            progress.trial_finished(arm({"compile": "off"}, {"id": f"confirm/amp/{n}", "arm": i, "arms": 2}), wall_s=10.0)
    assert progress.model.unit() == 10.0 and progress.costs() == {}
    # Pairs of a plain and a compiled arm took 60 s: the broker shares it by the priors, the
    # progress learns the compiled arm's price from the whole session.
    share = 60.0 / (1 + plan.COMPILED_ARM_COST)
    for n in range(3):
        progress.trial_finished(arm({"compile": "off"}, {"id": f"confirm/compile/{n}", "arm": 0, "arms": 2}), wall_s=share)
        progress.trial_finished(arm({"compile": "default"}, {"id": f"confirm/compile/{n}", "arm": 1, "arms": 2}),
                                wall_s=share * plan.COMPILED_ARM_COST, cost=plan.COMPILED_ARM_COST)
    learned = progress.costs()["plain+compiled"]
    assert learned == pytest.approx((plan.PRIOR_WEIGHT * plan.COMPILED_ARM_COST + 3 * 5.0) / (plan.PRIOR_WEIGHT + 3))
    before = progress.remaining
    progress.trial_finished(arm({"compile": "default"}, {"id": "confirm/compile/9", "arm": 1, "arms": 2}), wall_s=1.0)
    assert before - progress.remaining == pytest.approx(learned)


def test_fixed_weights_when_learning_is_off():
    progress = ConsoleProgress(quiet=True, stream=io.StringIO(), learn=False)
    progress.set_remaining(10.0)
    progress.trial_finished(arm({"compile": "default"}, {"id": "confirm/compile/0", "arm": 1, "arms": 2}), wall_s=26.0,
                            cost=plan.COMPILED_ARM_COST)
    assert progress.costs() is None
    assert progress.remaining == pytest.approx(10.0 - plan.COMPILED_ARM_COST)
    assert progress._eta() == pytest.approx(progress.remaining * 10.0)


class Recorder(NullProgress):
    def __init__(self, costs=None):
        self.prices = costs
        self.remaining, self.expected = [], []

    def set_remaining(self, trials):
        self.remaining.append(trials)

    def set_expected(self, processes):
        self.expected.append(processes)

    def costs(self):
        return self.prices


def test_the_search_counts_what_is_left_at_the_progress_s_learned_prices(tmp_path):
    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16", "fp16"]}, measure={"pairs": 4, "max_pairs": 8}),
                          "t.yaml", tmp_path)

    def first(costs):
        progress = Recorder(costs)
        Search(spec, tmp_path / str(len(str(costs))), FakeRunner({("amp", "bf16"): 1.5}), MemoryStore(),
               progress=progress).run()
        return progress

    priors, dearer = first(None), first({"screen": 10.0})
    # Before amp's screen: its three screen arms, now at 10 plain arms each.
    assert dearer.remaining[0] - priors.remaining[0] == pytest.approx(3 * (10.0 - plan.prior_cost("screen")))
    # The count of processes does not depend on the prices; once the final check is done only
    # the recommended settings' diagnosis trial is left (bf16 was kept).
    assert dearer.expected == priors.expected and priors.expected[-1] == 1.0
    assert 3 <= priors.expected[0] < priors.remaining[0]
