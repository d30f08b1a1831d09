"""Lab 01's checks: the library's own function fails, named, even in a partial; each rule of the
timestamps fails the loop that breaks it, with a message naming the rule; at grading, a hard-coded
answer meets cases it never saw."""

import functools
import time

import numpy as np
import pytest
import torch

from infer import hf
from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week01
from infer.experiments.prefill_decode import token_gaps_ms, ttft_and_tpot_ms
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.metrics import calculate_metrics, request_latencies_ms
from infer.roofline import matmul_arithmetic_intensity

# ---------------------------------------------------------------- what the kernel lacks, what the lab gives


def test_the_kernel_lacks_every_library_function_that_answers():
    assert set(week01.HIDDEN_AT_GRADING) == {
        hf.greedy_generate,
        naive_greedy_generate,
        cached_greedy_generate,
        ttft_and_tpot_ms,
        token_gaps_ms,
        request_latencies_ms,
        calculate_metrics,
        matmul_arithmetic_intensity,
    }


@pytest.mark.parametrize(
    "grade, twin",
    [
        (lambda fn, tiny: week01.grade_naive_loop(fn, tiny.model, prompts=2), naive_greedy_generate),
        (lambda fn, tiny: week01.grade_ttft_tpot(fn), ttft_and_tpot_ms),
        (lambda fn, tiny: week01.grade_intensity(fn), matmul_arithmetic_intensity),
    ],
    ids=["naive", "ttft", "intensity"],
)
def test_the_library_function_fails_even_in_a_partial(tiny, grade, twin):
    line = grade(functools.partial(twin), tiny).line
    name = f"{twin.__module__}.{twin.__qualname__}"
    assert f"course library's own {name}, imported rather than written" in line, line


def test_the_helpers_the_lab_gives_are_allowed(tiny):
    from tests.test_check_shortcuts import naive_loop  # calls hf.forward, as the lab says to

    assert week01.grade_naive_loop(naive_loop, tiny.model, prompts=2).ok
    assert week01.GIVEN[week01.NAIVE_QID] == (hf.forward, week01.synchronize)


# ---------------------------------------------------------------- the timestamps: one rule, one wrong loop each


@torch.no_grad()
def loop(model, prompt_ids, max_new_tokens, timestamps=None, stamp="after"):
    """The naive loop, stamping its tokens in one of several ways (only "after" is right)."""
    sequence, first_reading = prompt_ids, time.perf_counter()
    started = time.perf_counter()
    for _ in range(max_new_tokens):
        before = time.perf_counter()
        next_token = hf.forward(model, sequence)[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
        if timestamps is not None and stamp != "linspace":
            timestamps.append({"after": time.perf_counter(), "once": first_reading, "before": before}[stamp])
    if timestamps is not None and stamp == "linspace":
        timestamps.extend(float(t) for t in np.linspace(started, time.perf_counter(), max_new_tokens))
    return sequence[:, prompt_ids.shape[1] :]


@pytest.mark.parametrize(
    "stamp, rule",
    [
        ("once", "are one and the same reading"),
        ("before", "was read before the forward pass that computes token 0 had returned"),
        ("linspace", "was read before the forward pass that computes token 0 had returned"),
    ],
)
def test_loops_that_time_nothing_fail_naming_the_rule(tiny, stamp, rule):
    verdict = week01.grade_naive_loop(lambda *a, **k: loop(*a, **k, stamp=stamp), tiny.model, prompts=2)
    assert not verdict.ok and rule in verdict.line, verdict.line
    assert week01.grade_naive_loop(lambda *a, **k: loop(*a, **k, stamp="after"), tiny.model, prompts=2).ok


def test_stamps_taken_at_the_end_fail():
    forwards = week01.ForwardTimes(None)
    forwards.starts, forwards.ends = [0.0, 2.0, 4.0], [1.0, 3.0, 5.0]
    verdict = week01._stamp_order_verdict([5.1, 5.2, 5.3], forwards)
    assert "was read after the forward pass of token 1 had begun" in verdict.line
    assert week01._stamp_order_verdict([1.5, 3.5, 5.5], forwards) is None


def test_a_request_with_two_tokens_is_a_case():
    """The rule holds for n >= 2 tokens: the check includes the smallest n."""
    first = week01.grade_ttft_tpot(lambda send, times: (0.0, 0.0))
    assert "with 2 tokens" in first.line, first.line


# ---------------------------------------------------------------- grading: cases nobody saw


def test_a_hard_coded_answer_passes_at_home_and_fails_at_grading(monkeypatch):
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    seen = {}

    def recorder(m, k, n, b):
        seen[m, k, n, b] = 2 * m * k * n / (b * (m * k + k * n + m * n))
        return seen[m, k, n, b]

    assert week01.grade_intensity(recorder).ok
    table = dict(seen)  # what a student could hard-code from the cases they saw

    def hard_coded(m, k, n, b):
        return table.get((m, k, n, b), 0.0)

    assert week01.grade_intensity(hard_coded).ok
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    verdict = week01.grade_intensity(hard_coded)
    assert not verdict.ok and "got 0, expected" in verdict.line, verdict.line
    assert (
        week01.grade_intensity(recorder).line
        == "✅ 01.lab.intensity correct: arithmetic intensity matches on 6 matmul shapes"
    )
