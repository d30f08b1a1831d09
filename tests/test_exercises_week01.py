"""Lab 01's checks: each refused library function fails however it is wrapped, naming it; each rule
of the timestamps fails the loop that breaks it, with a message naming the rule; at grading, a
hard-coded answer meets cases it never saw."""

import time

import numpy as np
import pytest
import torch

from infer import hf
from infer.course.grading.checks import GRADING_SALT_ENV, Verdict
from infer.course.grading.exercises import week01
from infer.experiments.prefill_decode import token_gaps_ms, ttft_and_tpot_ms
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.kv_cache import KVCache
from infer.metrics import calculate_metrics, request_latencies_ms
from infer.model import Transformer
from infer.records import RequestRecord
from infer.roofline import matmul_arithmetic_intensity
from tests.refusals import FUNCTION_WRAPPERS, assert_refused, wrapped_function

# ---------------------------------------------------------------- every refused function, every wrapper


def _via_cached_loop(model, prompt_ids, max_new_tokens, timestamps=None):
    course_model = Transformer.from_hf(model)
    cache = KVCache.for_model(course_model, 1, prompt_ids.shape[1] + max_new_tokens)
    return cached_greedy_generate(course_model, prompt_ids, max_new_tokens, cache)


def _via_gaps(send, times):
    gaps = token_gaps_ms(send, times)
    return gaps[0], sum(gaps[1:]) / (len(gaps) - 1)


def _via_latencies(send, times):
    latencies = request_latencies_ms(RequestRecord(1, send, chunk_times=list(times)))
    return latencies.ttft_ms, latencies.tpot_ms


def _via_metrics(send, times):
    metrics = calculate_metrics([RequestRecord(1, send, chunk_times=list(times))])
    return metrics["mean_ttft_ms"], metrics["mean_tpot_ms"]


# (check, refused function, a student function that gets its answer from it)
ADAPTED = [
    ("naive", hf.greedy_generate, lambda m, p, n, timestamps=None: hf.greedy_generate(m, p, n)),
    ("naive", naive_greedy_generate, lambda m, p, n, timestamps=None: naive_greedy_generate(m, p, n, timestamps)),
    ("naive", cached_greedy_generate, _via_cached_loop),
    ("ttft", ttft_and_tpot_ms, lambda send, times: ttft_and_tpot_ms(send, times)),
    ("ttft", token_gaps_ms, _via_gaps),
    ("ttft", request_latencies_ms, _via_latencies),
    ("ttft", calculate_metrics, _via_metrics),
    ("intensity", matmul_arithmetic_intensity, lambda m, k, n, b: matmul_arithmetic_intensity(m, k, n, b)),
]


def grade(check: str, fn, tiny) -> Verdict:
    if check == "naive":
        return week01.grade_naive_loop(fn, tiny.model, prompts=2)
    return {"ttft": week01.grade_ttft_tpot, "intensity": week01.grade_intensity}[check](fn)


def test_every_refused_function_is_adapted_here():
    adapted = {(check, refused) for check, refused, _ in ADAPTED}
    qids = {"naive": week01.NAIVE_QID, "ttft": week01.TTFT_QID, "intensity": week01.INTENSITY_QID}
    assert adapted == {(check, refused) for check, qid in qids.items() for refused in week01.REFUSED[qid]}


@pytest.mark.parametrize("check, refused, student", ADAPTED, ids=[f"{c}-{r.__name__}" for c, r, _ in ADAPTED])
def test_a_function_built_on_a_refused_one_fails_naming_it(tiny, check, refused, student):
    assert_refused(grade(check, student, tiny), refused)


@pytest.mark.parametrize("kind", FUNCTION_WRAPPERS)
@pytest.mark.parametrize(
    "check, twin",
    [("naive", naive_greedy_generate), ("ttft", ttft_and_tpot_ms), ("intensity", matmul_arithmetic_intensity)],
)
def test_the_twin_fails_however_it_is_wrapped(tiny, check, twin, kind):
    assert_refused(grade(check, wrapped_function(twin, kind), tiny), twin)


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
