"""What the win is worth, in the summary, the report's cards and best.yaml."""

from __future__ import annotations

from trainopt.decide.run_costs import run_worth
from trainopt.outputs.worth import fmt_hours, not_tried_lines, worth_cards, worth_lines, worth_provenance


def _worth(run, speedup=2.0, ci=(1.6, 2.5), search_s=1800.0):
    return run_worth(run, baseline_samples_per_s=100.0, samples_per_step=10.0, dataset_len=None, speedup=speedup,
                     ci=list(ci) if ci else None, search_s=search_s)


def test_a_priced_run_in_words():
    lines = worth_lines(_worth({"steps": 100_000, "device_hour_cost": 2.5, "currency": "EUR"}))
    assert lines == [
        "the run (100,000 steps): 2.8 h at the baseline -> 1.4 h [1.1 h, 1.7 h] recommended; 1.4 h [1.0 h, 1.7 h] saved",
        "its cost at 2.50 EUR per device-hour: 6.94 EUR at the baseline -> 3.47 EUR [2.78 EUR, 4.34 EUR] recommended; "
        "3.47 EUR [2.60 EUR, 4.17 EUR] saved",
        "this search took 30.0 min (1.25 EUR) and paid for itself after 36,000 steps of the run",
    ]
    cards = {c["label"]: c for c in worth_cards(_worth({"steps": 100_000, "device_hour_cost": 2.5, "currency": "EUR"}))}
    assert cards["Run at the baseline"]["value"] == "2.8 h"
    assert cards["Hours saved"]["value"] == "1.4 h" and cards["Hours saved"]["note"] == "interval 1.0 h to 1.7 h"
    assert cards["Cost saved"]["value"] == "3.47 EUR"
    assert cards["Search paid for itself"]["value"] == "after 36,000 steps"


def test_without_a_run_block_only_time_per_1000_steps_and_no_money():
    worth = _worth(None)
    lines = worth_lines(worth)
    assert lines == ["time per 1,000 steps: 100.0 s at the baseline -> 50.0 s [40.0 s, 62.5 s] recommended"]
    cards = worth_cards(worth)
    assert [c["label"] for c in cards] == ["Time per 1,000 steps"]
    text = " ".join(lines + [c["note"] + c["value"] for c in cards])
    assert "cost" not in text.lower() and "EUR" not in text
    assert worth_provenance(worth)["money"] is None


def test_a_search_that_saves_nothing_or_does_not_pay_back_within_the_run():
    slower = worth_lines(_worth({"steps": 1000, "device_hour_cost": 1.0}, speedup=0.95, ci=(0.9, 1.0)))
    assert slower[-1].endswith("the recommended settings save no time")
    long = worth_lines(_worth({"steps": 1000}, speedup=1.1, ci=(1.05, 1.2), search_s=3600.0))
    assert "pays for itself only after" in long[-1] and "more than the run's 1,000" in long[-1]
    stays = worth_lines(_worth({"steps": 1000, "device_hour_cost": 1.0}, speedup=1.0, ci=None))
    assert stays[0] == "the run (1,000 steps): 1.7 min at the baseline; the baseline stays, nothing saved"
    assert stays[1] == "its cost at 1.00 per device-hour: 0.03 at the baseline"
    assert fmt_hours(0.25) == "15.0 min" and fmt_hours(30) == "30.0 h" and fmt_hours(None) == "—"


def test_not_tried_lines():
    budget = {"budget_s": 600, "not_tried": [{"knob": "compile", "stage": "compile", "reason": "not tried (time budget)",
                                              "eta_s": 900.0, "left_s": 300.0}]}
    assert not_tried_lines(budget) == ["compile: not tried (time budget): expected 15.0 min plus the final check's, 5.0 min left"]
    assert not_tried_lines(None) == [] and not_tried_lines({"budget_s": 1, "not_tried": []}) == []
