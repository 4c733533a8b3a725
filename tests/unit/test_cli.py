"""The command line: help for every argument, epilogs, ``init``, ``env`` and ``search --json``.

``search --json`` runs the real search in this process with the fake runner of
``tests/fakes.py`` in place of trial processes; ``env`` starts its real child process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import optuna
import pytest
import yaml

from tests.conftest import ROOT, tiny_spec_dict
from tests.fakes import FakeRunner
from trainopt import cli
from trainopt.contract.fingerprint import COMPARED_KEYS

EXIT_CODE_LINES = ("0 ", "1 ", "2 ", "130/143 ")


def all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    """The main parser and every subcommand's, walked through the subparsers actions."""
    found, todo = [], [("trainopt", cli.build_parser())]
    while todo:
        name, parser = todo.pop()
        found.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
    return found


def test_every_subcommand_is_walked():
    names = {name for name, _ in all_parsers()}
    assert names == {"trainopt", *(f"trainopt {c}" for c in ("init", "validate", "measure", "search", "report", "export", "verify", "env"))}


@pytest.mark.parametrize(("name", "parser"), all_parsers(), ids=[n for n, _ in all_parsers()])
def test_every_positional_and_option_has_help(name, parser):
    missing = []
    for action in parser._actions:
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append("/".join(action.option_strings) or action.dest)
        if isinstance(action, argparse._SubParsersAction):
            # Each subcommand's line in the list of commands.
            missing += [f"{name} {c.dest}" for c in action._choices_actions if not (c.help or "").strip()]
    assert not missing, f"{name}: no help for {missing}"


@pytest.mark.parametrize(("name", "parser"), all_parsers(), ids=[n for n, _ in all_parsers()])
def test_every_parser_shows_two_examples_and_the_exit_codes(name, parser):
    text = parser.format_help()
    examples = text.split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(examples) == 2 and all(e.strip().startswith("trainopt ") for e in examples), examples
    codes = text.split("exit codes:\n", 1)[1].splitlines()
    assert [c.strip().split(" ", 1)[0] + " " for c in codes[:4]] == list(EXIT_CODE_LINES)
    if name != "trainopt":
        assert all(e.split()[1] == name.split()[1] for e in examples), "examples of another command"


def test_the_example_commands_parse():
    for name, parser in all_parsers():
        examples = parser.format_help().split("examples:\n", 1)[1].split("\n\n", 1)[0].splitlines()
        for example in examples:
            words = example.split()
            words = words[: words.index(">")] if ">" in words else words
            cli.build_parser().parse_args(words[1:])  # exits 2 on an unknown flag or value


def test_export_format_help_names_every_format():
    (export,) = [p for n, p in all_parsers() if n == "trainopt export"]
    (fmt,) = [a for a in export._actions if "--format" in a.option_strings]
    assert all(choice in fmt.help for choice in fmt.choices)


# ---- init ------------------------------------------------------------------------------


def test_every_starter_is_shipped_and_none_other():
    shipped = sorted(p.stem for p in (ROOT / "trainopt" / "starter").glob("*.yaml"))
    assert shipped == sorted(cli.STARTERS)


@pytest.mark.parametrize("model", cli.STARTERS)
def test_init_writes_a_commented_starter_that_validate_accepts(tmp_path, monkeypatch, capsys, model):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init", "--model", model, f"my-{model}.yaml"]) == 0
    path = tmp_path / f"my-{model}.yaml"
    text = path.read_text()
    assert text == cli.starter_text(model)
    assert sum(line.lstrip().startswith("#") for line in text.splitlines()) >= 5
    data = yaml.safe_load(text)
    assert data["model"]["name"] == model and data["search"]
    capsys.readouterr()
    assert cli.main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    resolved = yaml.safe_load(out)
    # No name in the starter: the run is named after its file.
    assert resolved["name"] == f"my-{model}" and resolved["model"]["name"] == model


def test_init_defaults_to_spec_yaml_with_the_mlp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["init"]) == 0
    assert yaml.safe_load((tmp_path / "spec.yaml").read_text())["model"]["name"] == "mlp"


