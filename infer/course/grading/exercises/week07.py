"""Lab 07 code check: a streaming client's timing, from the events of an SSE stream.

The student writes `stream_timing(send_time, events)`: from the (arrival time, line) pairs of one
completion stream, the TTFT, the gap before each later chunk (ITL), the E2EL and the completion
token count, as `vllm bench serve` measures them. The check replays streams recorded from the
course server (results/07_recorded_streams.json) and variants of them that real servers produce:
a keep-alive comment before the first chunk, a chunk whose text is empty, several tokens in one
chunk, no usage message, a `[DONE]` that comes late; at grading, also time-warped copies no student
saw. A wrong answer is recomputed the usual wrong ways, and the message names the one that matches.

At grading the library code that computes the timing (HIDDEN_AT_GRADING) is not in the student's
kernel; `parse_sse_line` is given on purpose (GIVEN).
"""

import asyncio
import json
import math
import time

from infer.course.grading.checks import Case, Verdict, as_number, case_rngs, distinct_pair, grade_function
from infer.metrics import calculate_metrics, request_latencies_ms, results_dir
from infer.paths import REPO_ROOT
from infer.serve.client import detailed_fields, parse_sse_line, stream_record

QID = "07.lab.stream_timing"
# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the timing.
HIDDEN_AT_GRADING = (stream_record, request_latencies_ms, calculate_metrics, detailed_fields)
GIVEN = {QID: (parse_sse_line,)}
RECORDED_STREAMS = "07_recorded_streams.json"
KEYS = ("ttft_ms", "itl_ms", "e2el_ms", "completion_tokens")


def reference_timing(send_time: float, events: list[tuple[float, str]]) -> dict:
    record = stream_record(0, send_time, events)
    latencies = request_latencies_ms(record)
    return {
        "ttft_ms": latencies.ttft_ms,
        "itl_ms": list(latencies.itls_ms),
        "e2el_ms": latencies.e2el_ms,
        "completion_tokens": record.num_output_tokens,
    }


# ---------------------------------------------------------------- the streams


def load_recorded_streams() -> list[tuple[float, list[tuple[float, str]]]]:
    data = json.loads((REPO_ROOT / "results" / RECORDED_STREAMS).read_text())
    return [(s["send_time"], [(t, line) for t, line in s["events"]]) for s in data["streams"]]


def with_ping_first(send_time, events):
    """A keep-alive comment (and its blank line) arrives before any output."""
    ping_time = send_time + (events[0][0] - send_time) / 2
    return send_time, [(ping_time, ": ping"), (ping_time, ""), *events]


