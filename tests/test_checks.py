"""The checks are what a student sees: an answer passes if and only if it lies within the stated
tolerance, every wrong answer fails with a message that is true and helps, and the same answer
always gets the same line."""

import json
import math
import random

import numpy as np
import pytest
import torch

from infer.course.grading import checks
from infer.course.grading.checks import (
    Case,
    OpWatch,
    close_to,
    grade_answer,
    grade_function,
    key_interval,
    library_origin,
    same_tokens,
    sealed_key,
)

SECTION = 'the week 99 lecture, section 1 ("Numbers")'
MS_KEY = sealed_key("99.q1", {"kind": "number", "unit": "ms", "tolerance": 0.01, "section": SECTION}, 0.64)
GB_KEY = sealed_key("99.q2", {"kind": "number", "unit": "GB", "tolerance": 0.01}, 3.09)
CHOICE_KEY = sealed_key("99.q3", {"kind": "choice", "options": ["prefill", "decode"], "section": SECTION}, "prefill")
COUNT_KEY = sealed_key("99.q4", {"kind": "number", "unit": "tokens", "tolerance": "exact"}, 6225)


@pytest.mark.parametrize(
    "answer",
    [
        0.64,
        0.6412,
        0.6336,
        0.6464,
        np.float64(0.64),
        np.float32(0.64),
        torch.tensor(0.64),
        torch.tensor(0.64, dtype=torch.float32),
        np.array(0.64),
    ],
)
def test_right_numbers_pass(answer):
    verdict = grade_answer("99.q1", answer, MS_KEY)
    assert verdict.ok and verdict.line == "✅ 99.q1 correct"


@pytest.mark.parametrize(
    "answer, hint",
    [
        (0.00064, "(seconds?)"),
        (640.0, "(microseconds?)"),
        (0.7, "0.7 ms is not within 1% of the expected value; see the week 99 lecture, section 1"),
        (None, "no answer yet"),
        ("0.64", "got the string '0.64'"),
        (True, "got the bool True"),
        ([0.64], "expected one number in ms, got a list of 1 item"),
        ({"ttft": 0.64}, "got a dict"),
        (torch.tensor([0.64, 0.5]), "got a Tensor of shape (2,)"),
        (float("nan"), "finite"),
    ],
)
def test_wrong_numbers_fail_with_their_own_message(answer, hint):
    verdict = grade_answer("99.q1", answer, MS_KEY)
    assert not verdict.ok and verdict.line.startswith("❌ 99.q1: ")
    assert hint in verdict.line, f"expected the hint {hint!r} in {verdict.line!r}"


def test_acceptance_has_no_gaps_and_follows_the_stated_tolerance():
    """Every answer within 1% passes and every answer outside fails: no rounding decides."""
    for relative in np.linspace(-0.0099, 0.0099, 199):
        assert grade_answer("99.q1", 0.64 * (1 + relative), MS_KEY).ok, relative
    for relative in (-0.0102, 0.0102, 0.02, -0.5):
        assert not grade_answer("99.q1", 0.64 * (1 + relative), MS_KEY).ok, relative


def test_exact_counts_accept_only_the_count():
    assert grade_answer("99.q4", 6225, COUNT_KEY).ok and grade_answer("99.q4", np.int64(6225), COUNT_KEY).ok
    assert grade_answer("99.q4", 6225.0, COUNT_KEY).ok
    assert grade_answer("99.q4", 6224, COUNT_KEY).line == "❌ 99.q4: 6224 tokens is not the exact answer"
    assert "expected a whole number, got 6225.4" in grade_answer("99.q4", 6225.4, COUNT_KEY).line


def test_bytes_instead_of_gigabytes_is_named():
    assert "(bytes?)" in grade_answer("99.q2", 3.09e9, GB_KEY).line
    assert grade_answer("99.q2", 3.09, GB_KEY).ok