def test_init_never_overwrites_a_file(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text("mine\n")
    assert cli.main(["init", "--model", "gpt", str(path)]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and str(path) in err and "Traceback" not in err
    assert path.read_text() == "mine\n"


def test_init_into_a_missing_folder_is_bad_input(tmp_path, capsys):
    assert cli.main(["init", str(tmp_path / "nowhere" / "spec.yaml")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_init_refuses_an_unknown_model(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["init", "--model", "vgg", str(tmp_path / "x.yaml")])
    assert info.value.code == 2 and not (tmp_path / "x.yaml").exists()


# ---- env -------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = (
        "import sys\n"
        "from trainopt.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "assert 'torch' not in sys.modules, 'the CLI process imported torch'\n"
        "sys.exit(code)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def test_env_json_is_the_fingerprint_results_record_read_in_a_child():
    proc = run_cli("env", "--json")
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    assert set(COMPARED_KEYS) <= set(env)
    assert env["device_type"] == "cpu" and env["torch"] and env["python"]
    assert env["cpu_set"] == sorted(os.sched_getaffinity(0))


def test_env_prints_one_line_per_field():
    proc = run_cli("env")
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert lines["device_type"] == "cpu" and "torch" in lines and "cpu_model" in lines


def test_env_on_a_device_that_is_not_there_is_bad_input():
    proc = run_cli("env", "--device", "cuda:99")
    assert proc.returncode == 2 and proc.stdout == ""
    assert "cuda:99" in proc.stderr and "Traceback" not in proc.stderr


# ---- search --json -------------------------------------------------------------------


class NoisyRunner(FakeRunner):
    """A fake runner that also writes to stdout, as a chatty library or child process would."""

    def run(self, request, log_path, timeout_s):
        print("print from inside the search")
        os.write(1, b"raw write to descriptor 1\n")
        return super().run(request, log_path, timeout_s)


@pytest.fixture
def fake_search(tmp_path, monkeypatch):
    """``trainopt search`` with the fake runner in place of trial processes."""
    from trainopt.execute import executors, runner

    fake = NoisyRunner({("amp", "bf16"): 1.5}, seed=1)
    monkeypatch.setattr(runner, "SubprocessRunner", lambda *a, **k: fake)
    monkeypatch.setattr(cli, "_executor", lambda args, spec, r: executors.SerialExecutor(r))
    data = tiny_spec_dict(search={"amp": ["off", "bf16"]}, measure={"pairs": 4, "max_pairs": 8})
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(data))
    return spec, tmp_path / "out"


def test_search_json_prints_the_headline_as_one_object_and_nothing_else(fake_search, capfd):
    spec, out = fake_search
    assert cli.main(["search", str(spec), "--out", str(out), "--json"]) == 0
    captured = capfd.readouterr()
    assert captured.out.count("\n") == 1
    head = json.loads(captured.out)
    assert "print from inside the search" in captured.err and "raw write to descriptor 1" in captured.err
    doc = json.loads((out / "results.json").read_text())
    assert head["name"] == doc["name"] == "tiny" and head["complete"] is True
    assert head["speedup"] == doc["speedup"] and head["speedup_ci"] == doc["speedup_ci"]
    assert head["baseline_samples_per_s"] > 0 and head["best_samples_per_s"] > head["baseline_samples_per_s"]
    assert [(k["knob"], k["from"], k["to"]) for k in head["kept"]] == [("amp", "off", "bf16")]
    assert head["bottleneck"]["baseline"]["verdict"] == doc["diagnosis"]["bottleneck"]
    assert head["recommended"]["settings"] == doc["best"]["settings"]
    assert head["out"] == str(out) and head["results"] == str(out / "results.json")
    assert head["report"] == str(out / "report.html")
    # The CLI marks the recommendation on the study too.
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{out / 'trials.db'}")
    assert study.user_attrs["recommended_settings"] == doc["best"]["settings"]
    assert "params_amp" in study.trials_dataframe().columns


def test_search_without_json_prints_the_text_summary(fake_search, capfd):
    spec, out = fake_search
    assert cli.main(["search", str(spec), "--out", str(out)]) == 0
    out_text = capfd.readouterr().out
    assert "search tiny: complete" in out_text and "kept: amp off -> bf16" in out_text and "results:" in out_text
    # The machine check sampled the machine before the search and after its sessions.
    machine = json.loads((out / "results.json").read_text())["machine"]
    assert machine is None or (machine["before"]["cpus"] >= 1 and machine["samples"] == len(machine["during"]))


def test_search_warns_before_the_first_trial_when_the_machine_is_busy_and_can_wait(fake_search, capfd, monkeypatch):
    from trainopt.decide.machine import MachineCheck
    from trainopt.execute import machine_probe

    calls = []

    def busy_then_quiet(self, interval_s=1.0):
        calls.append(interval_s)
        self.before = {"busy": len(calls) < 3, "others": 1.0, "cpus": 2, "top": [["yes", 1.0]]}
        return MachineCheck(len(calls) < 3, "other processes used 1.00 of 2 CPUs (yes 1.00)" if len(calls) < 3 else "")

    monkeypatch.setattr(machine_probe.MachineProbe, "check_before", busy_then_quiet)
    spec, out = fake_search
    assert cli.main(["search", str(spec), "--out", str(out), "--wait-for-quiet", "60"]) == 0
    err = capfd.readouterr().err
    assert err.count("waiting for it to quiet down") == 2 and "WARNING: the machine is busy" not in err
    assert json.loads((out / "results.json").read_text())["machine"]["before"]["waited_s"] == 10.0
    calls.clear()
    assert cli.main(["search", str(spec), "--out", str(tmp := out.parent / "again")]) == 0
    err = capfd.readouterr().err
    assert "WARNING: the machine is busy: other processes used 1.00 of 2 CPUs (yes 1.00)" in err
    assert json.loads((tmp / "results.json").read_text())["machine"]["before"]["busy"] is True
    with pytest.raises(SystemExit) as exc:
        cli.main(["search", str(spec), "--wait-for-quiet", "soon"])
    assert exc.value.code == 2 and "'soon' is not a number of seconds >= 0" in capfd.readouterr().err


def test_search_json_with_a_bad_spec_prints_nothing_on_stdout(tmp_path, capfd):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec_dict(search={"amp": ["fp8"]})))
    assert cli.main(["search", str(spec), "--out", str(tmp_path / "out"), "--json"]) == 2
    captured = capfd.readouterr()
    assert captured.out == "" and "search.amp[0]" in captured.err


@pytest.mark.parametrize(
    "parts, message",
    [
        ({"model": {"name": "resnet18", "args": {"num_class": 10}}},
         "trainopt: error: model.args: unknown key(s) 'num_class' for resnet18; allowed: "),
        ({"model": {"name": "gpt_code.py:build", "args": {"n_layers": 2}}},
         "trainopt: error: model.args: unknown key(s) 'n_layers' for 'gpt_code.py:build'; allowed: n_layer "),
    ],
    ids=["builtin", "user function"],
)
def test_validate_rejects_an_argument_the_factory_does_not_take_with_exit_2(tmp_path, capsys, parts, message):
    (tmp_path / "gpt_code.py").write_text("def build(n_layer=1):\n    raise RuntimeError('never called')\n")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(tiny_spec_dict(**parts)))
    assert cli.main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
