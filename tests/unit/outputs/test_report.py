"""The report: ranked rows, CSV dtypes, figures and one self-contained, escaped HTML page."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import FIXTURES, ROOT
from trainopt.decide.stability import Observation, StabilityGuard, final_disagreement
from trainopt.outputs.report import (
    plots,
    speedup_rows,
    write_report,
    write_speedups_csv,
)
from trainopt.outputs.report.formats import (
    fmt_bytes,
    fmt_duration,
    fmt_percent,
    fmt_rate,
    fmt_speedup,
)
from trainopt.outputs.report.rows import COLUMNS, FLOAT_COLUMNS, read_speedups_csv

TINY = FIXTURES / "results-tiny"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
XSS = "<script>alert(1)</script>"


def tiny_doc():
    return json.loads((TINY / "results.json").read_text())


def _decision(knob, stage, frm, to, verdict, reason, **extra_fields):
    d = {
        "knob": knob, "stage": stage, "from": frm, "to": to, "verdict": verdict, "reason": reason,
        "speedup": None, "ci": None, "n_pairs": 0, "coverage": None, "screen_speedup": None,
        "before_samples_per_s": None, "after_samples_per_s": None, "before_peak_memory_bytes": None,
        "after_peak_memory_bytes": None, "kept": False, "extra": {},
    }
    d.update(extra_fields)
    return d


def _trial(doc, knob, stage, settings_update, status, error, log):
    base = doc["baseline"]["settings"] if doc.get("baseline") else {}
    return {
        "id": len(doc["trials"]), "key": f"screen/{knob}/candidate/x", "stage": stage, "knob": knob,
        "role": "screen", "tag": "candidate", "mode": "measure", "settings": {**base, **settings_update},
        "status": status, "samples_per_s": None, "peak_memory_bytes": None, "step_time_s": None,
        "data_wait_fraction": None, "windows": [], "steady_from": 0, "steady": True, "compile_s": None,
        "warmup_s": None, "wall_s": 1.0, "error": error, "log": log,
    }


def _unchanged(doc):
    base = doc["baseline"]["samples_per_s"]
    doc["best"] = {"settings": doc["baseline"]["settings"], "samples_per_s": base}
    doc["speedup"], doc["speedup_ci"] = 1.0, None
    doc["final"] = {"verdict": "unchanged", "reason": "no change was confirmed as an improvement; the baseline stays",
                    "speedup": 1.0, "ci": None, "n_pairs": 0, "samples_per_s": base, "baseline_samples_per_s": base}
    doc["trials"] = [t for t in doc["trials"] if t["stage"] != "final"]
    return doc


def failures_doc():
    """Every candidate failed: out of memory, a crash, an error; one probe ran out of memory."""
    doc = tiny_doc()
    doc["decisions"] = [
        _decision("batch_size", "batch", 16, 256, "oom", "CUDA out of memory. Tried to allocate 2.00 GiB", extra={"grad_accum": 1}),
        _decision("amp", "precision", "off", "fp16", "crashed", "killed by signal 9"),
        _decision("num_workers", "input", 0, 4, "error", "RuntimeError: DataLoader worker exited unexpectedly"),
    ]
    doc["trials"] = [t for t in doc["trials"] if t["stage"] == "baseline" or t["role"] == "probe"]
    doc["trials"].append(_trial(doc, "batch_size", "batch", {"batch_size": 256}, "oom", "CUDA out of memory", "logs/0009-screen-batch_size.log"))
    doc["trials"].append(_trial(doc, "amp", "precision", {"amp": "fp16"}, "crashed", "killed by signal 9", "logs/0010-screen-amp.log"))
    doc["trials"].append(_trial(doc, "num_workers", "input", {"num_workers": 4}, "error", "RuntimeError: worker", "logs/0011-screen-num_workers.log"))
    doc["batch_size"]["probes"].append({"size": 256, "fits": False, "status": "oom", "peak_memory_bytes": None})
    doc["batch_size"]["probes"].append({"size": 192, "fits": False, "status": "oom", "peak_memory_bytes": None})
    doc["batch_size"]["lr_hint"] = None
    doc["search_order"] = ["batch_size", "amp", "num_workers"]
    return _unchanged(doc)


def no_kept_doc():
    doc = tiny_doc()
    for d in doc["decisions"]:
        if d["kept"]:
            d["kept"], d["verdict"] = False, "equivalent"
            d["reason"] = "1.010x [0.980, 1.040] over 4 pairs"
            d["speedup"], d["ci"], d["n_pairs"] = 1.01, [0.98, 1.04], 4
    doc["decisions"].append(
        _decision("channels_last", "layout", False, True, "regressed", "0.900x [0.870, 0.930] over 3 pairs",
                  speedup=0.9, ci=[0.87, 0.93], n_pairs=3, screen_speedup=1.05, before_samples_per_s=13000.0, after_samples_per_s=11700.0)
    )
    doc["batch_size"]["lr_hint"] = None
    return _unchanged(doc)


def one_knob_doc():
    doc = tiny_doc()
    doc["search_order"] = ["amp"]
    doc["decisions"] = [d for d in doc["decisions"] if d["knob"] == "amp"]
    doc["trials"] = [t for t in doc["trials"] if t["knob"] in ("baseline", "amp")]
    doc["batch_size"] = {}
    return _unchanged(doc)


def no_batch_doc():
    doc = tiny_doc()
    doc["search_order"] = ["pin_memory", "amp"]
    doc["decisions"] = [d for d in doc["decisions"] if d["knob"] != "batch_size"]
    doc["trials"] = [t for t in doc["trials"] if t["stage"] != "batch"]
    doc["batch_size"] = {}
    return _unchanged(doc)


def failed_baseline_doc():
    doc = tiny_doc()
    base = doc["trials"][0]
    base.update(status="error", samples_per_s=None, windows=[], error="ModuleNotFoundError: No module named 'mymodel'")
    doc.update(
        complete=False, missing=["pin_memory", "batch_size", "amp", "final check"], diagnosis={}, search_order=[],
        decisions=[], trials=[base], batch_size={}, env={}, speedup=None, speedup_ci=None, final={},
    )
    doc["baseline"].update(status="error", samples_per_s=None, step_time_s=None, data_wait_fraction=None,
                           peak_memory_bytes=None, error=base["error"])
    doc["best"] = {"settings": doc["baseline"]["settings"], "samples_per_s": None}
    return doc


def partial_doc():
    doc = tiny_doc()
    doc["complete"] = False
    doc["missing"] = ["amp", "final check"]
    doc["decisions"] = [d for d in doc["decisions"] if d["knob"] != "amp"]
    doc["trials"] = [t for t in doc["trials"] if t["stage"] not in ("precision", "final")]
    doc.update(speedup=None, speedup_ci=None, final={})
    doc["best"]["samples_per_s"] = None
    return doc


def compile_doc():
    doc = tiny_doc()
    doc["decisions"].append(
        _decision("compile", "compile", "off", "default", "inconclusive",
                  "1.200x [1.100, 1.300] over 3 pairs; compile takes 42.0 s and repays it only after 2,000 steps, beyond run_length_steps 1,000",
                  speedup=1.2, ci=[1.1, 1.3], n_pairs=3,
                  extra={"compile_s": 42.0, "break_even_steps": 2000.0, "run_length_steps": 1000})
    )
    doc["decisions"].append(
        _decision("compile", "compile", "off", "max-autotune", "inconclusive", "never repays",
                  speedup=1.0, ci=[0.97, 1.02], n_pairs=3,
                  extra={"compile_s": 300.0, "break_even_steps": None, "run_length_steps": 1000})
    )
    return doc


def stability_doc(reason_text=""):
    """The fixture with a stability record made by the real guard: a burst of load in the
    precision stage (one session re-run and then stable, one out of retries), and the final
    check's warning."""
    doc = tiny_doc()
    guard = StabilityGuard(max_retries=2, settle_s=10.0)
    t = 0.0

    def session(stage, knob, role, h, level, noise, burst=0, burst_noise=0.4):
        nonlocal t
        for retry in range(guard.max_retries + 1):
            t += 6.0
            bad = retry < burst
            o = Observation(t_s=t, stage=stage, knob=knob + reason_text, role=role, settings_hash=h,
                            incumbent_samples_per_s=level * (0.3 if bad else 1.0), noise=burst_noise if bad else noise, wall_s=5.0)
            c = guard.check(o)
            final = c.stable or retry == guard.max_retries
            guard.record(o, c, retry=retry, final=final)
            if final:
                return
            t += guard.settle_s

    for i, level in enumerate((12900.0, 13100.0, 12700.0, 13000.0)):
        session("batch" + reason_text, "batch_size", "screen" if i == 0 else "confirm", "base", level, 0.05)
    session("precision", "amp", "screen", "inc64", 23500.0, 0.06)
    session("precision", "amp", "confirm", "inc64", 23900.0, 0.06)
    session("precision", "amp", "confirm", "inc64", 23300.0, 0.06)
    # Re-run once, then stable; then out of retries on a shifted level with ordinary noise.
    session("precision", "amp", "confirm", "inc64", 23800.0, 0.06, burst=1)
    session("precision", "amp", "confirm", "inc64", 23600.0, 0.06, burst=3, burst_noise=0.06)
    session("final", "final", "final", "base", 12200.0, 0.05)
    doc["stability"] = guard.to_dict()
    kept = [d for d in doc["decisions"] if d["kept"]]
    doc["final"]["baseline_samples_per_s"] = 6000.0
    warning = final_disagreement(doc["final"], kept, doc["baseline"]["samples_per_s"])
    assert warning is not None
    doc["warnings"] = [warning + reason_text]
    return doc


