"""Command-line interface: ``trainopt init | validate | measure | search | report | export | verify | env``.

``main(argv)`` returns the exit code: 0 success, 1 a run failed, 2 bad input, 130/143
when interrupted by SIGINT/SIGTERM. User mistakes are answered with one clear message,
never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from trainopt.outputs import summary
from trainopt.version import __version__

__all__ = ["main", "Terminated"]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives, so cleanup runs as for Ctrl-C."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own exit code 2 matches "bad input"
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> int:
    print(f"trainopt: error: {message}", file=sys.stderr)
    return code


def _duration(text: str) -> float:
    """``--time-budget``'s value in seconds (argparse answers a bad one with exit code 2)."""
    from trainopt.contract.run_block import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"got {text!r}; {exc}") from None


def _load(spec_path: str):
    from trainopt.contract.spec import load_spec
    from trainopt.execute.refcheck import check_references

    spec = load_spec(spec_path)
    for note in spec.notes:
        print(f"trainopt: note: {note}", file=sys.stderr)
    # A bad reference is a bad-input error (exit 2) before any trial starts, not a failed
    # trial later. The user's modules are imported in a child process, never in this one.
    check_references(spec)
    return spec


# ---- validate -----------------------------------------------------------------------


def cmd_validate(args) -> int:
    spec = _load(args.spec)
    sys.stdout.write(f"# {args.spec}: valid\n" + yaml.safe_dump(spec.resolved(), sort_keys=False))
    return EXIT_OK


# ---- measure -----------------------------------------------------------------------


def cmd_measure(args) -> int:
    from trainopt.atomic import write_json_atomic, write_text_atomic
    from trainopt.contract.protocol import TrialRequest
    from trainopt.contract.spec import apply_overrides, parse_set
    from trainopt.execute.runner import SubprocessRunner
    from trainopt.outputs.workspace import OutputFolder, default_folder

    spec = _load(args.spec)
    overrides = parse_set(args.set or [])
    settings = apply_overrides(spec, overrides)
    eff = spec.limits.effective_batch
    if eff is not None and settings["batch_size"] * settings["grad_accum"] != eff:
        return _fail(
            f"--set: batch_size {settings['batch_size']} x grad_accum {settings['grad_accum']} != "
            f"limits.effective_batch {eff}; set grad_accum={max(1, eff // settings['batch_size'])} too"
        )
    out = Path(args.out) if args.out else default_folder(spec.name, "measure", time.strftime("%Y%m%d-%H%M%S"))
    with OutputFolder(out) as folder:
        write_text_atomic(folder.path / "spec.resolved.yaml", yaml.safe_dump(spec.resolved(), sort_keys=False))
        request = TrialRequest(
            spec=spec.resolved(),
            source_dir=str(spec.source_dir()),
            settings=settings,
            mode="measure",
            result_path=str((folder.path / "trials" / "measure.result.json").resolve()),
            memory_gb=spec.limits.memory_gb,
            trial_id="measure",
            diagnose=True,
        )
        result = SubprocessRunner().run(request, folder.path / "logs" / "measure.log", spec.measure.trial_timeout_s)
        write_json_atomic(folder.path / "result.json", result.to_dict())
    spec_costs = spec.run_costs.model_dump(mode="json") if spec.run_costs is not None else None
    if args.json:
        print(json.dumps(summary.measure_json(result, spec_costs), indent=1))
    else:
        print(summary.measure_summary(result, spec.name, spec_costs))
        if result.loss_note:
            print(result.loss_note)
        print(f"saved: {out / 'result.json'}")
    return EXIT_OK if result.ok else EXIT_FAILED


