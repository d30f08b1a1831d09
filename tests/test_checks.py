"""The checks are what a student sees: every wrong answer must fail, with a hint that helps."""

import json

import numpy as np
import pytest
import torch

from infer.course import checks
from infer.course.checks import Case, close_to, grade_answer, grade_function, make_key, same_tokens

MS_KEY = make_key("99.q1", 0.64, unit="ms", sig=2)
GB_KEY = make_key("99.q2", 3.09, unit="GB", sig=3)
CHOICE_KEY = make_key("99.q3", "prefill", options=["prefill", "decode"])


@pytest.mark.parametrize("answer", [0.64, 0.6412, np.float64(0.64), torch.tensor(0.64)])
def test_right_numbers_pass(answer):
    verdict = grade_answer("99.q1", answer, MS_KEY)
    assert verdict.ok and verdict.line == "✅ 99.q1 correct"


@pytest.mark.parametrize("answer, hint", [
    (0.00064, "seconds?"),
    (640.0, "microseconds?"),
    (0.7, "not within 1%"),
    (None, "no answer yet"),
    ("0.64", "expected a number in ms, got str"),
    (True, "expected a number in ms, got bool"),
    ([0.64], "expected a number in ms, got list"),
    (float("nan"), "finite"),
])
def test_wrong_numbers_fail_with_a_specific_hint(answer, hint):
    verdict = grade_answer("99.q1", answer, MS_KEY)
    assert not verdict.ok and verdict.line.startswith("❌ 99.q1: ")
    assert hint in verdict.line, f"expected the hint {hint!r} in {verdict.line!r}"


def test_bytes_instead_of_gigabytes_is_named():
    assert "(bytes?)" in grade_answer("99.q2", 3.09e9, GB_KEY).line
    assert grade_answer("99.q2", 3.09, GB_KEY).ok


def test_choices():
    assert grade_answer("99.q3", " Prefill ", CHOICE_KEY).ok
    assert "not the right choice" in grade_answer("99.q3", "decode", CHOICE_KEY).line
    assert "expected one of 'prefill', 'decode'" in grade_answer("99.q3", "prefil", CHOICE_KEY).line
    assert "as a string" in grade_answer("99.q3", 1, CHOICE_KEY).line


def test_key_is_bound_to_its_question():
    assert not grade_answer("99.q9", 0.64, MS_KEY).ok, "a digest must not validate another question's answer"


def test_keys_hold_no_plain_answers():
    assert "0.64" not in json.dumps(MS_KEY) and "prefill" not in CHOICE_KEY["digest"]


def test_shipped_keys_load_and_unknown_question_is_reported():
    with pytest.raises(KeyError, match="No answer key for '01.q999'"):
        checks.load_key("01.q999")


def test_added_key_grades_its_answer(tmp_path):
    week_file = tmp_path / "77.json"
    checks.add_key(week_file, "77.q1", make_key("77.q1", 20, unit="ms"))
    assert grade_answer("77.q1", 20.0, json.loads(week_file.read_text())["77.q1"]).ok


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

    assert grade_function("99.f", stub, _double, _cases(), close_to(), "").line == "❌ 99.f: not implemented yet (write the loop)"
    line = grade_function("99.f", lambda x: x / 0, _double, _cases(), close_to(), "").line
    assert line == "❌ 99.f: on x = 1.0, raised ZeroDivisionError: float division by zero"
    assert "expected a function" in grade_function("99.f", None, _double, _cases(), close_to(), "").line


def test_close_to_spots_seconds_for_milliseconds():
    problem = close_to(unit="ms")((0.25, 0.02), (250.0, 20.0))
    assert problem == "value 0: got 0.25, expected 250 (in seconds? expected ms)"


def test_same_tokens_says_where_sequences_differ():
    assert same_tokens(torch.tensor([[1, 2, 3]]), torch.tensor([[1, 2, 3]])) is None
    assert same_tokens([1, 5, 3], torch.tensor([[1, 2, 3]])) == "token 1 differs: got 5, expected 2"
    assert same_tokens([1, 2], [1, 2, 3]) == "expected 3 tokens, got 2"
    assert "expected token ids" in same_tokens("1 2 3", [1, 2, 3])