def breakdown_doc(doc=None, device_type="cuda"):
    """The fixture (or ``doc``) with step breakdowns read by the real verdict: an input-bound
    baseline, compute-bound recommended settings, and the run-costs advice for a spec's costs."""
    from tests.fakes import breakdown_of
    from trainopt.decide import bottleneck, run_costs

    doc = doc or tiny_doc()
    busy = (lambda share: share) if device_type == "cuda" else (lambda share: None)
    base = breakdown_of({"data_wait": 0.45, "to_device": 0.05, "forward": 0.2, "backward": 0.2, "optimizer": 0.05},
                        device_type=device_type, device_busy=busy(0.5))
    final = breakdown_of({"data_wait": 0.04, "to_device": 0.03, "forward": 0.35, "backward": 0.4, "optimizer": 0.1,
                          "loss_read": 0.02}, device_type=device_type, device_busy=busy(0.9))
    doc["diagnosis"] = bottleneck.diagnose(base, doc["baseline"]["data_wait_fraction"])
    doc["final_diagnosis"] = bottleneck.diagnose(final, 0.04)
    doc["final_diagnosis_error"] = None
    doc["run_costs"] = run_costs.advise({"checkpoint_s": 0.005, "eval_s": 30.0, "eval_batches": 20},
                                        {"checkpoint_every_steps": 1000, "eval_every_steps": 200}, doc["baseline"]["step_time_s"])
    return doc