# ---- search ------------------------------------------------------------------------


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send everything written to stdout meanwhile to stderr, child processes' output included.

    ``search --json`` promises one JSON object on stdout: anything a library prints, or a
    child that inherits the descriptor writes, must not land before it.
    """
    sys.stdout.flush()
    try:
        saved: int | None = os.dup(1)
    except OSError:
        saved = None  # no descriptor 1 at all: nothing can write there
    if saved is not None:
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


def _write_all(out: Path, doc: dict[str, Any], resolved: dict[str, Any], report: bool = True) -> Path | None:
    """Write the result files; the HTML report and plots too unless ``report`` is False.

    Checkpoints during a search skip the report: plotting after every decision would cost
    seconds each time, and ``trainopt report DIR`` rebuilds it from results.json anyway.
    """
    from trainopt.outputs.results import write_outputs

    write_outputs(out, doc, resolved)
    if not report:
        return None
    from trainopt.outputs.report import write_report

    return write_report(out, doc)


def _executor(args, spec, runner):
    """Where the search's measurement sessions run: slots from the flags (``--parallel``,
    ``--ray``), live interleaved arms unless the spec asks for one fresh process per arm."""
    from trainopt.execute import scaling
    from trainopt.execute.session_runners import (
        InterleavedSessionRunner,
        SequentialSessionRunner,
    )

    if spec.measure.session == "sequential":
        serial = SequentialSessionRunner(runner, note="measure.session is sequential")
    else:
        serial = InterleavedSessionRunner(fallback=runner)
    executor = scaling.make_executor(args, spec.device, serial_runner=serial)
    for line in scaling.executor_notes(executor):
        print(f"trainopt: {line}", file=sys.stderr)
    return executor


def _seconds(text: str) -> float:
    """A non-negative number of seconds, for ``--wait-for-quiet``."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds >= 0")
    return value


def _machine_check(args):
    """The machine check before the first trial: a warning when other processes keep the machine busy.

    With ``--wait-for-quiet`` it first waits (up to the given seconds) for the machine to
    quiet down. Returns the probe, which the search samples again after every batch of
    sessions, or None where /proc cannot be read.
    """
    from trainopt.execute.machine_probe import MachineProbe

    probe = MachineProbe()
    say = (lambda text: print(f"trainopt: {text}", file=sys.stderr))
    if args.wait_for_quiet is not None:
        check = probe.wait_for_quiet(args.wait_for_quiet, say=say)
    else:
        check = probe.check_before(1.0)
    if check is None:
        return None
    if check.busy:
        say(f"WARNING: the machine is busy: {check.reason}. Every figure will measure this contention as well "
            f"as the settings; stop those processes, or run with --wait-for-quiet.")
    return probe


def cmd_search(args) -> int:
    if not args.json:
        return _search(args, {})
    headline: dict[str, Any] = {}
    with _stdout_to_stderr():
        code = _search(args, headline)
    if code == EXIT_OK and headline:
        print(json.dumps(headline, default=str))
    return code


def _search(args, headline: dict[str, Any]) -> int:
    """Run the search; on success ``headline`` gets the summary that ``--json`` prints."""
    from trainopt.execute.runner import SubprocessRunner
    from trainopt.outputs.workspace import OutputFolder, default_folder
    from trainopt.search.progress import ConsoleProgress
    from trainopt.search.search import Search, SearchFailed
    from trainopt.search.store import (
        StoreLost,
        TrialStore,
        default_storage_url,
        masked_url,
        param_space,
    )

    spec = _load(args.spec)
    if args.time_budget is not None:
        spec = spec.model_copy(update={"measure": spec.measure.model_copy(update={"time_budget": args.time_budget})})
    out = Path(args.out) if args.out else default_folder(spec.name)
    resolved = spec.resolved()
    with OutputFolder(out) as folder:
        url = args.storage or default_storage_url(folder.path)
        store = TrialStore(url, spec.name, spec.fingerprint(), fresh=args.fresh, space=param_space(spec))
        # Where the Optuna study is, so optuna-dashboard (or a resume) can find it; never the password.
        storage = {"url": masked_url(url), "study": spec.name}
        if store.stale:
            print(f"trainopt: {store.stale} trial(s) left running by an interrupted search will be run again", file=sys.stderr)
        if args.fresh:
            for old in ("results.json", "best.yaml", "speedups.csv", "report.html", "trials.csv"):
                (folder.path / old).unlink(missing_ok=True)
        runner = SubprocessRunner()
        executor = _executor(args, spec, runner)
        probe = _machine_check(args)
        if probe is not None and hasattr(executor, "attach_machine"):
            # The early cut does not act while the machine is busy (every slot, local or on Ray).
            executor.attach_machine(probe)
        progress = ConsoleProgress(quiet=args.quiet)

        def checkpoint(doc):
            doc["storage"] = storage
            _write_all(folder.path, doc, resolved, report=doc["complete"])
            if doc["complete"]:
                # Optuna's best trial is the fastest arm measured; the study also says what best.yaml holds.
                store.record_recommendation(doc.get("best"))

        from trainopt.decide.stability import StabilityGuard

        search = Search(spec, folder.path, runner, store, progress=progress, on_checkpoint=checkpoint, executor=executor,
                        guard=StabilityGuard())
        search.state.machine = search.broker.machine = probe
        try:
            doc = search.run()
        except SearchFailed as exc:
            progress.close()
            return _fail(str(exc), EXIT_FAILED)
        except StoreLost as exc:
            progress.close()
            # What this run measured is kept in the folder too; the store keeps what it stored.
            from trainopt.search.document import build_results

            _write_all(folder.path, {**build_results(search.state, complete=False), "storage": storage}, resolved)
            return _fail(exc.render())
        except (KeyboardInterrupt, Terminated) as exc:
            progress.close()
            code = 143 if isinstance(exc, Terminated) else 130
            # The trial in flight was stopped by the runner; everything finished is in the store.
            from trainopt.search.document import build_results

            _write_all(folder.path, {**build_results(search.state, complete=False), "storage": storage}, resolved)
            print(
                f"\ntrainopt: interrupted; {search.ran} trial(s) finished this time are saved. "
                f"Run the same command again to resume.",
                file=sys.stderr,
            )
            return code
        finally:
            progress.close()
            executor.close()
            store.close()
    headline.update(summary.headline(doc, folder.path, storage if args.storage else None))
    if args.json:
        return EXIT_OK
    print(summary.search_summary(doc))
    if args.storage:
        print(f"store: study {storage['study']!r} in {storage['url']}")
    report = folder.path / "report.html"
    print(f"results: {folder.path / 'results.json'}")
    if report.exists():
        print(f"report: {report}")
    return EXIT_OK


