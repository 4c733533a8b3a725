"""Batch-size search as a pure sequence, fed by fake fits and failures."""

import pytest

from trainopt.decide.batch import BatchSizeSearch, throughput_candidates


def run(search, fits_up_to):
    while (size := search.next_probe()) is not None:
        search.record(size, size <= fits_up_to)
    return [p.size for p in search.probes]


def test_grow_then_bisect_exact_sequence():
    s = BatchSizeSearch(start=32, maximum=1024, margin=0.1)
    assert run(s, 300) == [32, 64, 128, 256, 512, 384, 320, 288, 304, 296]
    assert s.largest_fitting == 296
    assert s.safe_maximum == 264


def test_everything_fits_up_to_the_maximum_keeps_the_maximum():
    s = BatchSizeSearch(start=32, maximum=100)
    assert run(s, 10**9) == [32, 64, 100]
    assert s.safe_maximum == 100


def test_start_does_not_fit_backs_off_by_halves():
    s = BatchSizeSearch(start=64, maximum=1024)
    assert run(s, 10) == [64, 32, 16, 8]
    assert s.largest_fitting == 8


def test_nothing_fits():
    s = BatchSizeSearch(start=4, maximum=1024)
    assert run(s, 0) == [4, 2, 1]
    assert s.largest_fitting is None and s.safe_maximum is None


@pytest.mark.parametrize(
    "start,limit,sequence,largest",
    [
        # Below 8 every integer is a probe size, and the edge is found exactly.
        (1, 5, [1, 2, 4, 8, 6, 5], 5),
        (6, 7, [6, 12, 8, 7], 7),
        # From 8 on, bisection probes are multiples of 8 (never 9, 17, ...), nearest the midpoint.
        (9, 16, [9, 18, 16], 16),
        (9, 12, [9, 18, 16], 9),
        (3, 3, [3, 6, 4], 3),
    ],
)
def test_small_sizes_exact_sequences(start, limit, sequence, largest):
    s = BatchSizeSearch(start=start, maximum=1024, margin=0.0)
    assert run(s, limit) == sequence
    assert s.largest_fitting == largest


def _probe_sizes_between(low, high, multiple=8):
    return [n for n in range(low + 1, high) if n < multiple or n % multiple == 0]


@pytest.mark.parametrize("start", [1, 3, 8, 9, 13])
@pytest.mark.parametrize("limit", [1, 2, 5, 7, 9, 15, 33, 100, 257, 777, 1000])
def test_bisection_ends_at_the_stated_rule(start, limit):
    # The rule the README states: within 5 % of the edge, or no probe size left between
    # the largest fitting and the smallest failing size.
    s = BatchSizeSearch(start=start, maximum=4096, margin=0.0)
    run(s, limit)
    fit = s.largest_fitting
    fails = [p.size for p in s.probes if not p.fits]
    if fit is None:
        assert limit < 1
        return
    assert fit <= limit < min(fails)
    gap = min(fails) - fit
    assert gap <= 0.05 * fit or _probe_sizes_between(fit, min(fails)) == []
    assert len(s.probes) < 20
    assert len({p.size for p in s.probes}) == len(s.probes), "no size is probed twice"


def test_throughput_candidates():
    assert throughput_candidates(32, 264) == [64, 128, 256, 264]
    assert throughput_candidates(32, 1024, max_candidates=3)[-1] == 1024
    assert len(throughput_candidates(32, 1024, max_candidates=3)) == 3
    assert throughput_candidates(32, 256, effective_batch=256) == [64, 128, 256]
    assert throughput_candidates(64, 64) == []


def test_max_first_stops_after_one_probe_when_the_maximum_fits():
    s = BatchSizeSearch(start=32, maximum=256, max_first=True)
    assert run(s, 10**9) == [256]
    assert s.largest_fitting == s.safe_maximum == 256


def test_max_first_that_fails_follows_the_ordinary_ladder_with_one_probe_more():
    s = BatchSizeSearch(start=32, maximum=1024, margin=0.1, max_first=True)
    assert run(s, 300) == [1024, 32, 64, 128, 256, 512, 384, 320, 288, 304, 296]
    assert s.largest_fitting == 296 and s.safe_maximum == 264
    # Just below the maximum: the doubling would reach the maximum, which already failed.
    plain = run(BatchSizeSearch(start=32, maximum=1024, margin=0.0), 700)
    s = BatchSizeSearch(start=32, maximum=1024, margin=0.0, max_first=True)
    assert plain[5] == 1024 and run(s, 700) == [1024, *plain[:5], *plain[6:]]
    assert s.largest_fitting == 672
    # The start itself does not fit: back off by halves from it.
    s = BatchSizeSearch(start=64, maximum=1024, max_first=True)
    assert run(s, 10) == [1024, 64, 32, 16, 8]
    # Start at the maximum: nothing to probe first.
    s = BatchSizeSearch(start=256, maximum=256, max_first=True)
    assert run(s, 10**9) == [256]


@pytest.mark.parametrize("start", [1, 3, 8, 9, 13, 32])
@pytest.mark.parametrize("limit", [0, 1, 2, 5, 7, 9, 15, 33, 100, 257, 777, 1000, 4095, 4096, 10**6])
def test_max_first_finds_the_same_largest_fitting_size(start, limit):
    plain = BatchSizeSearch(start=start, maximum=4096, margin=0.0)
    first = BatchSizeSearch(start=start, maximum=4096, margin=0.0, max_first=True)
    a, b = run(plain, limit), run(first, limit)
    assert first.largest_fitting == plain.largest_fitting
    assert len(b) <= len(a) + 1
    assert len(set(b)) == len(b), "no size is probed twice"
    if limit >= 4096:
        assert b == [4096]