VARIANTS = {
    "stability": (stability_doc, ["Stability", "The final check disagrees", "6,000 samples/s", "12,956 samples/s",
                                  "verdict marked", "noise-sd below its level", "1 verdict measured on an unstable machine"]),
    "fixture": (tiny_doc, ["Summary", "1.825×", "batch_size", "complete", "Learning rate"]),
    "failures only": (failures_doc, ["out of memory", "crashed", "CUDA out of memory", "logs/0009-screen-batch_size.log", "No change was confirmed as faster", "Out of memory from batch size 192"]),
    "no kept change": (no_kept_doc, ["No change was confirmed as faster", "slower", "no measurable difference", "nothing to accumulate"]),
    "one knob": (one_knob_doc, ["amp", "screened out", "No change was confirmed as faster"]),
    "no batch stage": (no_batch_doc, ["pin_memory", "not applicable", "amp"]),
    "failed baseline": (failed_baseline_doc, ["The baseline trial failed (error)", "ModuleNotFoundError", "logs/0000-baseline-baseline.log", "Partial results", "No decisions yet"]),
    "partial": (partial_doc, ["Partial results", "Missing: amp, final check", "the final check has not run", "≈ 1.863×"]),
    "compile": (compile_doc, ["Compilation", "42.0 s", "2,000 steps", "never", "5 m 00 s"]),
    "breakdown": (breakdown_doc, ["Where a step's time goes", "input-bound (data_wait", "compute-bound (", "checkpoint save"]),
}


# ---- rows ------------------------------------------------------------------------------


def test_rows_rank_kept_first_then_the_rest_with_reasons():
    rows = speedup_rows(tiny_doc())
    assert [r["rank"] for r in rows] == [1, 2, 3, 4, 5]
    assert list(rows[0]) == list(COLUMNS)
    assert rows[0]["kept"] and rows[0]["knob"] == "batch_size" and rows[0]["to"] == "64"
    assert rows[0]["speedup"] == pytest.approx(1.8626391496524208)
    assert (rows[0]["ci_low"], rows[0]["ci_high"]) == pytest.approx((1.1124096617883947, 3.1155606546197))
    assert rows[0]["pairs"] == 3
    # Screened-out rows by screening speedup, fastest first; not_applicable last.
    assert [(r["knob"], r["to"], r["verdict"]) for r in rows[1:]] == [
        ("batch_size", "128", "screened-out"),
        ("batch_size", "32", "screened-out"),
        ("amp", "bf16", "screened-out"),
        ("pin_memory", "true", "not_applicable"),
    ]
    assert all(r["reason"] for r in rows)
    assert rows[4]["reason"].startswith("pin_memory applies to CUDA devices only")


def test_cumulative_speedup_is_the_product_of_kept_speedups():
    doc = tiny_doc()
    doc["decisions"].append(
        _decision("amp", "precision", "off", "bf16", "improved", "1.5x", speedup=1.5, ci=[1.4, 1.6], n_pairs=3, kept=True)
    )
    doc["decisions"].append(
        _decision("num_workers", "input", 0, 2, "improved", "1.1x", speedup=1.1, ci=[1.05, 1.2], n_pairs=3, kept=True)
    )
    rows = speedup_rows(doc)
    kept = [r for r in rows if r["kept"]]
    assert [r["knob"] for r in kept] == ["batch_size", "amp", "num_workers"]
    assert [r["rank"] for r in kept] == [1, 2, 3]
    assert kept[0]["cumulative_speedup"] == pytest.approx(1.8626391496524208)
    assert kept[1]["cumulative_speedup"] == pytest.approx(1.8626391496524208 * 1.5)
    assert kept[2]["cumulative_speedup"] == pytest.approx(1.8626391496524208 * 1.5 * 1.1)
    assert all(r["cumulative_speedup"] is None for r in rows if not r["kept"])


