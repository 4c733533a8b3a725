"""What the win is worth and what the time budget left out, in words: for the summary, the report and best.yaml.

Pure functions over the results document's ``worth`` and ``time_budget`` (see
``trainopt.search.document``); the arithmetic is ``trainopt.decide.run_costs.run_worth``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["fmt_hours", "fmt_money", "worth_lines", "worth_cards", "not_tried_lines", "worth_provenance"]


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def fmt_hours(hours: Any) -> str:
    """A duration given in hours: ``62.0 h``, ``45.0 min``, ``12.3 s``."""
    h = _num(hours)
    if h is None:
        return "—"
    if abs(h) >= 1:
        return f"{h:,.1f} h"
    if abs(h) * 60 >= 1:
        return f"{h * 60:.1f} min"
    return f"{h * 3600:.1f} s"


def fmt_money(amount: Any, currency: str | None) -> str:
    """An amount in the run's currency: ``95.00 USD`` (``95.00`` when the spec names none)."""
    a = _num(amount)
    if a is None:
        return "—"
    return f"{a:,.2f}" + (f" {currency}" if currency else "")


def _range(r: dict[str, Any] | None, fmt) -> str:
    """``estimate [low, high]`` of a ``{estimate, low, high}`` range."""
    if not r:
        return "—"
    text = fmt(r.get("estimate"))
    if _num(r.get("low")) is not None and _num(r.get("high")) is not None:
        text += f" [{fmt(r['low'])}, {fmt(r['high'])}]"
    return text


def _length(worth: dict[str, Any]) -> str:
    run = worth.get("run") or {}
    for name in ("steps", "epochs", "hours"):
        if run.get(name) is not None:
            value = run[name]
            return f"{value:,} {name}" if name != "hours" else f"{value:,} hours at the baseline"
    return f"{worth.get('steps', 0):,.0f} steps"


def _per_steps_s(hours: Any) -> str:
    h = _num(hours)
    return "—" if h is None else f"{h * 3600:,.1f} s"


def worth_lines(worth: dict[str, Any] | None) -> list[str]:
    """The summary's lines: the run's time (and cost) at the baseline and at the recommended settings, and what the search cost."""
    if not worth:
        return []
    rec, saved = worth.get("recommended_hours"), worth.get("saved_hours")
    if worth.get("basis") != "run":
        line = f"time per {worth.get('steps', 1000):,.0f} steps: {_per_steps_s(worth.get('baseline_hours'))} at the baseline"
        if rec:
            line += f" -> {_range(rec, _per_steps_s)} recommended"
        lines = [line]
        if worth.get("note"):
            lines.append(f"note: no run figures: {worth['note']}")
        return lines
    line = f"the run ({_length(worth)}): {fmt_hours(worth.get('baseline_hours'))} at the baseline"
    if rec and not saved.get("estimate") and saved.get("low") is None:
        line += "; the baseline stays, nothing saved"
    elif rec:
        line += f" -> {_range(rec, fmt_hours)} recommended; {_range(saved, fmt_hours)} saved"
    lines = [line]
    money = worth.get("money")
    cur = money.get("currency") if money else None
    if money:
        line = (f"its cost at {fmt_money(money.get('device_hour_cost'), cur)} per device-hour: "
                f"{fmt_money(money.get('baseline'), cur)} at the baseline")
        if money.get("recommended") and money.get("saved", {}).get("estimate"):
            line += (f" -> {_range(money['recommended'], lambda v: fmt_money(v, cur))} recommended; "
                     f"{_range(money.get('saved'), lambda v: fmt_money(v, cur))} saved")
        lines.append(line)
    search = f"this search took {fmt_hours(worth.get('search_hours'))}"
    if money and money.get("search") is not None:
        search += f" ({fmt_money(money['search'], cur)})"
    back = _num(worth.get("paid_back_after_steps"))
    if back is not None:
        within = back <= (_num(worth.get("steps")) or 0)
        search += (f" and paid for itself after {back:,.0f} steps of the run" if within
                   else f" and pays for itself only after {back:,.0f} steps, more than the run's {worth.get('steps', 0):,.0f}")
    elif rec:
        search += "; the recommended settings save no time"
    lines.append(search)
    return lines


def worth_cards(worth: dict[str, Any] | None) -> list[dict[str, str]]:
    """The report's summary cards for the run: ``{label, value, note}`` each."""
    if not worth:
        return []
    rec, saved = worth.get("recommended_hours"), worth.get("saved_hours")
    if worth.get("basis") != "run":
        note = "at the baseline"
        if rec:
            note = f"{_range(rec, _per_steps_s)} recommended"
        return [{"label": f"Time per {worth.get('steps', 1000):,.0f} steps", "value": _per_steps_s(worth.get("baseline_hours")),
                 "note": f"baseline; {note}" if rec else note}]
    cards = [{"label": "Run at the baseline", "value": fmt_hours(worth.get("baseline_hours")), "note": _length(worth)}]
    if rec:
        cards.append({"label": "Run recommended", "value": fmt_hours(rec.get("estimate")),
                      "note": f"interval {fmt_hours(rec.get('low'))} to {fmt_hours(rec.get('high'))}"})
        cards.append({"label": "Hours saved", "value": fmt_hours(saved.get("estimate")) if saved else "—",
                      "note": f"interval {fmt_hours(saved.get('low'))} to {fmt_hours(saved.get('high'))}" if saved else ""})
    money = worth.get("money")
    if money and money.get("saved"):
        cur = money.get("currency")
        cards.append({"label": "Cost saved", "value": fmt_money(money["saved"].get("estimate"), cur),
                      "note": (f"{_range(money['saved'], lambda v: fmt_money(v, cur))} at "
                               f"{fmt_money(money.get('device_hour_cost'), cur)}/device-hour; the search cost "
                               f"{fmt_money(money.get('search'), cur)}")})
    back = _num(worth.get("paid_back_after_steps"))
    if back is not None:
        cards.append({"label": "Search paid for itself", "value": f"after {back:,.0f} steps",
                      "note": f"the search took {fmt_hours(worth.get('search_hours'))}"})
    return cards


def not_tried_lines(budget: dict[str, Any] | None) -> list[str]:
    """What the time budget left out, one line per stage."""
    if not budget or not budget.get("not_tried"):
        return []
    return [f"{n.get('knob')}{' (second pass)' if 'second' in str(n.get('stage')) else ''}: not tried (time budget): "
            f"expected {fmt_hours((_num(n.get('eta_s')) or 0) / 3600)} plus the final check's, "
            f"{fmt_hours((_num(n.get('left_s')) or 0) / 3600)} left"
            for n in budget["not_tried"]]


def worth_provenance(worth: dict[str, Any] | None) -> dict[str, Any] | None:
    """best.yaml's ``worth``: the run's hours (and cost) at both settings, as numbers."""
    if not worth:
        return None
    keys = ("basis", "run", "steps", "baseline_hours", "recommended_hours", "saved_hours", "search_hours",
            "paid_back_after_steps", "money")
    return {k: worth.get(k) for k in keys}
