"""The report's figures, drawn with matplotlib's Agg canvas into PNG files.

matplotlib is imported inside the functions, so ``import trainopt.outputs.report`` stays cheap.
Figures are built on ``matplotlib.figure.Figure`` with an Agg canvas rather than through
pyplot, so drawing a report never changes the backend or the open figures of a caller
(a notebook, say). Each function returns the PNG path, or None when the results hold
nothing to draw (no batch-size stage, no kept change, ...).
"""

from __future__ import annotations

import io
import math
import statistics
from pathlib import Path
from typing import Any

from trainopt.atomic import write_bytes_atomic
from trainopt.contract.protocol import FAILED_STATUSES
from trainopt.outputs.report.rows import format_value

__all__ = ["PLOTS", "speedup_bars", "waterfall", "batch_curve", "window_traces", "stability_trace", "step_breakdown",
           "breakdown_configs"]

KEPT = "#2e7d32"
REJECTED = "#78909c"
SCREEN_ONLY = "#cfd8dc"
FAILED = "#c62828"
ACCENT = "#1565c0"
MEMORY = "#ef6c00"
UNSTABLE_SHADE = "#ffcdd2"
SERIES = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#9e9d24"]

MIB = 1024.0**2

# Lines beyond this make a trace plot unreadable; the baseline and one trial per knob fit.
MAX_TRACES = 8


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    # No metadata: the PNG bytes then depend only on the results, not on the matplotlib build.
    fig.savefig(buf, format="png", metadata={"Software": None})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, buf.getvalue())
    return path


def _style(ax) -> None:
    ax.spines["top"].set_visible(False)
    ax.spines["right"].set_visible(False)
    ax.grid(True, axis="both", color="#e0e0e0", linewidth=0.8)
    ax.set_axisbelow(True)


