"""Lab 07's check: each refused library function fails however it is wrapped, naming it; the E2EL that
ends at `[DONE]` and a token count of None get messages that name the real cause; at grading, a
hard-coded answer meets streams it never saw."""

import pytest

from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week07
from infer.metrics import calculate_metrics, request_latencies_ms
from infer.records import RequestRecord
from infer.serve.client import detailed_fields, parse_sse_line, stream_record
from tests.refusals import FUNCTION_WRAPPERS, assert_refused, wrapped_function


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


def _record(send_time, events):
    times, usage = chunk_times_and_usage(events)
    return RequestRecord(0, send_time, chunk_times=times, output_tokens=usage)


def _via_stream_record(send_time, events):
    record = stream_record(0, send_time, events)
    return stream_timing(send_time, events) | {"completion_tokens": record.num_output_tokens}


def _via_latencies(send_time, events):
    latencies = request_latencies_ms(_record(send_time, events))
    return stream_timing(send_time, events) | {"ttft_ms": latencies.ttft_ms, "e2el_ms": latencies.e2el_ms}


def _via_metrics(send_time, events):
    metrics = calculate_metrics([_record(send_time, events)])
    return stream_timing(send_time, events) | {"ttft_ms": metrics["mean_ttft_ms"]}


def _via_detailed(send_time, events):
    fields = detailed_fields([_record(send_time, events)])
    return stream_timing(send_time, events) | {"ttft_ms": fields["ttfts"][0] * 1e3}


ADAPTED = {
    stream_record: _via_stream_record,
    request_latencies_ms: _via_latencies,
    calculate_metrics: _via_metrics,
    detailed_fields: _via_detailed,
}


def test_every_refused_function_is_adapted_here():
    assert set(ADAPTED) == set(week07.REFUSED[week07.QID])


@pytest.mark.parametrize("refused", list(ADAPTED), ids=lambda f: f.__name__)
def test_a_function_built_on_a_refused_one_fails_naming_it(refused):
    assert_refused(week07.grade_stream_timing(ADAPTED[refused]), refused)


@pytest.mark.parametrize("kind", FUNCTION_WRAPPERS)
def test_a_wrapper_around_stream_record_fails_however_it_is_written(kind):
    record_of = wrapped_function(stream_record, kind)

    def student(send_time, events):
        record = record_of(0, send_time, events)
        return stream_timing(send_time, events) | {"completion_tokens": record.num_output_tokens}

    assert_refused(week07.grade_stream_timing(student), stream_record)


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
