"""The confirmation loop and its decision-rule seam, driven by lists of throughputs (no processes)."""

from __future__ import annotations

import pytest

from trainopt.contract.protocol import TrialResult
from trainopt.decide.confirmation import Assessment, IntervalRule, Pair, confirm
from trainopt.stats import intervals as stats


def ok(rate):
    return TrialResult(status="ok", samples_per_s=rate)


def pairs_from(cand, inc):
    asked = []

    def next_pair(i):
        asked.append(i)
        return Pair(candidate=ok(cand[i]), incumbent=ok(inc[i]))

    return next_pair, asked


class StopAfter:
    """A stand-in rule: done after ``n`` pairs with a fixed verdict; records what it saw."""

    def __init__(self, n, verdict):
        self.n, self.verdict, self.seen = n, verdict, []

    def assess(self, candidate, incumbent):
        self.seen.append((list(candidate), list(incumbent)))
        return Assessment(done=len(candidate) >= self.n, verdict=self.verdict)


def test_the_loop_asks_for_pairs_in_order_until_the_rule_is_done():
    next_pair, asked = pairs_from([11, 12, 13, 14], [10, 10, 10, 10])
    rule = StopAfter(3, "improved")
    conf = confirm(next_pair, rule)
    assert asked == [0, 1, 2]
    assert rule.seen[-1] == ([11, 12, 13], [10, 10, 10])
    assert conf.verdict == "improved" and conf.interval is None
    assert [r.samples_per_s for r in conf.candidate] == [11, 12, 13]


def test_interval_rule_stops_at_pairs_when_clear_and_matches_stats():
    cand = [150, 151, 149, 150, 152, 148]
    inc = [100, 101, 99, 100, 100, 101]
    rule = IntervalRule(pairs=6, max_pairs=20, confidence=0.95, min_speedup=0.03)
    next_pair, asked = pairs_from(cand, inc)
    conf = confirm(next_pair, rule, planned_pairs=6)
    expected = stats.paired_interval(cand, inc, 0.95)
    assert asked == [0, 1, 2, 3, 4, 5]
    assert conf.interval == expected
    assert conf.verdict == "improved"
    assert conf.reason == f"{expected.speedup:.3f}x [{expected.low:.3f}, {expected.high:.3f}] over 6 pairs"


def test_interval_rule_adds_pairs_while_straddling_and_says_so():
    # Alternating +6 % / -2 %: the interval straddles 1.03 until max_pairs.
    cand = [106 if i % 2 == 0 else 98 for i in range(8)]
    inc = [100] * 8
    rule = IntervalRule(pairs=6, max_pairs=8, confidence=0.95, min_speedup=0.03)
    next_pair, asked = pairs_from(cand, inc)
    conf = confirm(next_pair, rule, planned_pairs=6)
    assert asked == list(range(8))
    assert conf.interval.n == 8 and conf.reason.endswith("after adding pairs up to 8")
    assert conf.verdict == stats.verdict(stats.paired_interval(cand, inc, 0.95), 0.03)


def test_a_failed_candidate_gives_its_status_and_a_failed_incumbent_inconclusive():
    def failing(side, status):
        def next_pair(i):
            if i == 1:
                bad = TrialResult(status=status, error="boom")
                return Pair(candidate=bad, incumbent=None) if side == "candidate" else Pair(candidate=ok(1.0), incumbent=bad)
            return Pair(candidate=ok(11.0), incumbent=ok(10.0))

        return next_pair

    conf = confirm(failing("candidate", "oom"), StopAfter(9, "improved"))
    assert conf.verdict == "oom" and conf.reason == "candidate trial oom: boom"
    assert [r.status for r in conf.candidate] == ["ok", "oom"]
    conf = confirm(failing("incumbent", "crashed"), StopAfter(9, "improved"))
    assert conf.verdict == "inconclusive" and "incumbent trial crashed" in conf.reason
    assert [r.status for r in conf.incumbent] == ["ok", "crashed"]


def test_a_pair_missing_a_side_without_a_failure_is_a_bug():
    with pytest.raises(ValueError, match="missing a side"):
        confirm(lambda i: Pair(candidate=ok(1.0), incumbent=None), StopAfter(3, "improved"))


def test_search_takes_another_rule_through_the_seam(tmp_path):
    from tests.conftest import tiny_spec_dict
    from tests.unit.search.test_search import FakeRunner
    from trainopt.contract.spec import spec_from_dict
    from trainopt.search.search import Search
    from trainopt.search.store import TrialStore

    spec = spec_from_dict(tiny_spec_dict(search={"amp": ["off", "bf16"]}), "t.yaml", tmp_path)
    store = TrialStore(f"sqlite:///{tmp_path / 't.db'}", spec.name, spec.fingerprint())
    rule = StopAfter(2, "regressed")
    doc = Search(spec, tmp_path, FakeRunner({("amp", "bf16"): 1.5}), store, rule=rule).run()
    (amp,) = [d for d in doc["decisions"] if d["knob"] == "amp"]
    assert amp["verdict"] == "regressed" and not amp["kept"]
    assert len(rule.seen) == 2


def test_a_rule_must_answer_with_a_known_verdict():
    next_pair, _ = pairs_from([11, 12], [10, 10])
    with pytest.raises(ValueError, match="returned verdict 'better'"):
        confirm(next_pair, StopAfter(1, "better"))
