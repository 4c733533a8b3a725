"""The numbers the documentation quotes are the code's.

Each check reads a threshold or default from the code (a module constant, a dataclass or
pydantic default, a function's default argument) and looks for the sentence that quotes it in
the page, with the number written from the code's value. A changed constant fails here until
the page says the new figure; a page that drops the sentence fails too, so the sentence cannot
quietly go stale. Whitespace (line breaks) does not matter.
"""

from __future__ import annotations

import inspect
import re

import pytest

from tests.conftest import ROOT
from trainopt.contract.checks import CheckSection
from trainopt.contract.spec import MeasureSection
from trainopt.decide import bottleneck, dependence, machine, recommendation, screen, training_check
from trainopt.decide.batch import BatchSizeSearch
from trainopt.decide.sequential import SequentialRule, holdout_pairs
from trainopt.decide.stability import FRESH_PROCESS_TOLERANCE, StabilityGuard, final_disagreement


def page(name: str) -> str:
    """A page's text with every run of whitespace as one space."""
    return re.sub(r"\s+", " ", (ROOT / name).read_text(encoding="utf-8"))


def pct(fraction: float) -> str:
    """0.03 -> ``3 %``, 0.025 -> ``2.5 %``: how the pages write a share."""
    return f"{fraction * 100:g} %"


def times(n: float) -> str:
    """How the pages write a small count of repeats in words."""
    return {1: "once", 2: "twice"}.get(n, f"{n:g} times")


def default(function, name: str):
    return inspect.signature(function).parameters[name].default


GUARD = StabilityGuard()
MEASURE = MeasureSection()
RULE = SequentialRule.__init__
PREDICTION = default(final_disagreement, "prediction_level")