# ---- report / export -----------------------------------------------------------------


def cmd_report(args) -> int:
    from trainopt.outputs.report import write_report
    from trainopt.outputs.results import read_results

    doc = read_results(Path(args.dir))
    out = Path(args.dir) if Path(args.dir).is_dir() else Path(args.dir).parent
    path = write_report(out, doc)
    if not doc.get("complete"):
        print(f"trainopt: partial results (missing: {', '.join(doc.get('missing') or []) or 'unknown'})", file=sys.stderr)
    print(f"report: {path}")
    return EXIT_OK


def cmd_export(args) -> int:
    from trainopt.settings.export import render_export

    sys.stdout.write(render_export(Path(args.dir), args.format))
    return EXIT_OK


# ---- verify ------------------------------------------------------------------------------


def _verify_inputs(args):
    """The spec, the settings to verify and what was recorded with them, from the command line."""
    from trainopt.contract.spec import apply_overrides, load_spec, parse_set
    from trainopt.errors import UserError
    from trainopt.settings.record import read_record

    target = Path(args.dir)
    best = target / "best.yaml" if target.is_dir() else target
    if not best.exists():
        raise UserError(f"{best}: no best.yaml here; give a search output folder or a best.yaml file")
    record = read_record(best)
    spec_path = Path(args.spec) if args.spec else best.parent / "spec.resolved.yaml"
    if not spec_path.exists():
        raise UserError(f"{spec_path}: no spec beside {best.name}; name the spec it was searched with: --spec SPEC")
    spec = _load(str(spec_path)) if args.spec else load_spec(spec_path)
    if not args.spec:
        from trainopt.execute.refcheck import check_references

        try:
            check_references(spec)
        except UserError as exc:
            # spec.resolved.yaml keeps references as written, relative to the original spec's folder.
            raise UserError(f"{exc.render()}\n(references in {spec_path} resolve against its own folder; "
                            f"name the spec the search ran: --spec SPEC)") from None
    if args.set:
        settings = apply_overrides(spec, parse_set(args.set))
    else:
        settings = {**spec.baseline, **dict(record.settings)}
    return spec, settings, dict(record.provenance), best


def cmd_verify(args) -> int:
    import datetime as dt

    from trainopt.atomic import write_json_atomic
    from trainopt.execute.runner import SubprocessRunner
    from trainopt.outputs.workspace import OutputFolder
    from trainopt.search.progress import ConsoleProgress
    from trainopt.search.store import TrialStore
    from trainopt.search.verification import verify

    spec, settings, recorded, best = _verify_inputs(args)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else best.parent / "verify" / stamp
    with OutputFolder(out) as folder:
        store = TrialStore(f"sqlite:///{folder.path / 'trials.db'}", spec.name, spec.fingerprint(), fresh=True)
        runner = SubprocessRunner()
        executor = _executor(args, spec, runner)
        progress = ConsoleProgress(quiet=args.quiet or args.json)
        try:
            doc = verify(spec, settings, folder.path, runner, store, executor, recorded=recorded, progress=progress)
        finally:
            progress.close()
            executor.close()
            store.close()
        write_json_atomic(folder.path / "verify.json", doc)
    if args.json:
        print(json.dumps(doc, default=str))
    else:
        print(summary.verify_summary(doc))
        print(f"details: {folder.path / 'verify.json'}")
    return EXIT_OK if doc["ok"] else EXIT_FAILED