def test_rest_follow_the_verdict_order():
    rows = speedup_rows(failures_doc()) + speedup_rows(no_kept_doc())
    verdicts = [r["verdict"] for r in speedup_rows(no_kept_doc())]
    assert verdicts == ["regressed", "equivalent", "screened-out", "screened-out", "screened-out", "not_applicable"]
    assert all(r["cumulative_speedup"] is None for r in rows)


def test_rows_of_a_doc_without_decisions_are_empty():
    assert speedup_rows(failed_baseline_doc()) == []


# ---- CSV -------------------------------------------------------------------------------


def test_csv_dtypes_floats_bool_and_string_values(tmp_path):
    path = write_speedups_csv(tmp_path / "speedups.csv", speedup_rows(tiny_doc()))
    frame = pd.read_csv(path)
    assert list(frame.columns) == list(COLUMNS)
    for name in FLOAT_COLUMNS:
        assert frame[name].dtype == "float64", name
    assert frame["kept"].dtype == bool
    assert frame["rank"].dtype == "int64" and frame["pairs"].dtype == "int64"
    # Mixed knob values ("off", 16, false) come back as the text written in best.yaml.
    assert pd.api.types.is_string_dtype(frame["from"]) and pd.api.types.is_string_dtype(frame["to"])
    assert all(isinstance(v, str) for v in frame["from"]) and all(isinstance(v, str) for v in frame["to"])
    assert set(frame["to"]) == {"64", "128", "32", "bf16", "true"}
    assert frame.loc[0, "cumulative_speedup"] == pytest.approx(1.8626391496524208)
    assert frame["cumulative_speedup"].isna().sum() == 4


def test_read_speedups_csv_keeps_values_as_text_even_when_they_look_like_numbers(tmp_path):
    doc = tiny_doc()
    doc["decisions"] = [d for d in doc["decisions"] if d["knob"] == "batch_size"]
    doc["decisions"].append(_decision("prefetch_factor", "input", None, 4, "equivalent", "same"))
    path = write_speedups_csv(tmp_path / "speedups.csv", speedup_rows(doc))
    frame = read_speedups_csv(path)
    assert sorted(frame["from"]) == ["16", "16", "16", "null"]
    assert pd.api.types.is_string_dtype(frame["to"]) and "64" in set(frame["to"])
    assert frame["speedup"].dtype == "float64" and frame["kept"].dtype == bool


def test_empty_csv_still_has_the_header(tmp_path):
    path = write_speedups_csv(tmp_path / "speedups.csv", [])
    assert path.read_text().strip() == ",".join(COLUMNS)


# ---- formatting ------------------------------------------------------------------------


def test_number_formats():
    assert fmt_rate(12955.58) == "12,956 samples/s"
    assert fmt_rate(12.3456) == "12.3 samples/s"
    assert fmt_rate(None) == "—"
    assert fmt_speedup(1.23449) == "1.234×"
    assert fmt_percent(0.4266) == "43%" and fmt_percent(0.052) == "5.2%"
    assert fmt_bytes(384126976) == "366.3 MiB"
    assert fmt_bytes(12 * 1024**3) == "12.00 GiB"
    assert fmt_duration(12.34) == "12.3 s" and fmt_duration(130.4) == "2 m 10 s" and fmt_duration(3900) == "1 h 05 m"


# ---- plots -----------------------------------------------------------------------------


def _assert_png(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5000


@pytest.mark.parametrize("name", list(plots.PLOTS))
def test_every_plot_of_the_fixture_is_a_png(tmp_path, name):
    path = plots.PLOTS[name](breakdown_doc(stability_doc()), tmp_path / name)
    assert path == tmp_path / name
    _assert_png(path)


def test_plots_return_none_when_nothing_to_draw(tmp_path):
    assert plots.batch_curve(no_batch_doc(), tmp_path / "b.png") is None
    assert plots.waterfall(no_kept_doc(), tmp_path / "w.png") is None
    assert plots.speedup_bars(failed_baseline_doc(), tmp_path / "s.png") is None
    assert plots.window_traces(failed_baseline_doc(), tmp_path / "t.png") is None
    assert plots.stability_trace(tiny_doc(), tmp_path / "st.png") is None
    assert plots.stability_trace({**tiny_doc(), "stability": {"points": []}}, tmp_path / "st.png") is None
    # No profiled step: a diagnosis from the loader wait alone, none at all, or a breakdown without shares.
    assert plots.step_breakdown(tiny_doc(), tmp_path / "br.png") is None
    assert plots.step_breakdown(failed_baseline_doc(), tmp_path / "br.png") is None
    assert plots.step_breakdown({**tiny_doc(), "diagnosis": {"bottleneck": "compute", "breakdown": {"shares": {}}},
                                 "final_diagnosis": None}, tmp_path / "br.png") is None
    assert list(tmp_path.iterdir()) == []


def test_plots_of_failures_mark_the_out_of_memory_boundary(tmp_path):
    doc = failures_doc()
    _assert_png(plots.speedup_bars(doc, tmp_path / "s.png"))
    _assert_png(plots.batch_curve(doc, tmp_path / "b.png"))


def test_importing_the_report_package_stays_cheap():
    code = "import sys, trainopt.outputs.report; print(sorted(m for m in ('matplotlib', 'pandas', 'jinja2') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


# ---- HTML ------------------------------------------------------------------------------


def _assert_self_contained(html):
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, re.I)
    assert "<link" not in html.lower()
    assert "@import" not in html and "url(" not in html
    for src in re.findall(r"""src\s*=\s*["']([^"']*)""", html):
        assert src.startswith("data:image/png;base64,")


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_kind_of_results_renders(tmp_path, variant):
    make, words = VARIANTS[variant]
    report = write_report(tmp_path, make())
    assert report == tmp_path / "report.html"
    html = report.read_text(encoding="utf-8")
    _assert_self_contained(html)
    for word in words:
        assert word in html, word
    assert (tmp_path / "speedups.csv").is_file()
    assert not list(tmp_path.glob(".*.tmp")) and not list((tmp_path / "plots").glob(".*.tmp"))


