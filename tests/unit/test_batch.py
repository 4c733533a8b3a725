"""Batch-size search as a pure sequence, fed by fake fits and failures."""

import pytest

from trainopt.batch import BatchSizeSearch, throughput_candidates


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


@pytest.mark.parametrize("limit", [9, 33, 100, 257, 777, 1000])
def test_bisection_ends_within_tolerance(limit):
    s = BatchSizeSearch(start=8, maximum=4096, margin=0.0)
    run(s, limit)
    fit = s.largest_fitting
    fails = [p.size for p in s.probes if not p.fits]
    assert fit <= limit
    assert min(fails) - fit <= max(0.05 * fit, 8)
    assert len(s.probes) < 20


def test_throughput_candidates():
    assert throughput_candidates(32, 264) == [64, 128, 256, 264]
    assert throughput_candidates(32, 1024, max_candidates=3)[-1] == 1024
    assert len(throughput_candidates(32, 1024, max_candidates=3)) == 3
    assert throughput_candidates(32, 256, effective_batch=256) == [64, 128, 256]
    assert throughput_candidates(64, 64) == []