# ---- init / env ----------------------------------------------------------------------

# The starter specs shipped in the package (trainopt/starter/NAME.yaml), by built-in model.
STARTERS = ("mlp", "resnet18", "gpt")


def starter_text(model: str) -> str:
    """The commented starter spec for a built-in ``model`` (one of ``STARTERS``)."""
    from importlib.resources import files

    return (files("trainopt") / "starter" / f"{model}.yaml").read_text(encoding="utf-8")


def cmd_init(args) -> int:
    path = Path(args.path)
    if path.exists() or path.is_symlink():
        return _fail(f"{path} already exists; give another path (trainopt init --model {args.model} NEW.yaml) or remove it first")
    try:
        # "x": never replace a file that appeared since the check above.
        with open(path, "x", encoding="utf-8") as fh:
            fh.write(starter_text(args.model))
    except FileExistsError:
        return _fail(f"{path} already exists; give another path or remove it first")
    except OSError as exc:
        return _fail(f"cannot write {path}: {exc.strerror or exc}; check that its folder exists and is writable")
    print(f"wrote {path}: a starter spec for the built-in {args.model} model (its name: {path.stem})")
    print(f"next: trainopt validate {path}  then  trainopt measure {path}  then  trainopt search {path}")
    return EXIT_OK


def cmd_env(args) -> int:
    from trainopt.execute.env_report import environment_fingerprint

    try:
        env = environment_fingerprint(args.device)
    except RuntimeError as exc:
        return _fail(str(exc), EXIT_FAILED)
    print(json.dumps(env, indent=1, default=str) if args.json else summary.env_text(env))
    return EXIT_OK


# ---- main ----------------------------------------------------------------------------

EXIT_CODES = """exit codes:
  0        success
  1        a run failed (a trial, the search, or reading the environment)
  2        bad input: a bad spec, file, flag or output folder (one message, no traceback)
  130/143  interrupted by SIGINT (Ctrl-C) / SIGTERM; finished trials are kept"""