def test_fixture_report_shows_every_section(tmp_path):
    html = write_report(tmp_path, tiny_doc()).read_text(encoding="utf-8")
    for section in ("summary", "diagnosis", "ranking", "waterfall", "knobs", "batch", "settings", "environment"):
        assert f'<section id="{section}">' in html
    assert 'id="partial-banner"' not in html
    assert "12,157 <span" in html and "23,799 <span" in html
    assert "[1.415×, 2.051×] over 3 pairs" in html
    assert "2 m 10 s" in html and "Intel(R) Xeon(R) Processor (cpu)" in html
    assert "input-bound: 43% of each step waits for the DataLoader" in html
    assert html.count("data:image/png;base64,") == 4
    assert 'class="sortable" id="ranked"' in html
    assert "batch_size: 64" in html  # the YAML
    assert "torch.set_num_threads(1)" in html and "batch_size=64," in html  # the snippet
    assert "avx512_bf16" in html  # the environment
    assert "366.0 MiB" in html  # a probe's peak memory


def test_failure_logs_are_relative_links(tmp_path):
    html = write_report(tmp_path, failures_doc()).read_text(encoding="utf-8")
    assert '<a href="logs/0009-screen-batch_size.log">' in html
    assert '<a href="logs/0010-screen-amp.log">' in html


def test_a_log_path_with_a_scheme_is_not_a_link(tmp_path):
    doc = failures_doc()
    doc["trials"][-1]["log"] = "javascript:alert(1)"
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert 'href="javascript' not in html
    assert "<code>javascript:alert(1)</code>" in html


def test_partial_results_say_so_at_the_top(tmp_path):
    html = write_report(tmp_path, partial_doc()).read_text(encoding="utf-8")
    banner = html.index('id="partial-banner"')
    assert banner < html.index('<section id="summary">')
    assert "Missing: amp, final check." in html
    assert "(best confirmed so far)" in html


def test_user_text_is_escaped(tmp_path):
    doc = failures_doc()
    doc["name"] = XSS
    doc["decisions"][0]["reason"] = f"CUDA out of memory {XSS}"
    doc["decisions"][1]["to"] = XSS
    doc["trials"][-1]["error"] = XSS
    doc["trials"][-1]["log"] = f"logs/{XSS}.log"
    doc["diagnosis"]["text"] = XSS
    doc["env"]["hostname"] = XSS
    doc["batch_size"]["lr_hint"] = XSS
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert XSS not in html
    assert "<script>alert" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    # The only script is the page's own table sorter.
    assert html.count("<script") == 1
    csv = pd.read_csv(tmp_path / "speedups.csv")
    assert XSS in set(csv["to"])


def test_a_figure_with_nothing_to_draw_is_removed_from_an_earlier_report(tmp_path):
    write_report(tmp_path, tiny_doc())
    assert (tmp_path / "plots" / "batch_size.png").is_file()
    write_report(tmp_path, no_batch_doc())
    assert not (tmp_path / "plots" / "batch_size.png").exists()
    assert (tmp_path / "plots" / "speedups.png").is_file()


def test_report_command_end_to_end(tmp_path, cli_env):
    folder = tmp_path / "run"
    shutil.copytree(TINY, folder)
    (folder / "results.json").write_text(json.dumps(breakdown_doc(stability_doc())))
    proc = subprocess.run(
        [sys.executable, "-m", "trainopt", "report", str(folder)], capture_output=True, text=True, env=cli_env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert f"report: {folder / 'report.html'}" in proc.stdout
    assert (folder / "report.html").is_file() and (folder / "speedups.csv").is_file()
    assert sorted(p.name for p in (folder / "plots").iterdir()) == sorted(plots.PLOTS)


def test_report_command_on_partial_results_warns(tmp_path, capsys):
    from trainopt.cli import main

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps(partial_doc()))
    assert main(["report", str(folder)]) == 0
    err = capsys.readouterr().err
    assert "partial results (missing: amp, final check)" in err
    assert "Partial results" in (folder / "report.html").read_text(encoding="utf-8")