def test_choices():
    assert grade_answer("99.q3", " Prefill ", CHOICE_KEY).ok
    assert grade_answer("99.q3", "decode", CHOICE_KEY).line == (
        "❌ 99.q3: 'decode' is not the right choice; see the week 99 lecture, section 1 (\"Numbers\")"
    )
    assert "expected one of 'prefill', 'decode'" in grade_answer("99.q3", "prefil", CHOICE_KEY).line
    assert "as a string" in grade_answer("99.q3", 1, CHOICE_KEY).line


def test_key_is_bound_to_its_question():
    assert not grade_answer("99.q9", 0.64, {**MS_KEY}).ok, "a key must not validate another question's answer"


def test_keys_hold_no_plain_answers():
    text = json.dumps([MS_KEY, CHOICE_KEY, COUNT_KEY])
    assert "0.64" not in text and '"prefill"' not in text.replace('"options": ["prefill"', "") and "6225" not in text
    assert key_interval("99.q1", MS_KEY) == pytest.approx((0.6336, 0.6464))


def test_an_exact_key_needs_a_whole_number():
    with pytest.raises(ValueError, match="whole number"):
        sealed_key("99.q5", {"kind": "number", "unit": "rows", "tolerance": "exact"}, 187.5)


def test_unknown_question_is_reported():
    with pytest.raises(KeyError, match="No answer key for '01.q999'"):
        checks.load_key("01.q999")


# ---------------------------------------------------------------- code checks


def _double(x):
    return 2 * x


def _cases():
    return [Case(f"x = {x}", (x,)) for x in (1.0, 2.5, -3.0)]


def test_function_check_passes_and_names_what_was_verified():
    verdict = grade_function("99.f", _double, _double, _cases(), close_to(), "matches on 3 inputs")
    assert verdict.line == "✅ 99.f correct: matches on 3 inputs"


def test_function_check_names_the_failing_case():
    verdict = grade_function("99.f", lambda x: x + x if x > 0 else x, _double, _cases(), close_to(), "")
    assert verdict.line == "❌ 99.f: on x = -3.0, the value: got -3, expected -6"


def test_function_check_reports_stub_and_exceptions_in_one_line():
    def stub(x):
        raise NotImplementedError("write the loop")

    assert (
        grade_function("99.f", stub, _double, _cases(), close_to(), "").line
        == "❌ 99.f: not implemented yet (write the loop)"
    )
    line = grade_function("99.f", lambda x: x / 0, _double, _cases(), close_to(), "").line
    assert line == "❌ 99.f: on x = 1.0, raised ZeroDivisionError: float division by zero"
    assert "expected a function" in grade_function("99.f", None, _double, _cases(), close_to(), "").line


def test_float32_results_pass_and_near_misses_show_distinct_digits():
    compare = close_to()
    assert compare(np.float32(0.9987), 0.9987) is None and compare(torch.tensor(0.9987), 0.9987) is None
    problem = compare(0.99871, 0.9987)
    assert problem == "the value: got 0.99871, expected 0.9987"


@pytest.mark.parametrize(
    "got, message",
    [
        ([0.25, 20.0], None),
        (None, "expected a tuple of 2 numbers, got a NoneType"),
        ({"ttft": 0.25}, "expected a tuple of 2 numbers, got a dict"),
        ("0.25, 20", "expected a tuple of 2 numbers, got the string"),
        ((0.25,), "expected a tuple of 2 numbers, got a tuple of 1 item"),
        ((0.25, None), "value 1: expected a number in ms, got None"),
    ],
)
def test_tuple_answers(got, message):
    problem = close_to(unit="ms")(got, (0.25, 20.0))
    assert problem == message if message is None else message in problem


def test_close_to_spots_seconds_for_milliseconds():
    problem = close_to(unit="ms")((0.25, 0.02), (250.0, 20.0))
    assert problem == "value 0: got 0.25, expected 250 (in seconds? expected ms)"


def test_same_tokens_says_where_sequences_differ():
    assert same_tokens(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2, 3]])) is None
    assert same_tokens([1, 5, 3], torch.tensor([[1, 2, 3]])) == "token 1 differs: got 5, expected 2"
    assert same_tokens([1, 2], [1, 2, 3]) == "expected 3 tokens, got 2"
    assert "expected token ids" in same_tokens("1 2 3", [1, 2, 3])


