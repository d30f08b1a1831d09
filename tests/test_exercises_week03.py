"""Lab 03's checks: the library's own function fails, named, even in a partial; each rule the lab
states fails the function or grid that breaks it, with a message naming the rule; numpy integers
are counts; at grading, a hard-coded answer meets runs it never saw."""

import functools

import numpy as np
import pytest

from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week03
from infer.experiments.prefill_decode import token_gaps_ms, ttft_and_tpot_ms
from infer.metrics import (
    benchmark_duration_s,
    calculate_metrics,
    meets_slo,
    request_goodput,
    request_latencies_ms,
    summarize_ms,
)
from infer.profiles import BenchmarkGrid

# ---------------------------------------------------------------- honest functions, as a student writes them


def latencies(record):
    ttft = (record.chunk_times[0] - record.send_time) * 1e3
    e2el = (record.chunk_times[-1] - record.send_time) * 1e3
    n = record.num_output_tokens
    return ttft, (e2el - ttft) / (n - 1) if n > 1 else None, e2el


def metrics(records):
    done = [r for r in records if r.success]
    duration = max(r.finish_time for r in records) - min(r.send_time for r in records)
    lats = [latencies(r) for r in done]
    itls = [(b - a) * 1e3 for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpots = [t for _, t, _ in lats if t is not None]
    out = sum(r.num_output_tokens for r in done)
    return {
        "duration": duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "total_output_tokens": out,
        "request_throughput": len(done) / duration,
        "output_throughput": out / duration,
        "total_token_throughput": (sum(r.prompt_len for r in done) + out) / duration,
        "mean_ttft_ms": np.mean([t for t, _, _ in lats]),
        "median_ttft_ms": np.median([t for t, _, _ in lats]),
        "p99_ttft_ms": np.percentile([t for t, _, _ in lats], 99),
        "mean_tpot_ms": np.mean(tpots),
        "p99_tpot_ms": np.percentile(tpots, 99),
        "mean_itl_ms": np.mean(itls),
        "p99_itl_ms": np.percentile(itls, 99),
        "std_e2el_ms": np.std([e for _, _, e in lats]),
        "p99_e2el_ms": np.percentile([e for _, _, e in lats], 99),
    }


def goodput(records, slo_ms, *, meets=lambda v, limit: v <= limit, one_token=0.0, whole=True, combine=all):
    done = [r for r in records if r.success]
    runs_over = records if whole else done
    duration = max(r.finish_time for r in runs_over) - min(r.send_time for r in runs_over)
    good = 0
    for r in done:
        ttft, tpot, e2el = latencies(r)
        observed = {"ttft": ttft, "tpot": one_token if tpot is None else tpot, "e2el": e2el}
        good += combine(meets(observed[k], limit) for k, limit in slo_ms.items())
    return good / duration


def test_the_honest_functions_pass():
    assert week03.grade_latencies(latencies).ok
    assert week03.grade_serving_metrics(metrics).ok
    assert week03.grade_goodput(goodput).ok


# ---------------------------------------------------------------- the library's own, what the kernel lacks


@pytest.mark.parametrize(
    "grade, twin",
    [
        (week03.grade_latencies, request_latencies_ms),
        (week03.grade_serving_metrics, calculate_metrics),
        (week03.grade_goodput, request_goodput),
    ],
    ids=["latencies", "metrics", "goodput"],
)
def test_the_library_function_fails_even_in_a_partial(grade, twin):
    line = grade(functools.partial(twin)).line
    assert f"course library's own infer.metrics.{twin.__name__}, imported rather than written" in line, line


def test_the_kernel_lacks_every_library_function_that_answers():
    assert set(week03.HIDDEN_AT_GRADING) == {
        request_latencies_ms,
        calculate_metrics,
        ttft_and_tpot_ms,
        token_gaps_ms,
        summarize_ms,
        benchmark_duration_s,
        request_goodput,
        meets_slo,
    }


# ---------------------------------------------------------------- the rules: one wrong function each


def _duration_of_completed(records):
    done = [r for r in records if r.success]
    return max(r.finish_time for r in done) - min(r.send_time for r in done)


def test_a_duration_without_the_failed_requests_fails_naming_the_rule():
    verdict = week03.grade_serving_metrics(
        lambda records: {**metrics(records), "duration": _duration_of_completed(records)}
    )
    assert not verdict.ok and "whose first request sent failed" in verdict.line, verdict.line
    assert "your duration leaves out the failed requests; the duration runs from" in verdict.line


@pytest.mark.parametrize(
    "wrong, rule",
    [
        (lambda r, s: goodput(r, s, meets=lambda v, limit: v < limit), "compare with <=, not <"),
        (lambda r, s: goodput(r, s, one_token=float("inf")), "your goodput leaves out one-token requests"),
        (lambda r, s: goodput(r, s, whole=False), "your duration leaves out the failed requests"),
        (lambda r, s: goodput(r, s, combine=any), "your goodput counts requests that meet any one SLO"),
    ],
    ids=["equal to a limit", "one-token", "duration", "every SLO"],
)
def test_each_rule_of_goodput_fails_the_function_that_breaks_it(wrong, rule):
    verdict = week03.grade_goodput(wrong)
    assert not verdict.ok and rule in verdict.line, verdict.line
    assert "some exactly on the limits" in verdict.line, "the first case holds every rule"


GOOD = dict(input_lens=(512, 2048), output_lens=(64,), concurrency=(1, 2, 4, 8, 16, 32), num_prompts=128)


@pytest.mark.parametrize(
    "changes, rule",
    [
        (dict(input_lens=(2048, 2048)), "input_lens=(2048, 2048) holds one input length"),
        (dict(input_lens=(2048,)), "holds one input length"),
        (dict(input_lens=(512, 2048.0)), "exact token counts: positive ints"),
        (dict(output_lens=(32,)), "2048 input and 64 output tokens"),
        (dict(concurrency=(2, 4, 8, 16, 32)), "concurrency must start at 1"),
        (dict(concurrency=(1, 4, 2, 8, 16, 32)), "rise strictly"),
        (dict(concurrency=(1, 2, 4, 8, 16)), "reach at least 32"),
        (dict(concurrency=(1, 2, 4, 8, 16, 32.0)), "positive ints"),
        (dict(num_prompts=127), "num_prompts=127 gives the top concurrency fewer than 4 rounds; use at least 128"),
        (dict(input_lens=(256, 512, 1024, 2048, 4096)), "30 cells is more than the 24"),
    ],
)
def test_each_requirement_of_the_grid_fails_the_grid_that_breaks_it(changes, rule):
    verdict = week03.grade_grid(BenchmarkGrid(**(GOOD | changes)))
    assert not verdict.ok and rule in verdict.line, verdict.line


@pytest.mark.parametrize(
    "changes",
    [
        {},
        dict(num_prompts=128),  # exactly 4 rounds of 32
        dict(input_lens=(256, 512, 2048, 4096)),  # exactly 24 cells
        dict(input_lens=tuple(np.array([512, 2048])), num_prompts=np.int64(128)),  # numpy integers are counts
        dict(concurrency=tuple(np.arange(1, 33)[[0, 1, 3, 7, 15, 31]])),
    ],
    ids=["design", "4 rounds exactly", "24 cells exactly", "numpy ints", "numpy concurrency"],
)
def test_grids_on_the_boundaries_pass(changes):
    verdict = week03.grade_grid(BenchmarkGrid(**(GOOD | changes)))
    assert verdict.line == "✅ 03.lab.grid correct: the grid meets every requirement", verdict.line


# ---------------------------------------------------------------- grading: runs nobody saw


def test_a_hard_coded_answer_passes_at_home_and_fails_at_grading(monkeypatch):
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    seen = {}

    def recorder(records, slo):
        seen[id(records[0]), str(slo)] = goodput(records, slo)
        return seen[id(records[0]), str(slo)]

    assert week03.grade_goodput(recorder).ok
    table = {key[1] + str(round(value, 6)): value for key, value in seen.items()}
    answers = list(seen.values())

    def hard_coded(records, slo):
        return answers.pop(0) if answers else 0.0  # the answers seen at home, in the order they came

    assert week03.grade_goodput(hard_coded).ok and table
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    answers[:] = list(seen.values())
    verdict = week03.grade_goodput(hard_coded)
    assert not verdict.ok and "got 0 req/s" in verdict.line, verdict.line


def test_q2_takes_both_edges_of_its_tolerance():
    from infer.course.grading.checks import grade_answer

    for edge in (50 * 1.01, 50 * 0.99, 50.5, 49.5):
        assert grade_answer("03.q2", edge).ok, edge
    for outside in (50.51, 49.49):
        assert not grade_answer("03.q2", outside).ok, outside