def test_the_summary_says_which_confirmation_backs_the_recommended_settings(tmp_path):
    doc = tiny_doc()
    doc["final"].update(verdict="regressed", reason="0.800x [0.700, 0.900] over 6 pairs")
    doc["best"].update(source="first-kept-change", reason="these are the last settings confirmed against the baseline: amp off -> bf16", n_pairs=4)
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    recommended = re.search(r'<p id="recommended">(.*?)</p>', html, re.S).group(1)
    assert "the baseline plus the first kept change only" in recommended
    assert "amp off -&gt; bf16" in recommended
    # The reason is a sentence of its own, and says the final check's figures nowhere twice.
    assert "</span>" in recommended and ". <span class=\"muted\">These are the last settings" in recommended
    assert html.count("0.800x [0.700, 0.900] over 6 pairs") == 1
    assert "over 4 pairs" in html
    # The speedup card shows the recommended settings' figure, so not the final check's verdict.
    card = re.search(r'Overall speedup</div>(.*?)</div>\s*</div>', html, re.S).group(1)
    assert "regressed" not in card


def test_a_results_file_without_a_recommendation_source_still_renders(tmp_path):
    doc = tiny_doc()
    assert "source" not in doc["best"]
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert 'id="recommended"' not in html


# ---- stability -----------------------------------------------------------------------------


def test_the_stability_panel_shows_the_trace_the_noise_table_and_the_counts(tmp_path):
    doc = stability_doc()
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    panel = re.search(r'<section id="stability">(.*?)</section>', html, re.S).group(1)
    assert "data:image/png;base64," in panel
    assert html.count("data:image/png;base64,") == 5
    counts = re.search(r'<p id="stability-counts">(.*?)</p>', panel, re.S).group(1)
    assert f"{doc['stability']['retries']} re-runs" in counts and doc["stability"]["retries"] == 3
    assert "1 verdict measured on an unstable machine" in counts
    table = re.search(r'<table class="kv" id="noise-by-stage">(.*?)</table>', panel, re.S).group(1)
    rows = re.findall(r"<tr><td>(.*?)</td><td class=\"num\">(.*?)</td>", table)
    assert rows == [("batch", "5.0%"), ("precision", "6.0%"), ("final", "5.0%")]
    unstable = re.search(r'<table id="unstable-sessions">(.*?)</table>', panel, re.S).group(1)
    assert unstable.count("<tr>") == 1 + 4  # header, and the four unstable attempts
    assert unstable.count("verdict marked") == 1
    assert "Unstable periods" in panel
    # A summary card says so too.
    assert "1 unstable</span>" in html


def test_warnings_are_shown_at_the_top(tmp_path):
    html = write_report(tmp_path, stability_doc()).read_text(encoding="utf-8")
    banner = html.index('id="warnings"')
    assert banner < html.index('<section id="summary">')
    warning = re.search(r'<div class="banner warning" id="warnings">(.*?)</div>', html, re.S).group(1)
    assert "The final check disagrees with earlier measurements" in warning
    assert "quieter machine" in warning


def test_stability_text_and_warnings_are_escaped(tmp_path):
    doc = stability_doc(reason_text=XSS)
    doc["stability"]["points"][-1]["reason"] = XSS
    doc["decisions"][0]["extra"]["unstable"] = XSS
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert XSS not in html
    assert html.count("<script") == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in re.search(r'id="warnings">(.*?)</div>', html, re.S).group(1)
    assert "Measured while the machine was unstable: &lt;script&gt;" in html


def test_results_without_a_stability_record_still_render(tmp_path):
    doc = tiny_doc()
    assert "stability" not in doc and "warnings" not in doc
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    panel = re.search(r'<section id="stability">(.*?)</section>', html, re.S).group(1)
    assert "Not recorded" in panel and "<img" not in panel
    assert 'id="warnings"' not in html
    assert not (tmp_path / "plots" / "stability.png").exists()
    # An empty record (a search stopped before its first session) renders too.
    doc["stability"] = {"points": [], "unstable_periods": [], "noise_by_stage": {}, "retries": 0, "unstable_verdicts": 0}
    doc["warnings"] = []
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert "0 sessions; 0 re-runs; no verdict measured on an unstable machine" in html


def test_the_report_says_where_the_trials_ran(tmp_path):
    from trainopt.outputs.report.html import render_html

    doc = {"name": "p", "complete": True, "decisions": [], "trials": [
        {"status": "ok", "slot": 0, "node": "host-a", "device": "cpu:0", "session": {"id": "screen/amp/s", "mode": "interleaved"}},
        {"status": "ok", "slot": 0, "node": "host-a", "device": "cpu:0", "session": {"id": "screen/amp/s", "mode": "interleaved"}},
        {"status": "ok", "slot": 1, "node": "<host-b>", "device": "cpu:1", "session": {"id": "confirm/amp/p0", "mode": "sequential"}},
        {"status": "not_applicable", "slot": None},
    ]}
    html = render_html(doc, {}, tmp_path)
    section = html[html.index('id="placement"'):html.index('id="environment"')]
    assert "<td>host-a</td><td>cpu:0</td><td class=\"num\">2</td><td class=\"num\">1</td><td>interleaved</td>" in section
    assert "&lt;host-b&gt;" in section and "<host-b>" not in section
    assert "sequential" in section