def test_the_library_own_function_is_refused():
    from infer.kv_cache import KVCache
    from infer.metrics import request_latencies_ms

    assert library_origin(request_latencies_ms) == "infer.metrics.request_latencies_ms"
    assert library_origin(type("Mine", (KVCache,), {})) == "infer.kv_cache.KVCache"
    assert library_origin(_double) is None and library_origin(lambda x: x) is None
    assert library_origin(math.sqrt) is None, "only the course library counts, not Python's or torch's"
    verdict = grade_function("99.f", request_latencies_ms, request_latencies_ms, [], close_to(), "")
    assert verdict.line == (
        "❌ 99.f: this is the course library's own infer.metrics.request_latencies_ms, imported "
        "rather than written: the lab asks you to write it yourself"
    )


def test_op_watch_sees_ops_and_sizes():
    x = torch.ones(4, 8)
    with OpWatch() as watch:
        torch.cat([x, x])
        x @ x.T
    assert watch.first(["aten::cat"]) == "aten::cat" and watch.first(["scaled_dot_product"]) is None
    assert watch.first_larger_than(64) == ("aten::cat", (8, 8)) and watch.first_larger_than(65) is None


def test_a_copy_of_a_library_class_is_named_as_the_class_it_copies():
    from infer.kv_cache import KVCache

    clone = type("SimpleKVCache", (), dict(vars(KVCache)))  # keeps KVCache's __module__, not its name
    assert library_origin(clone) == "infer.kv_cache.KVCache"
    renamed = type("SimpleKVCache", (), {k: v for k, v in vars(KVCache).items() if k != "__module__"})
    assert library_origin(renamed) == "infer.kv_cache.KVCache", "its methods are the library's"


def test_grading_adds_cases_nobody_saw(monkeypatch):
    from infer.course.grading.checks import GRADING_SALT_ENV, case_rngs

    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    (home,) = case_rngs("99.f")
    assert home.random() == checks.case_rng("99.f").random()
    monkeypatch.setenv(GRADING_SALT_ENV, "abc")
    visible, unseen = case_rngs("99.f")
    assert visible.random() == checks.case_rng("99.f").random() != unseen.random()
    monkeypatch.setenv(GRADING_SALT_ENV, "abd")
    assert case_rngs("99.f")[1].random() != random.Random("99.f|grading|abc").random()


def test_a_rejected_fraction_is_printed_whole():
    key = sealed_key("99.q5", {"kind": "number", "unit": "bytes", "tolerance": "exact"}, 131072)
    line = grade_answer("99.q5", 131072.5, key).line
    assert "got 131072.5:" in line, line
    bytes_key = sealed_key("99.q6", {"kind": "number", "unit": "bytes", "tolerance": 0.01}, 131072.0)
    assert "got 0.000131072 (GB?)" in grade_answer("99.q6", 0.000131072, bytes_key).line


@pytest.mark.parametrize("value", [50.0, 50.00000000000001, 49.99999999999999, 0.2 / 4 * 1e3])
def test_both_edges_of_a_tolerance_pass_whatever_float_the_key_holds(value):
    key = sealed_key("99.q7", {"kind": "number", "unit": "ms", "tolerance": 0.01}, value)
    for edge in (50 * 1.01, 50 * 0.99, 50.5, 49.5, 50 + 0.5, 50 - 0.5):
        assert grade_answer("99.q7", edge, key).ok, (value, edge)
    for outside in (50.5001, 49.4999):
        assert not grade_answer("99.q7", outside, key).ok, (value, outside)


def test_whole_numbers_are_printed_whole():
    from infer.course.grading.checks import distinct_pair

    assert distinct_pair(65536.0, 131072) == ("65536", "131072")
    assert distinct_pair(2097152, 68719476736.0) == ("2097152", "68719476736")
    assert distinct_pair(0.9987, 0.99871) == ("0.9987", "0.99871")
    key = sealed_key("99.q8", {"kind": "number", "unit": "bytes", "tolerance": "exact"}, 131072)
    assert "65536 bytes is not the exact answer" in grade_answer("99.q8", 65536, key).line
