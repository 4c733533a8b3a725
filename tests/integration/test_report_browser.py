"""report.html in a real headless Chromium: no console errors, a filled and sortable table.

Chromium is required (Debian: ``apt-get install -y chromium``); without it these tests
fail, unless ``TRAINOPT_SKIP_BROWSER=1`` says to skip them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FIXTURES
from trainopt.outputs.report import write_report

pytestmark = pytest.mark.integration

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

# Chromium with --enable-logging=stderr prints every console message of the page as
#   [pid:tid:time:INFO:CONSOLE:1] "Uncaught ReferenceError: x is not defined", source: file:///... (1)
# (older builds write CONSOLE(1)); the report logs nothing, so any such line is a failure.
_CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\]\s*(.*)$")


def find_chromium() -> str:
    """The Chromium binary; a missing browser fails the calling test rather than skipping it.

    Called inside each test, not from a fixture: a fixture that fails reports an error
    in setup, and a missing browser should read as a failed test.
    """
    if os.environ.get("TRAINOPT_SKIP_BROWSER") == "1":
        pytest.skip("TRAINOPT_SKIP_BROWSER=1")
    path = os.environ.get("TRAINOPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path and os.path.exists("/usr/bin/chromium"):
        path = "/usr/bin/chromium"
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            "Chromium is not installed; install it (Debian/Ubuntu: apt-get install -y chromium) "
            "or set TRAINOPT_SKIP_BROWSER=1 to skip the browser tests",
            pytrace=False,
        )
    return path


def run_chromium(chromium: str, page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
        page.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"chromium exited with {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


def console_messages(stderr: str) -> list[str]:
    messages = []
    for line in stderr.splitlines():
        m = _CONSOLE.search(line)
        if m:
            messages.append(m.group(1))
        elif "Uncaught" in line:
            messages.append(line)
    return messages


def dump_dom(chromium: str, page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    proc = run_chromium(chromium, page, tmp_path, "--dump-dom")
    return proc.stdout, console_messages(proc.stderr)


def ranked_rows(dom: str) -> list[str]:
    m = re.search(r'<table[^>]*id="ranked"[^>]*>(.*?)</table>', dom, re.S)
    assert m, "no ranked table in the rendered page"
    body = re.search(r"<tbody>(.*?)</tbody>", m.group(1), re.S)
    return re.findall(r"<tr[\s>]", body.group(1)) if body else []


@pytest.fixture
def report(tmp_path):
    if os.environ.get("TRAINOPT_SKIP_BROWSER") == "1":
        pytest.skip("TRAINOPT_SKIP_BROWSER=1")
    folder = tmp_path / "run"
    shutil.copytree(FIXTURES / "results-tiny", folder)
    return write_report(folder, json.loads((folder / "results.json").read_text()))


def test_a_page_with_a_script_error_is_detected(tmp_path):
    chromium = find_chromium()
    # Without this, a change in Chromium's log format would make the checks below pass vacuously.
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><body><table id='ranked'><tbody><tr><td>1</td></tr></tbody></table>"
        "<script>console.error('deliberate'); notDefinedAnywhere();</script></body></html>"
    )
    _, messages = dump_dom(chromium, page, tmp_path)
    assert any("Uncaught ReferenceError" in m and "notDefinedAnywhere" in m for m in messages), messages
    assert any("deliberate" in m for m in messages), messages


def test_report_renders_without_console_errors_and_fills_the_table(report, tmp_path):
    chromium = find_chromium()
    dom, messages = dump_dom(chromium, report, tmp_path)
    assert messages == []
    assert len(ranked_rows(dom)) == 5
    # The sorting script ran to the end and wired up the table.
    assert re.search(r'<table[^>]*id="ranked"[^>]*data-sort-ready="1"', dom)
    assert "1.825×" in dom


def test_clicking_headers_sorts_the_table(report, tmp_path):
    chromium = find_chromium()
    probe = """<script>