def with_an_empty_chunk(send_time, events):
    """One middle chunk's text becomes "" (a token that decodes to nothing yet)."""
    chunks = [i for i, (_, line) in enumerate(events) if (m := parse_sse_line(line)) and m.get("choices")]
    index = chunks[len(chunks) // 2]
    message = parse_sse_line(events[index][1])
    message["choices"][0]["text"] = ""
    edited = list(events)
    edited[index] = (events[index][0], "data: " + json.dumps(message))
    return send_time, edited


def with_merged_chunks(send_time, events, per_chunk: int = 3):
    """A server that sends `per_chunk` tokens per message: every `per_chunk` chunks become one
    (arriving when the last of them did); the usage message still counts every token."""
    merged, pending = [], []

    def flush():
        if pending:
            merged.extend([_merge(pending), (pending[-1][0], "")])
            pending.clear()

    for arrival, line in events:
        message = parse_sse_line(line)
        if message and message.get("choices"):
            pending.append((arrival, message))
            if len(pending) == per_chunk:
                flush()
        elif line:  # the usage message or [DONE]: what is pending goes first
            flush()
            merged.extend([(arrival, line), (arrival, "")])
    flush()
    return send_time, merged


def _merge(pending):
    arrival, message = pending[-1]
    message = json.loads(json.dumps(message))
    message["choices"][0]["text"] = "".join(m["choices"][0]["text"] for _, m in pending)
    return arrival, "data: " + json.dumps(message)


def without_usage(send_time, events):
    """No `stream_options.include_usage`: no usage message, so each chunk counts as one token."""
    return send_time, [
        (t, line) for t, line in events if not ((m := parse_sse_line(line)) and not m.get("choices") and m.get("usage"))
    ]


def with_a_late_done(send_time, events, late_s: float = 0.25):
    """`data: [DONE]` (and what follows it) arrives `late_s` after the rest: it ends nothing the
    client measures."""
    done = next(i for i, (_, line) in enumerate(events) if line.strip() == "data: [DONE]")
    return send_time, events[:done] + [(t + late_s, line) for t, line in events[done:]]


VARIANTS = (
    ("as recorded", lambda s, e: (s, e)),
    ("with a ': ping' comment first", with_ping_first),
    ("with an empty-text chunk", with_an_empty_chunk),
    ("with 3 tokens per chunk", with_merged_chunks),
    ("without a usage message", without_usage),
    ("with a late [DONE]", with_a_late_done),
)


def time_warped(rng, send_time, events):
    """The same lines at new times: every gap between arrivals scaled by its own random factor, the
    whole stream moved: a stream nobody saw."""
    shift = rng.uniform(10.0, 1000.0)
    warped, before, now = [], send_time, send_time + shift
    for arrival, line in events:
        now += (arrival - before) * rng.uniform(0.3, 3.0)
        before = arrival
        warped.append((now, line))
    return send_time + shift, warped


def cases() -> list[Case]:
    out = []
    recorded = load_recorded_streams()
    for number, (send_time, events) in enumerate(recorded):
        for name, variant in VARIANTS:
            out.append(Case(f"recorded stream {number} {name}", variant(send_time, events)))
    for rng in case_rngs(QID)[1:]:  # at grading only
        for number, (send_time, events) in enumerate(recorded):
            warped = time_warped(rng, send_time, events)
            for name, variant in VARIANTS:
                out.append(Case(f"recorded stream {number}, time-warped, {name}", variant(*warped)))
    return out


# ---------------------------------------------------------------- the usual mistakes


def _chunk_times(events, keep) -> list[float]:
    times = []
    for arrival, line in events:
        message = parse_sse_line(line)
        if message is not None and keep(message):
            times.append(arrival)
    return times


def _timing_from(send_time, times, tokens) -> dict:
    return {
        "ttft_ms": (times[0] - send_time) * 1e3,
        "itl_ms": [(b - a) * 1e3 for a, b in zip(times, times[1:])],
        "e2el_ms": (times[-1] - send_time) * 1e3,
        "completion_tokens": tokens,
    }


def mistakes(send_time, events) -> list[tuple[str, dict]]:
    """What the usual shortcuts return on this stream, each with the reason it is wrong."""
    right = reference_timing(send_time, events)
    tokens = right["completion_tokens"]
    content = _chunk_times(events, lambda m: bool(m.get("choices")))
    every_message = _chunk_times(events, lambda m: True)
    non_empty = _chunk_times(events, lambda m: bool(m.get("choices")) and m["choices"][0].get("text"))
    first_line = events[0][0]
    done = [t for t, line in events if line.strip() == "data: [DONE]"]
    found = [
        (
            "the usage message (empty `choices`) was counted as an output chunk: it carries no token, so it adds "
            "no ITL and does not end the E2EL",
            _timing_from(send_time, every_message, tokens),
        ),
        (
            "a chunk with empty text was skipped: it is still a chunk the server sent (a token that decodes to "
            "nothing yet), and vLLM's client counts it",
            _timing_from(send_time, non_empty or content, tokens),
        ),
        (
            "completion_tokens counts the chunks; a chunk may carry several tokens: take the usage message's "
            "completion_tokens when the stream has one",
            {**right, "completion_tokens": len(content)},
        ),
        (
            "TTFT was taken at the first line of the stream; comments (': ping') and blank lines are not output",
            {**right, "ttft_ms": (first_line - send_time) * 1e3},
        ),
        (
            "the lines were timed, not the chunks: blank lines and comments are no output chunks",
            _timing_from(send_time, [t for t, line in events if line != "data: [DONE]"], tokens),
        ),
    ]
    if done:
        found.append(
            (
                "the E2EL ends at `data: [DONE]`; it ends at the last output chunk (the usage message and "
                "[DONE] carry no token, and vLLM's client stops the clock at the last chunk)",
                {**right, "e2el_ms": (done[-1] - send_time) * 1e3},
            )
        )
    return [(why, wrong) for why, wrong in found if not _same(wrong, right)]


def _same(a: dict, b: dict) -> bool:
    return (
        a["completion_tokens"] == b["completion_tokens"]
        and len(a["itl_ms"]) == len(b["itl_ms"])
        and all(
            math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
            for x, y in zip([a["ttft_ms"], a["e2el_ms"], *a["itl_ms"]], [b["ttft_ms"], b["e2el_ms"], *b["itl_ms"]])
        )
    )


def _as_timing(got) -> tuple[dict | None, str | None]:
    """The student's answer as a plain dict of numbers, or why it is not one."""
    if got is None:
        return None, "returned None (a missing `return`?); expected a dict with " + ", ".join(KEYS)
    if not isinstance(got, dict):
        return None, f"expected a dict with {', '.join(KEYS)}, got a {type(got).__name__}"
    missing = [key for key in KEYS if key not in got]
    if missing:
        return None, f"the key {missing[0]!r} is missing"
    timing = {}
    for key in ("ttft_ms", "e2el_ms", "completion_tokens"):
        if got[key] is None:
            return None, f"{key} is None: " + (
                "take the usage message's completion_tokens when the stream has one, else count the output chunks"
                if key == "completion_tokens"
                else "expected a number of milliseconds"
            )
        value, problem = as_number(got[key], None if key == "completion_tokens" else "ms")
        if problem:
            return None, f"{key}: {problem}"
        timing[key] = value
    if not isinstance(got["itl_ms"], (list, tuple)):
        return (
            None,
            f"itl_ms: expected a list of gaps in ms, one per chunk after the first, got {type(got['itl_ms']).__name__}",
        )
    gaps = []
    for gap in got["itl_ms"]:
        value, problem = as_number(gap, "ms")
        if problem:
            return None, f"itl_ms: {problem}"
        gaps.append(value)
    timing["itl_ms"] = gaps
    return timing, None


def compare_timing(got, expected) -> str | None:
    right, send_time, events = expected
    timing, problem = _as_timing(got)
    if problem:
        return problem
    if _same(timing, right):
        return None
    for why, wrong in mistakes(send_time, events):
        if _same(timing, wrong):
            return why
    if math.isclose(timing["ttft_ms"] * 1e3, right["ttft_ms"], rel_tol=1e-6):
        return "ttft_ms looks like seconds: report milliseconds"
    for key in ("ttft_ms", "e2el_ms"):
        if not math.isclose(timing[key], right[key], rel_tol=1e-9, abs_tol=1e-9):
            shown_got, shown_expected = distinct_pair(timing[key], right[key])
            return f"{key}: got {shown_got}, expected {shown_expected}"
    if len(timing["itl_ms"]) != len(right["itl_ms"]):
        return (
            f"itl_ms has {len(timing['itl_ms'])} gaps, expected {len(right['itl_ms'])}: one gap before each "
            f"output chunk after the first"
        )
    if timing["completion_tokens"] != right["completion_tokens"]:
        return f"completion_tokens: got {timing['completion_tokens']:g}, expected {right['completion_tokens']}"
    return "itl_ms: a gap differs; each is the time between two consecutive output chunks, in ms"


def grade_stream_timing(student_stream_timing) -> Verdict:
    all_cases = cases()
    visible = len(load_recorded_streams()) * len(VARIANTS)
    return grade_function(
        QID,
        student_stream_timing,
        lambda send_time, events: (reference_timing(send_time, events), send_time, events),
        all_cases,
        compare_timing,
        f"TTFT, ITL, E2EL and token counts match on {visible} recorded streams and variants",
    )


def check_stream_timing(student_stream_timing) -> None:
    print(grade_stream_timing(student_stream_timing).line)


# ---------------------------------------------------------------- recording the streams (authors)


async def _record(url: str, payload: dict) -> dict:
    import httpx

    async with httpx.AsyncClient(timeout=60) as client:
        send_time = time.perf_counter()
        events = []
        async with client.stream("POST", url + "/v1/completions", json=payload) as response:
            async for line in response.aiter_lines():
                events.append((time.perf_counter() - send_time, line))
    return {"payload": payload, "send_time": 0.0, "events": events}


def record_streams(lm) -> str:
    """Record three concurrent streams from the course server into results/07_recorded_streams.json
    (times in seconds after each request was sent). Run by authors; the check replays the file."""
    from infer.provenance import provenance
    from infer.serve.server import EngineSettings, start_server

    payloads = [
        {
            "prompt": list(range(300, 300 + n)),
            "max_tokens": m,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for n, m in ((40, 12), (200, 9), (8, 15))
    ]
    with start_server(lm, EngineSettings(max_num_seqs=4, max_num_batched_tokens=512, max_model_len=512)) as server:

        async def all_streams():
            return await asyncio.gather(*(_record(server.url, p) for p in payloads))

        streams = asyncio.run(all_streams())
    path = results_dir() / RECORDED_STREAMS
    path.write_text(json.dumps({"metadata": provenance(lm), "streams": streams}, indent=1) + "\n")
    return str(path)