# ---- where a step's time goes ----------------------------------------------------------------


def _panel(html):
    return re.search(r'<section id="breakdown">(.*?)</section>', html, re.S).group(1)


def test_the_breakdown_panel_shows_a_bar_per_configuration_the_verdicts_and_the_run_costs(tmp_path):
    import html as htmllib

    doc = breakdown_doc()
    panel = _panel(write_report(tmp_path, doc).read_text(encoding="utf-8"))
    assert "<h2>Where a step's time goes</h2>" in panel
    assert panel.count('<img src="data:image/png;base64,') == 1
    _assert_png(tmp_path / "plots" / "breakdown.png")
    # Each configuration's verdict with the figure behind it, and the GPU's busy share.
    for label, key in (("Baseline", "diagnosis"), ("Recommended settings", "final_diagnosis")):
        d = doc[key]
        line = re.search(rf'<p class="bottleneck"><strong>{label}:</strong>(.*?)</p>', panel, re.S).group(1)
        assert htmllib.escape(d["reason"], quote=False) in line
        assert f"The GPU was busy {fmt_percent(d['breakdown']['device_busy'])} of the wall time." in line
    assert doc["diagnosis"]["bottleneck"] == "input" and doc["final_diagnosis"]["bottleneck"] == "compute"
    # One row per phase, one column per configuration.
    table = re.search(r'<table class="kv" id="phases">(.*?)</table>', panel, re.S).group(1)
    assert re.findall(r'<th class="num">(.*?)</th>', table) == ["baseline", "recommended settings"]
    rows = re.findall(r"<tr><td><code>(\w+)</code></td><td class=\"reason\">.*?</td>"
                      r"<td class=\"num\">(.*?)</td><td class=\"num\">(.*?)</td></tr>", table)
    base, final = doc["diagnosis"]["breakdown"]["shares"], doc["final_diagnosis"]["breakdown"]["shares"]
    assert rows == [(p, fmt_percent(base[p]), fmt_percent(final[p])) for p in base]
    # The run costs: a checkpoint within the budget, an evaluation far beyond it.
    costs = re.search(r'<table class="kv" id="run-costs">(.*?)</table>', panel, re.S).group(1)
    cells = re.findall(r"<tr><td>(.*?)</td><td class=\"num\">(.*?)</td><td class=\"num\">(.*?)</td>"
                       r"<td class=\"num (good|bad)\">(.*?)</td><td class=\"num\">(.*?)</td></tr>", costs)
    advice = doc["run_costs"]
    assert advice["checkpoint"]["within_budget"] and not advice["evaluation"]["within_budget"]
    assert cells == [
        # A cost under a second in milliseconds: "0.0 s" would hide it.
        ("checkpoint save", "5.0 ms", "1,000 steps", "good",
         fmt_percent(advice["checkpoint"]["share"]), f"{advice['checkpoint']['every_steps_for_budget']:,} steps"),
        ("evaluation pass (20 batches)", fmt_duration(advice["evaluation"]["cost_s"]), "200 steps", "bad",
         fmt_percent(advice["evaluation"]["share"]), f"{advice['evaluation']['every_steps_for_budget']:,} steps"),
    ]


def test_without_a_breakdown_the_panel_explains_why_and_draws_nothing(tmp_path):
    # Results written before the profiled window: the loader wait alone decided the verdict.
    panel = _panel(write_report(tmp_path, tiny_doc()).read_text(encoding="utf-8"))
    assert "<img" not in panel and 'id="phases"' not in panel and 'id="run-costs"' not in panel
    assert "No breakdown in these results" in panel
    assert "input-bound: 43% of each step waits for the DataLoader" in panel
    assert not (tmp_path / "plots" / "breakdown.png").exists()
    # A failed baseline: nothing was measured at all.
    panel = _panel(write_report(tmp_path / "failed", failed_baseline_doc()).read_text(encoding="utf-8"))
    assert "No breakdown: the baseline was not measured." in panel and "<img" not in panel


def test_a_report_drawn_again_without_a_breakdown_drops_the_old_figure(tmp_path):
    write_report(tmp_path, breakdown_doc())
    assert (tmp_path / "plots" / "breakdown.png").is_file()
    write_report(tmp_path, tiny_doc())
    assert not (tmp_path / "plots" / "breakdown.png").exists()


