"""Lab 07: each shortcut of a streaming client's timing fails its check with the message that names
it; deliberately wrong answers, substituted into the solution, fail exactly their own checks."""

import pytest

from infer.course.grading.exercises.week07 import grade_stream_timing
from infer.serve.client import parse_sse_line
from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT


def timing_of(send_time, chunk_times, tokens):
    return {
        "ttft_ms": (chunk_times[0] - send_time) * 1e3,
        "itl_ms": [(b - a) * 1e3 for a, b in zip(chunk_times, chunk_times[1:])],
        "e2el_ms": (chunk_times[-1] - send_time) * 1e3,
        "completion_tokens": tokens,
    }


def usage_tokens(events):
    for _, line in events:
        message = parse_sse_line(line)
        if message and not message.get("choices") and message.get("usage"):
            return message["usage"]["completion_tokens"]
    return None


def chunks(events, keep):
    return [t for t, line in events if (m := parse_sse_line(line)) is not None and keep(m)]


def counts_the_usage_message(send_time, events):
    times = chunks(events, lambda m: True)
    return timing_of(send_time, times, usage_tokens(events) or len(times))


def skips_empty_text(send_time, events):
    times = chunks(events, lambda m: bool(m.get("choices")) and m["choices"][0]["text"] != "")
    return timing_of(send_time, times, usage_tokens(events) or len(times))


def counts_chunks_as_tokens(send_time, events):
    times = chunks(events, lambda m: bool(m.get("choices")))
    return timing_of(send_time, times, len(times))


def ttft_from_the_first_line(send_time, events):
    times = chunks(events, lambda m: bool(m.get("choices")))
    return {
        **timing_of(send_time, times, usage_tokens(events) or len(times)),
        "ttft_ms": (events[0][0] - send_time) * 1e3,
    }


def times_every_line(send_time, events):
    times = [t for t, line in events if line != "data: [DONE]"]
    return timing_of(send_time, times, usage_tokens(events) or len(chunks(events, lambda m: bool(m.get("choices")))))


def in_seconds(send_time, events):
    times = chunks(events, lambda m: bool(m.get("choices")))
    right = timing_of(send_time, times, usage_tokens(events) or len(times))
    return {**right, "ttft_ms": right["ttft_ms"] / 1e3}


def reads_usage_only(send_time, events):
    times = chunks(events, lambda m: bool(m.get("choices")))
    return timing_of(send_time, times, usage_tokens(events))  # None without a usage message


@pytest.mark.parametrize(
    "shortcut,named",
    [
        (counts_the_usage_message, "the usage message (empty `choices`) was counted as an output chunk"),
        (skips_empty_text, "a chunk with empty text was skipped"),
        (counts_chunks_as_tokens, "completion_tokens counts the chunks"),
        (ttft_from_the_first_line, "TTFT was taken at the first line of the stream"),
        (times_every_line, "the lines were timed, not the chunks"),
        (in_seconds, "ttft_ms looks like seconds"),
        (reads_usage_only, "completion_tokens is None: take the usage message's completion_tokens"),
    ],
)
def test_each_shortcut_fails_with_its_name(shortcut, named):
    verdict = grade_stream_timing(shortcut)
    assert not verdict.ok and named in verdict.reason, verdict.line


def test_a_right_answer_passes_and_the_librarys_is_refused():
    from infer.course.grading.exercises.week07 import reference_timing

    right = lambda send_time, events: timing_of(  # noqa: E731
        send_time,
        chunks(events, lambda m: bool(m.get("choices"))),
        usage_tokens(events) or len(chunks(events, lambda m: bool(m.get("choices")))),
    )
    assert grade_stream_timing(right).ok
    assert "course library's own" in grade_stream_timing(reference_timing).reason


LAB07_MISTAKES = {
    "q1": "answer_q1 = 48 + 1  # forgot the usage message",
    "q2": "answer_q2 = 24 * 3 * 1e3  # multiplied instead of divided",
    "q3": "answer_q3 = 5_000 / 200  # throughput, not goodput",
    "q4": 'answer_q4 = "ttft up, itl down"',
    "q5": 'answer_q5 = "queueing"',
    "stream-timing": """    chunk_times, usage_tokens = [], None
    for arrival, line in events:
        message = parse_sse_line(line)
        if message is None:
            continue
        chunk_times.append(arrival)  # every data message, the usage one included
        if message.get("usage"):
            usage_tokens = message["usage"]["completion_tokens"]
    return {"ttft_ms": (chunk_times[0] - send_time) * 1e3,
            "itl_ms": [(b - a) * 1e3 for a, b in zip(chunk_times, chunk_times[1:])],
            "e2el_ms": (chunk_times[-1] - send_time) * 1e3,
            "completion_tokens": len(chunk_times) if usage_tokens is None else usage_tokens}""",
}
LAB07_CHECK_OF_TASK = {"stream-timing": "check-stream-timing"}


def test_lab07_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "07_serving.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB07_MISTAKES, LAB07_CHECK_OF_TASK, tmp_path)