def quotes() -> list[tuple[str, str]]:
    """(page, the sentence with the code's number) for every number the pages quote."""
    g, m = GUARD, MEASURE
    deciding = [
        # The stability guard (item 9).
        f"moves more than {g.level_limit:g} spreads from the median of its earlier stable sessions (once {g.min_history} exist;",
        f"never below {g.level_noise:g}× its usual window noise, nor below {pct(g.level_sd_floor)})",
        f"its window noise exceeds {g.noise_ratio:g}× the usual",
        f"and {pct(g.noise_floor)}; there is no fixed noise ceiling by default",
        f"is measured again after {g.settle_s:g} s, at most {times(g.max_retries)}",
        f"and the next sessions wait {g.settle_s:g} s",
        f"({g.persist} sessions at one new level with ordinary noise)",
        f"a {pct(PREDICTION)} prediction interval on the log scale, never narrower than "
        f"±{pct(default(final_disagreement, 'spread_floor'))}, and a fixed ±{pct(default(final_disagreement, 'baseline_tolerance'))}",
        "beyond twice or half the arms' rate" if FRESH_PROCESS_TOLERANCE == 2.0 else f"{FRESH_PROCESS_TOLERANCE}",
        # The rule, the verdicts and the pair budget.
        f"(screened at {screen.SCREEN_GATE:.2f}× or better)",
        f"A near miss ({screen.RESCREEN_FLOOR:.2f}–{screen.SCREEN_GATE:.2f}×)",
        f"`pairs`, then ×{default(RULE, 'growth'):g} each time, and always `max_pairs`",
        f"({pct(default(RULE, 'final_share'))} on the last, the rest shared by the earlier ones;",
        f"the median estimate's {pct(default(RULE, 'futility_confidence'))} upper bound",
        f"all ran at the {pct(default(RULE, 'projection_confidence'))} upper bound of the mean",
        f"({pct((1 - m.confidence) / 2)} at the default {pct(m.confidence)})",
        f"with the default {m.min_speedup:g} is `equivalent`",
        f"`max_pairs` defaults to {m.max_pairs} because",
        f"Instead {holdout_pairs(m.confidence)} further fresh pairs",
        f"`max(pairs, {holdout_pairs(m.confidence)})`",
        # Dependence.
        f"taken {dependence.RHO_MARGIN:g} standard errors (`{dependence.RHO_MARGIN:g} / sqrt(n)`) high and kept within [0, {dependence.MAX_RHO:g}]",
        # Batch size.
        f"is within {pct(BatchSizeSearch.tolerance)} of the fitting size",
        # The final check and the recommendation.
        f"its exact one-sided {pct(1 - recommendation.CONTRADICTION_LEVEL)} signed-rank upper bound",
        f"contradicts them with probability at most {pct(recommendation.CONTRADICTION_LEVEL)} for any noise",
        f"is caught in at least {pct(recommendation.CONTRADICTION_POWER)} of searches by the planned number of pairs",
        # The training check.
        f"`check.training_steps` optimizer steps (default {CheckSection().training_steps})",
        "the last quarter of the steps" if training_check.TAIL_SHARE == 0.25 else f"{training_check.TAIL_SHARE}",
        f"(at least {training_check.MIN_TAIL_STEPS})",
        f"{times(training_check.BLOWUP_FACTOR)} its first loss",
        f"{training_check.TOLERANCE_FACTOR:g} times the *yardstick*, and at least {pct(training_check.RELATIVE_FLOOR)} of the reference's tail mean",
        # The bottleneck.
        f"`data_wait` above {pct(bottleneck.INPUT_BOUND_THRESHOLD)} of the step",
        f"`loss_read` above {pct(bottleneck.SYNC_BOUND_THRESHOLD)}",
        f"the device busy below {pct(bottleneck.HOST_BOUND_BUSY)} of the wall time",
    ]
    measurement = [
        f"(after {g.settle_s:g} s, at most {times(g.max_retries)})",
        f"and the next sessions wait {g.settle_s:g} s",
        f"unstable beyond {g.level_limit:g} spreads",
        "(from the third one on)" if g.min_history == 3 else f"{g.min_history}",
        f"never below {g.level_noise:g}× the incumbent's usual window noise (nor below {pct(g.level_sd_floor)})",
        f"Unstable above {g.noise_ratio:g}× the usual",
        f"windows) and above {pct(g.noise_floor)}.",
        "the 1-in-1,000 point of the F ratio" if g.noise_alarm == 1e-3 else f"{g.noise_alarm}",
        f"never narrower than ±{pct(default(final_disagreement, 'spread_floor'))}; a fixed "
        f"±{pct(default(final_disagreement, 'baseline_tolerance'))} when it has fewer than three arms",
        "twice or half the arms' rate" if FRESH_PROCESS_TOLERANCE == 2.0 else f"{FRESH_PROCESS_TOLERANCE}",
        f"other processes used more than {pct(machine.BUSY_SHARE)} of its CPUs",
        f"within {pct(machine.NORMAL_NOISE)}, the band of a quiet machine",
        f"spread by more than {machine.CUT_SPREAD:g}x",
        f"less than {pct(machine.STARVED_SHARE)} of a core",
    ]
    from trainopt.contract.run_block import DEFAULT_RUN_STEPS, RunCostsSection
    from trainopt.decide.run_costs import BUDGET

    spec_page = [
        f"without a `run` block that judgement assumes {DEFAULT_RUN_STEPS:,} steps",
        f"the fewest steps between two of them that keep it within {pct(BUDGET)}:",
        f"| `eval_batches` | batches in one evaluation pass | {RunCostsSection().eval_batches} |",
        f"| `check.training_steps` | optimizer steps of each training run (at least "
        f"{next(c.ge for c in CheckSection.model_fields['training_steps'].metadata if hasattr(c, 'ge'))}); the last quarter is judged | {CheckSection().training_steps} |",
    ]
    readme = [
        f"faster by more than a {pct(m.min_speedup)} margin with {pct(m.confidence)} confidence",
        f"at most {pct((1 - m.confidence) / 2)} **per knob** at the default {pct(m.confidence)} confidence",
        f"from {holdout_pairs(m.confidence)} further held-out pairs",
        f"in {pct(recommendation.CONTRADICTION_POWER)} of searches",
        f"its one-sided {pct(1 - recommendation.CONTRADICTION_LEVEL)} bound",
        f"at most {pct(recommendation.CONTRADICTION_LEVEL)} of the time",
        f"for {CheckSection().training_steps} steps beside your own",
        f"for {CheckSection().training_steps} steps beside the baseline",
        f"(with {m.max_pairs} pairs, the default:",
    ]
    return ([("docs/deciding.md", q) for q in deciding] + [("docs/measurement.md", q) for q in measurement]
            + [("docs/spec-and-knobs.md", q) for q in spec_page] + [("README.md", q) for q in readme])


@pytest.mark.parametrize("name, sentence", quotes(), ids=lambda v: v[:60])
def test_the_page_quotes_the_code_s_number(name, sentence):
    assert sentence in page(name), f"{name} does not say {sentence!r}"