def _legend(fig, handles, labels=None) -> None:
    # Below the axes, never over the data, whatever the data looks like.
    if not handles:
        return
    kwargs = {"loc": "outside lower center", "fontsize": 8, "frameon": False, "ncols": min(len(handles), 4 if len(handles) <= 4 else 3)}
    if labels is None:
        fig.legend(handles=handles, **kwargs)
    else:
        fig.legend(handles, labels, **kwargs)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _short(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _decision_label(d: dict[str, Any]) -> str:
    return _short(f"{d.get('knob')}: {format_value(d.get('from'))} → {format_value(d.get('to'))}")


def speedup_bars(doc: dict[str, Any], path: Path) -> Path | None:
    """Speedup of every decision as horizontal bars, with the confirmed interval.

    Kept changes are green, rejected ones grey (lighter where only screened, as a
    screen is a single run without an interval); failed candidates are a red cross at
    1×, and not-applicable ones are left out (the table lists them).
    """
    decisions = [d for d in (doc.get("decisions") or []) if d.get("verdict") != "not_applicable"]
    if not decisions:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    n = len(decisions)
    fig = _figure(8.0, 1.2 + 0.42 * n)
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(False, axis="y")
    labels = []
    values: list[float] = []
    used = set()
    for y, d in enumerate(decisions):
        labels.append(_decision_label(d))
        speedup, screen = _num(d.get("speedup")), _num(d.get("screen_speedup"))
        if d.get("verdict") in FAILED_STATUSES:
            ax.plot([1.0], [y], marker="X", color=FAILED, markersize=10, linestyle="none")
            ax.annotate(f" {d.get('verdict')}", (1.0, y), xytext=(8, 0), textcoords="offset points", va="center", color=FAILED, fontsize=9)
            used.add("failed")
            continue
        value = speedup if speedup is not None else screen
        if value is None:
            continue
        values.append(value)
        if d.get("kept"):
            colour, key = KEPT, "kept"
        elif speedup is not None:
            colour, key = REJECTED, "rejected"
        else:
            colour, key = SCREEN_ONLY, "screen"
        used.add(key)
        # Bars start at 1x so that slower (left) and faster (right) read at a glance.
        ax.barh(y, value - 1.0, left=1.0, color=colour, edgecolor="#455a64" if key == "screen" else colour, height=0.6)
        ci = d.get("ci")
        if speedup is not None and isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
            low, high = float(ci[0]), float(ci[1])
            values += [low, high]
            ax.errorbar(speedup, y, xerr=[[speedup - low], [high - speedup]], fmt="none", ecolor="#212121", capsize=4, linewidth=1.2)
        ax.annotate(f"{value:.3f}×", (max(value, 1.0), y), xytext=(4, 6), textcoords="offset points", fontsize=8, color="#37474f")
    ax.axvline(1.0, color="#424242", linewidth=1)
    lo = min([1.0] + values)
    hi = max([1.0] + values)
    pad = max(0.05, (hi - lo) * 0.12)
    ax.set_xlim(lo - pad, hi + pad * 2)
    if not values:
        # Only failures: a scale around 1x would suggest numbers that were never measured.
        ax.set_xticks([1.0], ["1×"])
    ax.set_yticks(range(n), labels)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlabel("speedup over the incumbent (×), 1× = no change")
    ax.set_title("Speedup of each candidate")
    legend = []
    if "kept" in used:
        legend.append(Patch(color=KEPT, label="kept (confirmed faster)"))
    if "rejected" in used:
        legend.append(Patch(color=REJECTED, label="rejected after confirmation"))
    if "screen" in used:
        legend.append(Patch(facecolor=SCREEN_ONLY, edgecolor="#455a64", label="rejected at screening (one run)"))
    if "failed" in used:
        legend.append(Line2D([], [], marker="X", color=FAILED, linestyle="none", markersize=9, label="failed"))
    if any(d.get("ci") for d in decisions):
        legend.append(Line2D([], [], color="#212121", marker="|", markersize=10, label="confidence interval"))
    _legend(fig, legend)
    return _save(fig, path)


def waterfall(doc: dict[str, Any], path: Path) -> Path | None:
    """Cumulative speedup of the kept changes, in the order adopted, from 1× to the final.

    The last bar is the final check (best settings against the baseline, measured
    afresh) with its interval, which need not equal the product of the steps.
    """
    kept = [d for d in (doc.get("decisions") or []) if d.get("kept") and _num(d.get("speedup")) is not None]
    if not kept:
        return None
    fig = _figure(8.0, 4.2)
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(False, axis="x")
    labels = ["baseline"]
    ax.bar(0, 1.0, color=REJECTED, width=0.6)
    ax.annotate("1.000×", (0, 1.0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    level = 1.0
    tops = [1.0]
    for i, d in enumerate(kept, start=1):
        new = level * float(d["speedup"])
        ax.bar(i, new - level, bottom=level, color=KEPT if new >= level else FAILED, width=0.6)
        ax.plot([i - 1 + 0.3, i - 0.3], [level, level], color="#9e9e9e", linewidth=1, linestyle=":")
        ax.annotate(f"{new:.3f}×", (i, max(new, level)), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
        labels.append(_short(f"{d.get('knob')}\n{format_value(d.get('from'))} → {format_value(d.get('to'))}", 44))
        level = new
        tops.append(new)
    final = _num(doc.get("speedup"))
    if final is not None:
        x = len(labels)
        ax.bar(x, final, color=ACCENT, width=0.6)
        ci = doc.get("speedup_ci")
        if isinstance(ci, (list, tuple)) and len(ci) == 2 and None not in ci:
            ax.errorbar(x, final, yerr=[[final - float(ci[0])], [float(ci[1]) - final]], fmt="none", ecolor="#212121", capsize=5)
            tops.append(float(ci[1]))
        ax.annotate(f"{final:.3f}×", (x, final), xytext=(14, 3), textcoords="offset points", ha="left", fontsize=8)
        labels.append("final check\n(vs baseline)")
        tops.append(final)
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(0, max(tops) * 1.15)
    ax.set_ylabel("speedup over the baseline (×)")
    ax.set_title("Cumulative speedup of the kept changes")
    return _save(fig, path)


def _second_pass_change(doc: dict[str, Any]) -> tuple[str, Any] | None:
    """The kept change a second batch pass ran after (its trials hold it), or None."""
    second = (doc.get("batch_size") or {}).get("second_pass")
    freed = second.get("freed_by") if isinstance(second, dict) else None
    return (freed.get("knob"), freed.get("to")) if isinstance(freed, dict) and freed.get("knob") else None


def _batch_points(doc: dict[str, Any], second: bool = False) -> dict[int, list[float]]:
    """Throughput by batch size of the first pass's trials (``second``: the second pass's)."""
    change = _second_pass_change(doc)
    points: dict[int, list[float]] = {}
    for t in doc.get("trials") or []:
        if t.get("stage") != "batch" or t.get("mode") != "measure" or t.get("status") != "ok":
            continue
        if (change is not None and (t.get("settings") or {}).get(change[0]) == change[1]) != second:
            continue
        size = (t.get("settings") or {}).get("batch_size")
        value = _num(t.get("samples_per_s"))
        if isinstance(size, int) and value is not None:
            points.setdefault(size, []).append(value)
    return points


def batch_curve(doc: dict[str, Any], path: Path) -> Path | None:
    """Throughput and peak memory against batch size, with the out-of-memory boundary.

    Throughput comes from the batch stage's screen and confirmation trials (each run a
    dot, the median a line); peak memory from the probes. The smallest size whose probe
    ran out of memory is marked by a red dashed line, every failed probe by a red cross.
    """
    info = doc.get("batch_size") or {}
    probes = [p for p in (info.get("probes") or []) if isinstance(p.get("size"), int)]
    points = _batch_points(doc)
    if not probes and not points:
        return None
    fig = _figure(8.0, 4.4)
    ax = fig.add_subplot()
    _style(ax)
    handles = []
    second = [p for p in ((info.get("second_pass") or {}).get("probes") or []) if isinstance(p.get("size"), int)]
    sizes = sorted(set(points) | set(_batch_points(doc, second=True)) | {p["size"] for p in probes + second})
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    # Log-spaced margins so the smallest and largest sizes (often the failing probe) show.
    ax.set_xlim(sizes[0] / 1.25, sizes[-1] * 1.25)
    ax.set_xlabel("batch size (samples per step)")
    if points:
        for size, values in sorted(points.items()):
            ax.scatter([size] * len(values), values, color=ACCENT, alpha=0.35, s=18, zorder=3)
        xs = sorted(points)
        med = [statistics.median(points[s]) for s in xs]
        (line,) = ax.plot(xs, med, color=ACCENT, marker="o", linewidth=2, label="throughput (median of runs)", zorder=4)
        handles.append(line)
        ax.set_ylim(bottom=0, top=max(max(v) for v in points.values()) * 1.15)
        ax.set_ylabel("throughput (samples/s)", color=ACCENT)
        ax.yaxis.set_major_formatter(_thousands())
        mem_ax = ax.twinx()
        mem_ax.spines["top"].set_visible(False)
    else:
        # Only probes ran (the throughput screen never started): memory takes the main axis.
        mem_ax = ax
    mem = sorted((p["size"], p["peak_memory_bytes"] / MIB) for p in probes if p.get("fits") and _num(p.get("peak_memory_bytes")))
    if mem:
        (mline,) = mem_ax.plot([m[0] for m in mem], [m[1] for m in mem], color=MEMORY, marker="s", linestyle="--", label="peak memory (probe)")
        handles.append(mline)
        mem_ax.set_ylabel("peak memory (MiB)", color=MEMORY)
        mem_ax.set_ylim(bottom=0, top=max(m[1] for m in mem) * 1.2)
    failing = sorted(p["size"] for p in probes if not p.get("fits"))
    if failing:
        boundary = failing[0]
        oom = ax.axvline(boundary, color=FAILED, linestyle="--", linewidth=1.6, label=f"out of memory from {boundary}")
        handles.append(oom)
        (crosses,) = ax.plot(
            failing, [0.04] * len(failing), transform=ax.get_xaxis_transform(), color=FAILED, marker="X",
            markersize=9, linestyle="none", label="probe did not fit", clip_on=False, zorder=5,
        )
        handles.append(crosses)
    chosen = [d for d in (doc.get("decisions") or []) if d.get("knob") == "batch_size" and d.get("kept")]
    if chosen and isinstance(chosen[-1].get("to"), int):
        pick = ax.axvline(chosen[-1]["to"], color=KEPT, linewidth=1.4, alpha=0.8, label=f"kept: {chosen[-1]['to']}")
        handles.append(pick)
    handles += _second_pass_lines(doc, ax, mem_ax if points else None)
    _legend(fig, handles)
    ax.set_title("Batch size: throughput and memory")
    return _save(fig, path)


def _second_pass_lines(doc: dict[str, Any], ax: Any, mem_ax: Any) -> list[Any]:
    """The second batch pass on the batch curve: its throughput and its probes' peak memory, dotted."""
    change = _second_pass_change(doc)
    if change is None:
        return []
    handles = []
    after = f"{change[0]} {change[1]}"
    points = _batch_points(doc, second=True)
    if points:
        xs = sorted(points)
        (line,) = ax.plot(xs, [statistics.median(points[s]) for s in xs], color=ACCENT, marker="^", linestyle=":",
                          linewidth=2, label=f"second pass ({after}): throughput", zorder=4)
        handles.append(line)
        ax.set_ylim(bottom=0, top=max(ax.get_ylim()[1], max(max(v) for v in points.values()) * 1.15))
    probes = (doc.get("batch_size") or {}).get("second_pass", {}).get("probes") or []
    mem = sorted((p["size"], p["peak_memory_bytes"] / MIB) for p in probes
                 if p.get("fits") and isinstance(p.get("size"), int) and _num(p.get("peak_memory_bytes")))
    if mem:
        target = mem_ax if mem_ax is not None else ax
        (mline,) = target.plot([m[0] for m in mem], [m[1] for m in mem], color=MEMORY, marker="^", linestyle=":",
                               label="second pass: peak memory (probe)")
        handles.append(mline)
        target.set_ylim(bottom=0, top=max(target.get_ylim()[1], max(m[1] for m in mem) * 1.2))
    return handles


def _thousands():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: f"{v:,.0f}")


def _trace_picks(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    measured = [
        t
        for t in (doc.get("trials") or [])
        if t.get("mode") == "measure" and t.get("status") == "ok" and len(t.get("windows") or []) >= 1
    ]
    picks: list[tuple[str, dict[str, Any]]] = []
    base = next((t for t in measured if t.get("role") == "baseline"), None)
    if base is not None:
        picks.append(("baseline", base))
    seen = set()
    for t in measured:
        knob = t.get("knob")
        if t.get("role") != "screen" or t.get("tag") != "candidate" or knob in seen or knob in ("baseline", "final"):
            continue
        # The fastest screened candidate of each knob: the one the search looked at hardest.
        same = [x for x in measured if x.get("knob") == knob and x.get("role") == "screen" and x.get("tag") == "candidate"]
        best = max(same, key=lambda x: _num(x.get("samples_per_s")) or 0.0)
        seen.add(knob)
        value = (best.get("settings") or {}).get(knob)
        picks.append((_short(f"{knob} = {format_value(value)}", 32), best))
    return picks[:MAX_TRACES]


def window_traces(doc: dict[str, Any], path: Path) -> Path | None:
    """Throughput of each timed window for the baseline and one trial per knob.

    Windows before ``steady_from`` (cut as warm-up) are drawn hollow and joined by a
    dotted line; a vertical tick marks where the steady part starts.
    """
    picks = _trace_picks(doc)
    if not picks:
        return None
    from matplotlib.lines import Line2D

    fig = _figure(8.0, 4.4)
    ax = fig.add_subplot()
    _style(ax)
    colours = ["#1565c0", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037", "#9e9d24"]
    top = 0.0
    longest = 1
    for i, (label, t) in enumerate(picks):
        windows = [_num(w) for w in t["windows"]]
        xs = [j + 1 for j, w in enumerate(windows) if w is not None]
        ys = [w for w in windows if w is not None]
        if not ys:
            continue
        colour = colours[i % len(colours)]
        cut = int(t.get("steady_from") or 0)
        top = max(top, max(ys))
        longest = max(longest, len(windows))
        warm = [(x, y) for x, y in zip(xs, ys) if x - 1 < cut]
        steady = [(x, y) for x, y in zip(xs, ys) if x - 1 >= cut]
        if warm:
            tail = warm + steady[:1]
            ax.plot([p[0] for p in tail], [p[1] for p in tail], color=colour, linestyle=":", linewidth=1.2)
            ax.plot([p[0] for p in warm], [p[1] for p in warm], color=colour, marker="o", markerfacecolor="white", linestyle="none")
        if steady:
            ax.plot([p[0] for p in steady], [p[1] for p in steady], color=colour, marker="o", linewidth=1.8, label=label)
        if cut > 0 and steady:
            ax.plot([cut + 0.5], [steady[0][1]], color=colour, marker="|", markersize=18, markeredgewidth=2.2)
        if not steady:
            ax.plot([], [], color=colour, marker="o", label=label)
    ax.set_ylim(0, top * 1.15 if top else 1)
    ax.set_xlim(0.5, longest + 0.5)
    ax.set_xticks(range(1, longest + 1))
    ax.yaxis.set_major_formatter(_thousands())
    ax.set_xlabel("timed window (in order)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title("Throughput per timed window (hollow = cut as warm-up)")
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], color="#424242", marker="|", markersize=12, markeredgewidth=2, linestyle="none"))
    labels.append("warm-up cut")
    _legend(fig, handles, labels)
    return _save(fig, path)


def _stability_series(points: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Points grouped by incumbent (settings hash; by stage in results without one), in time order."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        key = str(p.get("settings_hash") or p.get("stage") or "?")
        groups.setdefault(key, []).append(p)
    series = []
    for key, members in groups.items():
        stages = list(dict.fromkeys(str(p.get("stage") or "?") for p in members))
        label = ", ".join(stages)
        if members[0].get("settings_hash"):
            label = f"{_short(label, 34)} ({key[:6]})"
        series.append((_short(label, 48), sorted(members, key=lambda p: p["t_s"])))
    return series


def stability_trace(doc: dict[str, Any], path: Path) -> Path | None:
    """The incumbent's throughput in every session over the search's wall time, and the window noise.

    One series per incumbent (a kept change starts a new one); attempts the stability
    guard judged unstable are red crosses, and the periods they span are shaded. The
    lower panel shows each session's window noise on the same time axis.
    """
    info = doc.get("stability")
    if not isinstance(info, dict):
        return None
    points = [
        p for p in info.get("points") or []
        if isinstance(p, dict) and _num(p.get("t_s")) is not None
        and (_num(p.get("samples_per_s")) is not None or _num(p.get("noise")) is not None)
    ]
    if not points:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    end = max(float(p["t_s"]) for p in points)
    minutes = end > 300
    scale = 60.0 if minutes else 1.0
    fig = _figure(8.0, 5.2)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[3, 1.3])
    for ax in (top, bottom):
        _style(ax)
    periods = [
        (float(a), float(b)) for a, b in (x for x in info.get("unstable_periods") or [] if isinstance(x, (list, tuple)) and len(x) == 2)
        if _num(a) is not None and _num(b) is not None
    ]
    for a, b in periods:
        for ax in (top, bottom):
            # A period too short to see at this scale still gets a visible band.
            ax.axvspan(a / scale, max(b, a + end * 0.004) / scale, color=UNSTABLE_SHADE, alpha=0.6, linewidth=0, zorder=0)
    handles = []
    peak = 0.0
    for i, (label, members) in enumerate(_stability_series(points)):
        colour = SERIES[i % len(SERIES)]
        rated = [p for p in members if _num(p.get("samples_per_s")) is not None]
        stable = [p for p in rated if p.get("stable", True)]
        if stable:
            (line,) = top.plot([p["t_s"] / scale for p in stable], [p["samples_per_s"] for p in stable], color=colour,
                               marker="o", markersize=5, linewidth=1.2, label=label, zorder=3)
            handles.append(line)
        elif rated:
            handles.append(Line2D([], [], color=colour, marker="o", label=label))
        peak = max([peak] + [float(p["samples_per_s"]) for p in rated])
        noisy = [p for p in members if _num(p.get("noise")) is not None]
        bottom.plot([p["t_s"] / scale for p in noisy], [100 * p["noise"] for p in noisy], color=colour, marker="o",
                    markersize=3.5, linewidth=0.8, zorder=3)
    unstable = [p for p in points if p.get("stable") is False]
    if unstable:
        rated = [p for p in unstable if _num(p.get("samples_per_s")) is not None]
        top.plot([p["t_s"] / scale for p in rated], [p["samples_per_s"] for p in rated], color=FAILED, marker="X",
                 markersize=9, linestyle="none", zorder=4)
        noisy = [p for p in unstable if _num(p.get("noise")) is not None]
        bottom.plot([p["t_s"] / scale for p in noisy], [100 * p["noise"] for p in noisy], color=FAILED, marker="X",
                    markersize=7, linestyle="none", zorder=4)
        handles.append(Line2D([], [], color=FAILED, marker="X", markersize=9, linestyle="none", label="unstable (re-run or marked)"))
    if periods:
        handles.append(Patch(color=UNSTABLE_SHADE, label="unstable period"))
    top.set_ylim(0, peak * 1.15 if peak else 1)
    top.yaxis.set_major_formatter(_thousands())
    top.set_ylabel("incumbent (samples/s)")
    top.set_title("Machine stability: the incumbent's throughput in each session")
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("window noise (%)")
    bottom.set_xlabel("time since the search started (minutes)" if minutes else "time since the search started (s)")
    _legend(fig, handles)
    return _save(fig, path)


# One colour per phase of ``trainopt.stats.phases.PHASES``: the loader in orange, the model's
# own work in blues and green, the host's reads of the loss in red, the rest in grey.
PHASE_COLOURS = {
    "data_wait": "#ef6c00",
    "to_device": "#8d6e63",
    "forward": "#1565c0",
    "backward": "#64b5f6",
    "optimizer": "#2e7d32",
    "loss_read": "#c62828",
    "other": "#b0bec5",
}
# A segment narrower than this share of the step gets no label inside it (the legend names it).
_LABEL_MIN_SHARE = 0.06


def breakdown_configs(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The configurations whose step was profiled: ``(label, diagnosis)`` for the baseline
    and the recommended settings, each only when its diagnosis carries phase shares."""
    out = []
    for label, key in (("baseline", "diagnosis"), ("recommended settings", "final_diagnosis")):
        diagnosis = doc.get(key)
        if not isinstance(diagnosis, dict):
            continue
        breakdown = diagnosis.get("breakdown")
        shares = breakdown.get("shares") if isinstance(breakdown, dict) else None
        if isinstance(shares, dict) and any(_num(v) for v in shares.values()):
            out.append((label, diagnosis))
    return out


def step_breakdown(doc: dict[str, Any], path: Path) -> Path | None:
    """Where a step's time goes: one horizontal stacked bar per profiled configuration.

    Each bar is one step's wall time (100 %), split into the phases of
    ``trainopt.stats.phases.PHASES`` in the order they run; the baseline and the
    recommended settings sit one above the other, so a phase that shrank reads at a glance.
    """
    configs = breakdown_configs(doc)
    if not configs:
        return None
    from matplotlib.patches import Patch

    from trainopt.decide.bottleneck import LABELS
    from trainopt.stats.phases import PHASES

    fig = _figure(8.0, 1.7 + 0.75 * len(configs))
    ax = fig.add_subplot()
    _style(ax)
    ax.grid(False, axis="y")
    # Phase -> colour, in the order first drawn (a phase this version does not know gets a series colour).
    used: dict[str, str] = {}
    labels = []
    for y, (label, diagnosis) in enumerate(configs):
        shares = diagnosis["breakdown"]["shares"]
        verdict = diagnosis.get("bottleneck")
        labels.append(f"{label}\n({LABELS.get(verdict, str(verdict))})")
        names = [p for p in PHASES if p in shares] + [p for p in shares if p not in PHASES]
        left = 0.0
        for phase in names:
            share = _num(shares.get(phase))
            if not share or share <= 0:
                continue
            colour = used.setdefault(phase, PHASE_COLOURS.get(phase, SERIES[len(used) % len(SERIES)]))
            ax.barh(y, 100 * share, left=100 * left, color=colour, edgecolor="white", linewidth=0.8, height=0.55)
            if share >= _LABEL_MIN_SHARE:
                dark = phase in ("forward", "optimizer", "loss_read", "to_device", "data_wait")
                ax.annotate(f"{100 * share:.0f}%", (100 * (left + share / 2), y), ha="center", va="center", fontsize=8,
                            color="white" if dark else "#212121")
            left += share
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of a training step's wall time (%)")
    ax.set_yticks(range(len(configs)), labels)
    ax.set_ylim(len(configs) - 0.5, -0.5)
    ax.set_title("Where a step's time goes")
    order = sorted(used, key=lambda p: PHASES.index(p) if p in PHASES else len(PHASES))
    _legend(fig, [Patch(color=used[phase], label=phase) for phase in order])
    return _save(fig, path)


# File name in plots/ -> function; the report writes them in this order.
PLOTS = {
    "speedups.png": speedup_bars,
    "waterfall.png": waterfall,
    "batch_size.png": batch_curve,
    "windows.png": window_traces,
    "stability.png": stability_trace,
    "breakdown.png": step_breakdown,
}