(function () {
  var table = document.getElementById("ranked");
  var heads = table.tHead.rows[0].cells;
  function column(name) {
    for (var i = 0; i < heads.length; i++) { if (heads[i].textContent.trim() === name) { return heads[i]; } }
  }
  function ranks() { return [].map.call(table.tBodies[0].rows, function (r) { return r.cells[0].textContent.trim(); }); }
  var out = {};
  column("screen").click(); out.screenAsc = ranks(); out.screenAria = column("screen").getAttribute("aria-sort");
  column("screen").click(); out.screenDesc = ranks(); out.descAria = column("screen").getAttribute("aria-sort");
  column("knob").click(); out.knobAsc = ranks();
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}());
</script></body>"""
    page = report.with_name("probe.html")
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", probe), encoding="utf-8")
    dom, messages = dump_dom(chromium, page, tmp_path)
    assert messages == []
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, "the probe script did not run"
    out = json.loads(m.group(1).replace("&quot;", '"'))
    # Screen speedups: #1 2.193, #2 1.997, #3 1.337, #4 0.972, #5 none (always last).
    assert out["screenAsc"] == ["4", "3", "2", "1", "5"]
    assert out["screenDesc"] == ["1", "2", "3", "4", "5"]
    assert (out["screenAria"], out["descAria"]) == ("ascending", "descending")
    assert out["knobAsc"][0] == "4" and out["knobAsc"][-1] == "5"  # amp first, pin_memory last


def test_failed_baseline_report_has_no_console_errors(tmp_path):
    chromium = find_chromium()
    doc = json.loads((FIXTURES / "results-tiny" / "results.json").read_text())
    base = doc["trials"][0]
    base.update(status="error", windows=[], samples_per_s=None, error="boom <b>")
    doc.update(complete=False, missing=["final check"], decisions=[], trials=[base], batch_size={}, env={}, diagnosis={},
               speedup=None, speedup_ci=None, final={})
    doc["baseline"].update(status="error", samples_per_s=None, error="boom <b>")
    report = write_report(tmp_path / "run", doc)
    dom, messages = dump_dom(chromium, report, tmp_path)
    assert messages == []
    assert "The baseline trial failed" in dom and "boom &lt;b&gt;" in dom


def test_screenshot_is_not_blank(report, tmp_path):
    chromium = find_chromium()
    shot = tmp_path / "report.png"
    run_chromium(chromium, report, tmp_path, f"--screenshot={shot}", "--window-size=1280,2400")
    data = shot.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 50_000
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (2400, 1280)
    # A blank or single-colour page has (almost) no spread in its pixel values.
    assert float(pixels[..., :3].std()) > 0.05


def test_stability_panel_and_warnings_render_without_console_errors(tmp_path):
    chromium = find_chromium()
    from tests.unit.outputs.test_report import stability_doc

    report = write_report(tmp_path / "run", stability_doc(reason_text="<i>"))
    dom, messages = dump_dom(chromium, report, tmp_path)
    assert messages == []
    assert re.search(r'<div class="banner warning" id="warnings">', dom)
    assert "The final check disagrees" in dom and "&lt;i&gt;" in dom
    panel = re.search(r'<section id="stability">(.*?)</section>', dom, re.S).group(1)
    assert '<img src="data:image/png;base64,' in panel
    assert "verdict marked" in panel


def test_breakdown_panel_shows_its_heading_and_figure(tmp_path):
    chromium = find_chromium()
    from tests.unit.outputs.test_report import breakdown_doc

    doc = breakdown_doc()
    doc["diagnosis"]["reason"] += " <b>"
    report = write_report(tmp_path / "run", doc)
    # Measured by the page itself once loaded: the heading takes room, the image decoded to the
    # PNG's own size and is laid out, one verdict line per configuration.
    probe = """<script>
window.addEventListener("load", function () {
  var panel = document.getElementById("breakdown");
  var h2 = panel.querySelector("h2"), img = panel.querySelector("img");
  var out = {heading: h2.textContent, headingHeight: h2.getBoundingClientRect().height,
             complete: img.complete, naturalWidth: img.naturalWidth, shownWidth: img.getBoundingClientRect().width,
             verdicts: [].map.call(panel.querySelectorAll("p.bottleneck"), function (p) { return p.textContent; }),
             phases: panel.querySelectorAll("#phases tbody tr").length};
  var pre = document.createElement("pre"); pre.id = "probe"; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script></body>"""
    page = report.with_name("probe.html")
    page.write_text(report.read_text(encoding="utf-8").replace("</body>", probe), encoding="utf-8")
    dom, messages = dump_dom(chromium, page, tmp_path)
    assert messages == []
    m = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert m, "the probe script did not run"
    out = json.loads(m.group(1).replace("&quot;", '"').replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))
    assert out["heading"] == "Where a step's time goes" and out["headingHeight"] > 0
    import matplotlib.image

    png = matplotlib.image.imread(str(report.parent / "plots" / "breakdown.png"))
    assert out["complete"] and out["naturalWidth"] == png.shape[1] and out["shownWidth"] > 0
    assert [v.split(":")[0] for v in out["verdicts"]] == ["Baseline", "Recommended settings"]
    # The reason reached the page as text, not as markup.
    assert "<b>" in out["verdicts"][0] and "input-bound" in out["verdicts"][0]
    assert out["phases"] == len(doc["diagnosis"]["breakdown"]["shares"])