def test_the_guard_has_no_noise_ceiling_by_default_as_the_pages_say():
    assert GUARD.noise_ceiling is None
    assert "No fixed noise ceiling by default." in page("docs/measurement.md")


def test_the_wait_for_quiet_default_is_the_one_the_page_gives():
    from trainopt.cli import build_parser

    args = build_parser().parse_args(["search", "spec.yaml", "--wait-for-quiet"])
    assert f"(at most {args.wait_for_quiet:g} s by default" in page("docs/measurement.md")


def test_a_changed_number_is_caught():
    # The check cannot pass by seeing nothing: a sentence with another number is not in the page.
    text = page("docs/deciding.md")
    assert f"`max_pairs` defaults to {MEASURE.max_pairs} because" in text
    assert f"`max_pairs` defaults to {MEASURE.max_pairs + 1} because" not in text


def spec_listing() -> dict:
    """The spec listing in docs/spec-and-knobs.md (its first YAML block), as data."""
    import yaml

    text = (ROOT / "docs" / "spec-and-knobs.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block, "docs/spec-and-knobs.md has no YAML block"
    return yaml.safe_load(block.group(1))


def test_the_spec_listing_gives_the_code_s_defaults():
    from trainopt.contract.spec import LimitsSection

    listed = spec_listing()
    for section, model in (("measure", MeasureSection()), ("limits", LimitsSection()), ("check", CheckSection())):
        code = model.model_dump(mode="json")
        shown = listed[section]
        assert shown, f"the listing has no {section} section"
        differ = {k: (v, code.get(k, "(no such field)")) for k, v in shown.items() if code.get(k, "(no such field)") != v}
        assert not differ, f"{section}: listed value against the code's default: {differ}"
    from trainopt.contract.spec import BatchSearch

    batch = BatchSearch()
    assert f"also: margin ({batch.margin:g}), max_candidates ({batch.max_candidates})" in page("docs/spec-and-knobs.md")


def test_the_probe_items_line_shown_in_the_docs_is_the_summary_s():
    from trainopt.outputs.summary import probe_items_line

    line = probe_items_line({"sampled": 512, "dataset_len": 512, "largest": 2001, "median": 20, "smallest": 3,
                             "in_batch": 25, "batch_size": 32, "unit": "elements"})
    assert line in (ROOT / "docs" / "your-code.md").read_text(encoding="utf-8").splitlines()


def test_the_command_synopsis_names_every_flag():
    import argparse

    from trainopt.cli import build_parser

    text = (ROOT / "docs" / "cli-and-storage.md").read_text(encoding="utf-8")
    synopsis = text.split("## Commands", 1)[1].split("```", 2)[1]
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = []
    for name, sub in commands.items():
        lines = [line for line in synopsis.splitlines() if line.startswith(f"trainopt {name} ")]
        assert lines, f"the synopsis has no line for trainopt {name}"
        # A command's flags may go on over the indented lines right below it.
        block = [lines[0]]
        for line in synopsis.splitlines()[synopsis.splitlines().index(lines[0]) + 1:]:
            if not line.startswith(" "):
                break
            block.append(line)
        for action in sub._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag != "--help" and not any(flag in line for line in block):
                    missing.append(f"trainopt {name} {flag}")
    assert not missing, f"docs/cli-and-storage.md's synopsis does not name {missing}"


def test_the_readme_gives_the_requirements_pyproject_declares():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    python = project["requires-python"].removeprefix(">=")
    torch = next(d for d in project["dependencies"] if d.startswith("torch>=")).removeprefix("torch>=").split(",")[0]
    systems = [c for c in project["classifiers"] if c.startswith("Operating System ::")]
    text = page("README.md")
    assert f"Python ≥ {python}" in text and f"PyTorch ≥ {torch}" in text
    assert systems == ["Operating System :: POSIX :: Linux"] and "Linux only" in text


def test_the_knob_table_lists_every_knob_with_the_catalog_s_default():
    from trainopt.knobs.catalog import KNOBS, format_value

    rows = {}
    for line in (ROOT / "docs" / "spec-and-knobs.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"`\w+`", cells[0]) and cells[0].strip("`") in KNOBS:
            rows[cells[0].strip("`")] = cells[2]
    assert set(rows) == set(KNOBS), f"knob table rows differ from the catalog: {sorted(set(KNOBS) ^ set(rows))}"
    differ = {name: (rows[name], knob.default) for name, knob in KNOBS.items() if rows[name] != format_value(knob.default)}
    assert not differ, f"the knob table's default against the catalog's: {differ}"
