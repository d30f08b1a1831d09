"""infer.serve.client: the workload, the send schedule, a recorded stream's timing, and a run
against the course server; infer.serve.detokenize: text that arrives in pieces."""

import numpy as np
import pytest

from infer.metrics import calculate_metrics
from infer.serve.client import (
    BenchRequest,
    parse_sse_line,
    random_workload,
    run_benchmark,
    stream_record,
    workload_for_model,
)
from infer.serve.detokenize import IncrementalDetokenizer
from infer.serve.server import EngineSettings, start_server

SPECIAL = (256, 257, 258)


def test_random_workload_has_exact_lengths_and_no_special_tokens():
    requests = random_workload(1024, SPECIAL, 20, 64, 8, seed=3)
    assert all(len(r.prompt_ids) == 64 and r.output_len == 8 for r in requests)
    assert not {t for r in requests for t in r.prompt_ids} & set(SPECIAL)
    assert random_workload(1024, SPECIAL, 20, 64, 8, seed=3) == requests
    assert random_workload(1024, SPECIAL, 20, 64, 8, seed=4) != requests


def test_random_workload_is_vllms_sequence_of_consecutive_allowed_ids():
    """vLLM's random dataset: prompt i is allowed[(offset_i + i + arange(len)) % n_allowed]."""
    (request,) = random_workload(300, SPECIAL, 1, 10, 4, seed=0)
    offset = np.random.default_rng(0)
    offset.integers(10, 11, size=1), offset.integers(4, 5, size=1)
    start = int(offset.integers(0, 300, size=1)[0])
    allowed = [i for i in range(300) if i not in SPECIAL]
    assert request.prompt_ids == [allowed[(start + k) % len(allowed)] for k in range(10)]


def test_range_ratio_spreads_the_lengths():
    requests = random_workload(1024, SPECIAL, 200, 100, 50, range_ratio=0.5, seed=0)
    input_lens = [len(r.prompt_ids) for r in requests]
    output_lens = [r.output_len for r in requests]
    assert 50 <= min(input_lens) < 60 and 140 < max(input_lens) <= 150
    assert 25 <= min(output_lens) and max(output_lens) <= 75
    with pytest.raises(ValueError, match="range_ratio"):
        random_workload(1024, SPECIAL, 2, 10, 10, range_ratio=1.0)


RECORDED = [  # (arrival s, line) as an SSE stream arrives: chunks, blank lines, a ping, usage, [DONE]
    (10.20, 'data: {"choices":[{"index":0,"text":"He"}]}'),
    (10.20, ""),
    (10.25, ": ping"),
    (10.30, 'data: {"choices":[{"index":0,"text":""}]}'),
    (10.45, 'data: {"choices":[{"index":0,"text":"llo","finish_reason":"length"}]}'),
    (10.46, 'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":4,"total_tokens":11}}'),
    (10.46, "data: [DONE]"),
]


def test_a_recorded_stream_gives_chunks_usage_and_vllms_metrics():
    record = stream_record(7, 10.0, RECORDED)
    assert record.success and record.chunk_times == [10.20, 10.30, 10.45]  # an empty text is still a chunk
    assert record.num_output_tokens == 4  # usage, not the chunk count
    metrics = calculate_metrics([record])
    assert metrics["mean_ttft_ms"] == pytest.approx(200.0)
    assert metrics["mean_e2el_ms"] == pytest.approx(450.0)  # ends at the last content chunk, not at usage
    assert metrics["mean_tpot_ms"] == pytest.approx(250.0 / 3)
    assert metrics["median_itl_ms"] == pytest.approx(125.0)


def test_streams_that_fail():
    empty = stream_record(3, 1.0, [(1.5, "data: [DONE]")])
    assert not empty.success and "no output chunk" in empty.error
    broken = stream_record(
        3,
        1.0,
        [(1.1, 'data: {"choices":[{"text":"a"}]}'), (1.2, 'data: {"error":{"message":"engine died","code":500}}')],
    )
    assert not broken.success and broken.error == "engine died"
    assert parse_sse_line(": ping") is None and parse_sse_line("data: [DONE]") is None


def test_detokenizer_holds_back_half_a_character(tiny):
    ids = tiny.tokenizer.encode("é!", add_special_tokens=False)
    assert len(ids) == 3  # two bytes for é, one for !
    detokenizer = IncrementalDetokenizer(tiny.tokenizer)
    assert [detokenizer.add([i]) for i in ids] == ["", "é", "!"]


def test_client_against_the_course_server(tiny):
    requests = workload_for_model(tiny.config, 6, 24, 5, seed=2)
    with start_server(tiny, EngineSettings(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256)) as server:
        result, records = run_benchmark(server.url, "tiny", requests, max_concurrency=3, progress=False)
        with pytest.raises(RuntimeError, match="warm-up request .* failed: HTTP 404"):
            run_benchmark(server.url, "not-the-model", requests, progress=False)
    assert result["completed"] == 6 and result["failed"] == 0
    assert result["total_input_tokens"] == 6 * 24 and result["total_output_tokens"] == 6 * 5
    assert result["max_concurrency"] == 3 and result["output_lens"] == [5] * 6
    assert all(len(r.chunk_times) == 5 for r in records)
    for key in (
        "duration",
        "request_throughput",
        "output_throughput",
        "median_ttft_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "input_lens",
        "ttfts",
        "itls",
        "errors",
    ):  # vLLM's result keys
        assert key in result
    assert isinstance(requests[0], BenchRequest)
