"""Lab 07's check: the E2EL that ends at `[DONE]` and a token count of None get messages that name
the real cause; at grading, a hard-coded answer meets streams it never saw."""

from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week07
from infer.metrics import calculate_metrics, request_latencies_ms
from infer.serve.client import detailed_fields, parse_sse_line, stream_record


def chunk_times_and_usage(events):
    times, usage = [], None
    for arrival, line in events:
        message = parse_sse_line(line)
        if message is None:
            continue
        if message.get("choices"):
            times.append(arrival)
        elif message.get("usage"):
            usage = message["usage"]["completion_tokens"]
    return times, usage


def stream_timing(send_time, events, e2el_at_done=False, none_without_usage=False):
    times, usage = chunk_times_and_usage(events)
    done = [t for t, line in events if line.strip() == "data: [DONE]"]
    end = done[-1] if e2el_at_done and done else times[-1]
    tokens = usage if usage is not None or none_without_usage else len(times)
    return {
        "ttft_ms": (times[0] - send_time) * 1e3,
        "itl_ms": [(b - a) * 1e3 for a, b in zip(times, times[1:])],
        "e2el_ms": (end - send_time) * 1e3,
        "completion_tokens": tokens,
    }


def test_the_honest_function_passes_and_parse_sse_line_is_allowed():
    assert week07.grade_stream_timing(stream_timing).ok
    assert week07.GIVEN[week07.QID] == (parse_sse_line,)


def test_the_kernel_lacks_every_library_function_that_times_a_stream():
    assert set(week07.HIDDEN_AT_GRADING) == {stream_record, request_latencies_ms, calculate_metrics, detailed_fields}


def test_an_e2el_that_ends_at_done_is_named():
    verdict = week07.grade_stream_timing(lambda s, e: stream_timing(s, e, e2el_at_done=True))
    assert not verdict.ok, verdict.line
    assert "the E2EL ends at `data: [DONE]`; it ends at the last output chunk" in verdict.line


def test_a_token_count_of_none_is_named_for_what_it_is():
    verdict = week07.grade_stream_timing(lambda s, e: stream_timing(s, e, none_without_usage=True))
    assert not verdict.ok and "completion_tokens is None: take the usage message's" in verdict.line, verdict.line
    assert "without a `return`" not in verdict.line and "no answer yet" not in verdict.line


def test_a_hard_coded_answer_passes_at_home_and_fails_at_grading(monkeypatch):
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    answers = {}

    def recorder(send_time, events):
        answers[send_time, len(events), events[-1][0]] = stream_timing(send_time, events)
        return answers[send_time, len(events), events[-1][0]]

    assert week07.grade_stream_timing(recorder).ok
    table = dict(answers)

    def hard_coded(send_time, events):
        return table.get((send_time, len(events), events[-1][0]))

    assert week07.grade_stream_timing(hard_coded).ok
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    verdict = week07.grade_stream_timing(hard_coded)
    assert not verdict.ok and "time-warped" in verdict.line, verdict.line