def _epilog(*examples: str) -> str:
    return "examples:\n" + "\n".join(f"  {e}" for e in examples) + "\n\n" + EXIT_CODES


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="trainopt",
        description="Find, with evidence, which training-speed settings make your training faster.",
        epilog=_epilog("trainopt init --model resnet18 spec.yaml", "trainopt search spec.yaml --out runs/demo"),
        formatter_class=fmt,
    )
    p.add_argument("--version", action="version", version=f"trainopt {__version__}", help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                           help="what to do (trainopt COMMAND --help for its options)")

    def command(name: str, help: str, examples: tuple[str, str]) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog=_epilog(*examples),
                              formatter_class=fmt)

    i = command("init", "write a commented starter spec for a built-in model",
                ("trainopt init", "trainopt init --model gpt runs/gpt.yaml"))
    i.add_argument("path", nargs="?", default="spec.yaml", metavar="PATH",
                   help="where to write it; never overwritten (default: spec.yaml); its file name is the run's name")
    i.add_argument("--model", choices=STARTERS, default="mlp",
                   help="the built-in model the spec trains on synthetic data: mlp (default; minutes on a CPU), "
                        "resnet18 (images) or gpt (tokens); edit model and data to measure your own")
    i.set_defaults(func=cmd_init)

    v = command("validate", "check a spec and print it with every default filled in",
                ("trainopt validate spec.yaml", "trainopt validate configs/resnet.yaml > resolved.yaml"))
    v.add_argument("spec", metavar="SPEC", help="the spec's YAML file")
    v.set_defaults(func=cmd_validate)

    m = command("measure", "measure one configuration in an isolated process",
                ("trainopt measure spec.yaml", "trainopt measure spec.yaml --set batch_size=128 --set amp=bf16 --json"))
    m.add_argument("spec", metavar="SPEC", help="the spec's YAML file; its baseline is measured")
    m.add_argument("--set", action="append", metavar="KNOB=VALUE", help="override a baseline knob (repeatable)")
    m.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    m.add_argument("--out", metavar="DIR", help="folder for the result, log and resolved spec "
                                               "(default: runs/<name>/measure/<time>)")
    m.set_defaults(func=cmd_measure)

    s = command("search", "change one knob at a time and keep only confirmed speedups",
                ("trainopt search spec.yaml", "trainopt search spec.yaml --parallel 2 --json > summary.json"))
    s.add_argument("spec", metavar="SPEC", help="the spec's YAML file: the baseline and the knobs to try")
    s.add_argument("--out", metavar="DIR", help="output folder (default runs/<name>); re-running into it resumes")
    s.add_argument(
        "--storage",
        metavar="URL",
        help="where the trials' Optuna study is kept: an SQLAlchemy URL such as "
        "postgresql+psycopg2://USER:PASSWORD@HOST/DB (needs trainopt[postgres]); default: SQLite in the output folder",
    )
    s.add_argument("--fresh", action="store_true", help="discard stored trials and start over")
    s.add_argument("--time-budget", metavar="DURATION", type=_duration,
                   help="wall-time budget of the search, e.g. 20m or 1h30m (overrides measure.time_budget): a stage "
                        "whose expected time and the final check's do not fit what is left is not tried")
    from trainopt.execute import scaling

    scaling.add_options(s)
    s.add_argument("--quiet", action="store_true", help="no progress (no bar on a terminal, no per-trial lines)")
    s.add_argument("--wait-for-quiet", type=_seconds, nargs="?", const=600.0, default=None, metavar="SECONDS",
                   help="before the first trial, wait while other processes keep the machine busy (at most SECONDS, "
                        "default 600), then start either way")
    s.add_argument("--json", action="store_true",
                   help="print the final summary as one JSON object on stdout (name, complete, baseline and best "
                        "samples/s, speedup and its interval, kept changes, bottleneck, output folder) and nothing "
                        "else there; progress stays on stderr")
    s.set_defaults(func=cmd_search)

    r = command("report", "regenerate the CSV, HTML report and plots from stored results",
                ("trainopt report runs/resnet18-cifar", "trainopt report runs/resnet18-cifar/results.json"))
    r.add_argument("dir", metavar="DIR", help="a search output folder (or its results.json)")
    r.set_defaults(func=cmd_report)

    e = command("export", "print the winning settings for plain PyTorch, Lightning, HF or YAML",
                ("trainopt export runs/resnet18-cifar", "trainopt export runs/resnet18-cifar/best.yaml --format lightning"))
    e.add_argument("dir", metavar="DIR", help="a search output folder or a best.yaml")
    e.add_argument("--format", choices=["torch", "lightning", "hf", "yaml"], default="torch",
                   help="torch: code for a plain PyTorch loop (default); lightning: Trainer(...) keyword arguments; "
                        "hf: TrainingArguments(...) keyword arguments; yaml: the settings as YAML")
    e.set_defaults(func=cmd_export)

    f = command("verify", "re-measure recommended settings against the baseline here and now, and check they train the same",
                ("trainopt verify runs/resnet18-cifar", "trainopt verify runs/resnet18-cifar/best.yaml --json"))
    f.add_argument("dir", metavar="DIR", help="a search output folder or its best.yaml")
    f.add_argument("--spec", metavar="SPEC", help="the spec the settings were searched with "
                                                 "(default: spec.resolved.yaml beside best.yaml)")
    f.add_argument("--set", action="append", metavar="KNOB=VALUE",
                   help="verify the spec's baseline with these knobs changed instead of best.yaml's settings (repeatable)")
    f.add_argument("--out", metavar="DIR", help="folder for the verification's trials and verify.json "
                                               "(default: verify/<time> beside best.yaml)")
    f.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    f.add_argument("--quiet", action="store_true", help="no progress")
    scaling.add_options(f)
    f.set_defaults(func=cmd_verify)

    n = command("env", "print the environment fingerprint that every result records",
                ("trainopt env", "trainopt env --device cuda:1 --json"))
    n.add_argument("--json", action="store_true", help="print one JSON object instead of one line per field")
    n.add_argument("--device", default="auto", metavar="DEVICE",
                   help="the device to describe, as a spec's device field: auto (default), cpu, cuda or cuda:N")
    n.set_defaults(func=cmd_env)
    return p


def _on_sigterm(signum, frame):
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI and return its exit code."""
    from trainopt.errors import UserError

    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return args.func(args)
    except UserError as exc:
        # Every problem the user can fix (spec, references, files, folders) is one family.
        return _fail(exc.render())
    except KeyboardInterrupt:
        print("\ntrainopt: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("\ntrainopt: terminated", file=sys.stderr)
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)
