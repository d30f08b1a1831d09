import time

import pytest

from infer.timing import Stopwatch, Timing, benchmark


def test_benchmark_counts_warmup_apart():
    calls = []
    timing = benchmark(lambda: calls.append(1), warmup=3, repeats=4)
    assert len(calls) == 7 and len(timing.samples_ms) == 4


def test_stopwatch_reports_milliseconds():
    with Stopwatch("cpu") as sw:
        time.sleep(0.02)
    assert 15 <= sw.ms < 1000, f"a 20 ms sleep should read about 20 ms, got {sw.ms}: seconds instead of ms?"


def test_median_and_spread():
    timing = Timing((5.0, 1.0, 3.0, 2.0, 4.0))
    assert timing.median_ms == 3.0
    low, high = timing.spread_ms
    assert 1.0 <= low < 3.0 < high <= 5.0
    assert "3.000 ms" in str(timing)


def test_repeats_must_be_positive():
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        benchmark(lambda: None, repeats=0)