def test_a_failed_diagnosis_of_the_recommended_settings_leaves_the_baseline_s_bar_and_says_why(tmp_path):
    doc = breakdown_doc(device_type="cpu")
    doc["final_diagnosis"] = None
    doc["final_diagnosis_error"] = "the diagnosis trial of the recommended settings failed (oom: fake out of memory)"
    doc["run_costs"] = None
    panel = _panel(write_report(tmp_path, doc).read_text(encoding="utf-8"))
    assert panel.count("<img") == 1
    assert "<strong>Recommended settings:</strong>" not in panel and "<strong>Baseline:</strong>" in panel
    assert "No breakdown of the recommended settings: the diagnosis trial of the recommended settings failed (oom" in panel
    table = re.search(r'<table class="kv" id="phases">(.*?)</table>', panel, re.S).group(1)
    assert re.findall(r'<th class="num">(.*?)</th>', table) == ["baseline"]
    # On a CPU there is no device busy share to show, and without a run_costs section no costs.
    assert "was busy" not in panel and 'id="run-costs"' not in panel


def test_breakdown_text_is_escaped(tmp_path):
    doc = breakdown_doc()
    doc["diagnosis"]["reason"] = XSS
    doc["final_diagnosis"]["breakdown"]["shares"][XSS] = 0.0
    doc["final_diagnosis"]["breakdown"]["device_type"] = XSS
    doc["final_diagnosis_error"] = XSS
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert XSS not in html and html.count("<script") == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in _panel(html)


def test_the_report_snippet_writes_the_loop_the_trials_ran(tmp_path):
    # The page's PyTorch snippet comes from the resolved spec beside results.json: a model that
    # computes its own loss gets ``model_loss(model, batch)``, pairs and a named loss get the pair
    # loop; the optimizer is the spec's, with its arguments, or what the baseline trial built.
    import yaml

    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.resolved.yaml").write_text(yaml.safe_dump(
        {"device": "cpu", "loss": "model", "data": {"name": "x"},
         "optimizer": {"name": "adamw", "args": {"lr": 0.0003, "weight_decay": 0.1}}}))
    page = write_report(run, tiny_doc()).read_text().replace("&#34;", '"').replace("&#39;", "'")
    assert "loss = model_loss(model, batch)" in page
    assert "optimizer = torch.optim.AdamW(model.parameters(), lr=0.0003, weight_decay=0.1)" in page
    other = tmp_path / "pairs"
    other.mkdir()
    (other / "spec.resolved.yaml").write_text(yaml.safe_dump({"device": "cpu", "loss": "cross_entropy"}))
    assert "model_loss" not in write_report(other, tiny_doc()).read_text()
    lightning = tmp_path / "lightning"
    lightning.mkdir()
    (lightning / "spec.resolved.yaml").write_text(yaml.safe_dump({"device": "cpu", "loss": "cross_entropy",
                                                                  "model": {"name": "m:Module", "args": {}}}))
    doc = tiny_doc()
    doc["baseline"]["workload"] = {"form": "lightning", "data_batch_size": None, "optimizer": {
        "source": "configure_optimizers", "name": None, "class": "torch.optim.SGD", "args": {"lr": 0.1, "momentum": 0.9}}}
    page = write_report(lightning, doc).read_text().replace("&#34;", '"').replace("&#39;", "'")
    assert "return self.module.training_step(batch, batch_idx)" in page and "loss_fn" not in page
    assert "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # what configure_optimizers() built" in page


def test_a_noisy_busy_machine_is_called_noisy_with_its_figure_and_the_check_is_shown(tmp_path):
    doc = tiny_doc()
    doc["stability"] = {"points": [], "unstable_periods": [], "noise_by_stage": {"amp": 0.05, "threads": 0.32},
                        "retries": 0, "unstable_verdicts": 0}
    doc["machine"] = {"before": {"busy": True, "reason": f"other processes used 1.00 of 2 CPUs ({XSS} 1.00)", "others": 1.0},
                      "during": [{"busy": True, "others": 0.9, "reason": "other processes used 0.90 of 2 CPUs (yes 0.90)"},
                                 {"busy": False, "others": 0.0, "reason": ""}]}
    doc["sessions"] = {"interleaved": 3, "sequential": 0,
                       "notes": ["arm 1 ran below 0.50x the incumbent (below 0.33x after one window) and measured no further windows"]}
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    card = re.search(r'<div class="label">Stability</div>\s*<div class="value">(.*?)</div>', html, re.S).group(1)
    assert "noisy (window noise up to 32%)" in card and "steady" not in card
    panel = re.search(r'<section id="stability">(.*?)</section>', html, re.S).group(1)
    assert "Before the search: busy: other processes used 1.00 of 2 CPUs" in panel
    assert "busy in 1 of 2 samples" in panel
    assert "measured no further windows" in re.search(r'id="cut-early">(.*?)</p>', panel, re.S).group(1)
    assert XSS not in html
    # A quiet machine at normal noise is steady, and says nothing more.
    doc["stability"]["noise_by_stage"] = {"amp": 0.05}
    doc["machine"] = {"before": {"busy": False}, "during": []}
    doc["sessions"]["notes"] = []
    html = write_report(tmp_path, doc).read_text(encoding="utf-8")
    assert '<span class="good">steady</span>' in html and 'id="cut-early"' not in html
