"""The search report: ``speedups.csv``, ``plots/*.png`` and one self-contained ``report.html``.

Everything is made from the results document alone, so ``trainopt report DIR`` can
redraw it at any time, for complete and for partial results. matplotlib, pandas and
jinja2 are imported only when a report is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainopt.outputs.report.rows import speedup_rows, write_speedups_csv

__all__ = ["write_report", "speedup_rows", "write_speedups_csv"]


def write_report(out_dir: Path, doc: dict[str, Any]) -> Path:
    """Write ``speedups.csv``, ``plots/*.png`` and ``report.html`` into ``out_dir``.

    Every file is written atomically. A figure with nothing to draw (no batch-size
    stage, no kept change) is left out, and an older copy of it is removed so the
    folder never shows a figure from an earlier run.

    Args:
        out_dir: The search output folder; trial log links in the page are relative to it.
        doc: The results document (complete or partial).

    Returns:
        The path of ``report.html``.
    """
    from trainopt.atomic import write_text_atomic
    from trainopt.outputs.report.html import render_html
    from trainopt.outputs.report.plots import PLOTS
    from trainopt.outputs.report.training import training_curves

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_speedups_csv(out_dir / "speedups.csv", speedup_rows(doc))
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(exist_ok=True)
    images: dict[str, Path | None] = {}
    for name, draw in {**PLOTS, "training.png": training_curves}.items():
        target = plots_dir / name
        images[name] = draw(doc, target)
        if images[name] is None:
            target.unlink(missing_ok=True)
    report = out_dir / "report.html"
    write_text_atomic(report, render_html(doc, images, out_dir))
    return report
