"""infer.metrics: every metric on hand-computed records, the edge cases, and vLLM's result keys."""

import json
import math
import statistics

import numpy as np
import pytest

from infer.metrics import (
    benchmark_duration_s,
    calculate_metrics,
    percentile_key,
    request_goodput,
    request_latencies_ms,
    results_document,
    save_results,
    summarize_ms,
    validate_slo,
)
from infer.records import RequestRecord

# Four requests whose metrics are worked out by hand below.
STREAMED = RequestRecord(prompt_len=10, send_time=0.0, chunk_times=[0.100, 0.150, 0.200, 0.300])
ONE_TOKEN = RequestRecord(prompt_len=20, send_time=1.0, chunk_times=[1.250])
FAILED = RequestRecord(prompt_len=30, send_time=0.5, error="HTTP 500", end_time=2.0)
MULTI_TOKEN_CHUNKS = RequestRecord(
    prompt_len=40, send_time=0.0, chunk_times=[0.200, 0.300, 0.500], chunk_tokens=[1, 3, 2]
)
RUN = [STREAMED, ONE_TOKEN, FAILED, MULTI_TOKEN_CHUNKS]

# vLLM's `--save-result` keys for a generation benchmark (vllm/benchmarks/serve.py), with
# --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,95,99 --goodput ...
VLLM_KEYS = {
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
} | {
    f"{stat}_{metric}_ms"
    for metric in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "std", "p50", "p90", "p95", "p99")
}


def test_latencies_of_a_streamed_request():
    lat = request_latencies_ms(STREAMED)
    assert lat.ttft_ms == pytest.approx(100.0), "TTFT is the first chunk's arrival minus the send time"
    assert lat.e2el_ms == pytest.approx(300.0), "E2EL is the last chunk's arrival minus the send time"
    assert lat.tpot_ms == pytest.approx(200.0 / 3), "TPOT is (E2EL - TTFT) / (tokens - 1): 200 ms over 3 gaps"
    assert lat.itls_ms == pytest.approx((50.0, 50.0, 100.0)), "ITL: each gap between consecutive chunks"


def test_one_token_request_has_no_tpot_and_no_itl():
    lat = request_latencies_ms(ONE_TOKEN)
    assert (lat.ttft_ms, lat.e2el_ms) == (pytest.approx(250.0), pytest.approx(250.0))
    assert lat.tpot_ms is None, "TPOT is undefined for one output token (vLLM leaves it out of the statistics)"
    assert lat.itls_ms == ()


def test_tpot_divides_by_tokens_not_chunks():
    lat = request_latencies_ms(MULTI_TOKEN_CHUNKS)
    assert MULTI_TOKEN_CHUNKS.num_output_tokens == 6
    assert lat.tpot_ms == pytest.approx((500.0 - 200.0) / 5), "6 tokens in 3 chunks: TPOT spreads 300 ms over 5 tokens"
    assert lat.itls_ms == pytest.approx((100.0, 200.0)), "ITL is measured per chunk, as vLLM does"


def test_reported_output_tokens_win_over_chunk_count():
    record = RequestRecord(5, 0.0, chunk_times=[0.1, 0.2], output_tokens=5)
    assert record.num_output_tokens == 5
    assert request_latencies_ms(record).tpot_ms == pytest.approx(100.0 / 4)


def test_run_metrics_by_hand():
    m = calculate_metrics(RUN, percentiles=(50, 90))
    assert m["duration"] == pytest.approx(2.0), (
        "duration runs from the first send (0.0) to the failed request's end (2.0)"
    )
    assert (m["completed"], m["failed"]) == (3, 1)
    assert m["total_input_tokens"] == 10 + 20 + 40, "a failed request's prompt is not counted"
    assert m["total_output_tokens"] == 4 + 1 + 6
    assert m["request_throughput"] == pytest.approx(3 / 2.0)
    assert m["output_throughput"] == pytest.approx(11 / 2.0)
    assert m["total_token_throughput"] == pytest.approx((70 + 11) / 2.0)
    assert m["request_goodput"] is None, "without SLOs there is no goodput (vLLM writes null)"
    # TTFT over the three successes: 100, 250, 200 ms; the failed request is left out.
    assert m["mean_ttft_ms"] == pytest.approx(550 / 3)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["std_ttft_ms"] == pytest.approx(statistics.pstdev([100, 250, 200])), "std is numpy's (ddof=0)"
    assert m["p90_ttft_ms"] == pytest.approx(200 + 0.8 * 50), "linear interpolation between 200 and 250"
    # TPOT only over requests with more than one token: 66.67 and 60 ms.
    assert m["mean_tpot_ms"] == pytest.approx((200 / 3 + 60) / 2)
    # E2EL: 300, 250, 500 ms.
    assert m["median_e2el_ms"] == pytest.approx(300.0)


def test_itl_is_pooled_over_requests_not_averaged_per_request():
    m = calculate_metrics(RUN, percentiles=(50, 90))
    gaps = [50, 50, 100, 100, 200]
    assert m["mean_itl_ms"] == pytest.approx(np.mean(gaps)), (
        "mean ITL must pool every gap of every request (100 ms), not average the per-request means (108.3 ms)"
    )
    assert m["p50_itl_ms"] == pytest.approx(100.0)
    assert m["p90_itl_ms"] == pytest.approx(100 + 0.6 * 100), "index 0.9 * 4 = 3.6 between 100 and 200"


def test_goodput_by_hand():
    # Successful requests: STREAMED (TTFT 100, TPOT 66.7, E2EL 300), ONE_TOKEN (250, -, 250), MULTI (200, 60, 500).
    assert request_goodput(RUN, {"ttft": 200}) == pytest.approx(2 / 2.0), "TTFT 200 ms: STREAMED and MULTI (<= counts)"
    assert request_goodput(RUN, {"tpot": 60}) == pytest.approx(2 / 2.0), "a one-token request counts with TPOT 0"
    assert request_goodput(RUN, {"ttft": 200, "tpot": 60}) == pytest.approx(1 / 2.0), "every SLO must hold at once"
    assert request_goodput(RUN, {"e2el": 100}) == 0.0
    m = calculate_metrics(RUN, slo_ms={"ttft": 200, "tpot": 60})
    assert m["request_goodput"] == pytest.approx(0.5)


def test_seed_example_throughput_vs_goodput():
    # 100 requests finish in one second, but only 30 meet TTFT <= 500 ms and TPOT <= 20 ms.
    records = []
    for i in range(100):
        ttft = 0.2 if i < 30 else 0.8
        records.append(RequestRecord(2048, 0.0, chunk_times=[ttft + 0.01 * k for k in range(11)]))
    records.append(RequestRecord(2048, 0.0, error="late marker", end_time=1.0))  # fixes the duration at 1 s
    m = calculate_metrics(records, slo_ms={"ttft": 500, "tpot": 20})
    assert m["request_throughput"] == pytest.approx(100.0)
    assert m["request_goodput"] == pytest.approx(30.0)


def test_statistics_of_empty_lists_are_zero_like_vllm():
    m = calculate_metrics([ONE_TOKEN])
    for stat in ("mean", "median", "std", "p99"):
        assert m[f"{stat}_tpot_ms"] == 0.0 and m[f"{stat}_itl_ms"] == 0.0
    with pytest.warns(UserWarning, match="every request failed"):
        m = calculate_metrics([FAILED])
    assert (m["completed"], m["failed"], m["mean_ttft_ms"], m["output_throughput"]) == (0, 1, 0.0, 0.0)


def test_summary_matches_numpy_on_random_values():
    rng = np.random.default_rng(0)
    values = rng.lognormal(3, 1, size=37)
    s = summarize_ms(values, percentiles=(50, 95, 99.9))
    assert s["p95"] == pytest.approx(np.percentile(values, 95))
    assert s["p99.9"] == pytest.approx(np.percentile(values, 99.9))
    assert s["std"] == pytest.approx(np.std(values))
    assert percentile_key(99) == "p99" and percentile_key(99.9) == "p99.9" and percentile_key(50.0) == "p50"


def test_a_record_without_chunks_is_a_failure():
    silent = RequestRecord(8, 0.0, chunk_times=[], end_time=0.4)
    assert not silent.success, "vLLM fails a request that never streamed a chunk"
    m = calculate_metrics([STREAMED, silent])
    assert (m["completed"], m["failed"]) == (1, 1)
    assert benchmark_duration_s([STREAMED, silent]) == pytest.approx(0.4)


# ---------------------------------------------------------------- errors


def test_empty_input_is_an_error():
    with pytest.raises(ValueError, match="no request records"):
        calculate_metrics([])


@pytest.mark.parametrize(
    "record, match",
    [
        (RequestRecord(4, 1.0, chunk_times=[0.9, 1.1]), "before the send time"),
        (RequestRecord(4, 0.0, chunk_times=[0.2, 0.1]), "before chunk 0"),
        (RequestRecord(4, -1.0, chunk_times=[0.2]), "send_time is negative"),
        (RequestRecord(4, 1.0, error="x", end_time=0.5), "end_time"),
        (RequestRecord(4, 0.0, chunk_times=[0.1, 0.2], chunk_tokens=[1]), "chunk_tokens"),
    ],
)
def test_impossible_times_are_errors(record, match):
    with pytest.raises(ValueError, match=match):
        calculate_metrics([STREAMED, record])


@pytest.mark.parametrize(
    "slo, match",
    [
        ({"ttft_ms": 500}, "unknown SLO 'ttft_ms'.*write 'ttft'"),
        ({"itl": 20}, "valid SLO keys are ttft, tpot, e2el"),
        ({"tpot": -1}, ">= 0"),
        ({"tpot": "20"}, "finite number"),
    ],
)
def test_bad_slos_are_errors(slo, match):
    with pytest.raises(ValueError, match=match):
        calculate_metrics(RUN, slo_ms=slo)
    with pytest.raises(ValueError, match=match):
        validate_slo(slo)


def test_zero_duration_is_an_error():
    with pytest.raises(ValueError, match="duration"):
        calculate_metrics([RequestRecord(4, 1.0, chunk_times=[1.0])])


# ---------------------------------------------------------------- result keys and files


def test_result_keys_are_vllms():
    m = calculate_metrics(RUN, slo_ms={"ttft": 500, "tpot": 20})
    missing = VLLM_KEYS - set(m)
    assert not missing, f"keys vllm bench serve --save-result writes are missing: {sorted(missing)}"
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in m.values()), "every value a finite number"
    json.dumps(m)  # plain floats and ints, no numpy scalars


META = {
    "kind": "measured",
    "device": "cpu (2 threads)",
    "model": "tiny",
    "weights": "random",
    "dtype": "float32",
    "profile": "cpu",
    "date": "2025-01-01",
    "commit": "abc1234",
    "python": "3.11",
    "torch": "2",
    "transformers": "5",
    "infer": "0",
}


def test_results_file_has_metadata_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_RESULTS_DIR", str(tmp_path))
    run = {"max_concurrency": 2, **calculate_metrics(RUN, slo_ms={"ttft": 500})}
    path = save_results("03_test", [run], META, grid={"input_lens": [32]})
    saved = json.loads(path.read_text())
    assert path.parent == tmp_path
    assert saved["metadata"] == META and saved["grid"] == {"input_lens": [32]}
    assert saved["runs"][0]["p99_itl_ms"] == run["p99_itl_ms"]
    with pytest.raises(ValueError, match="metadata lacks"):
        results_document([run], {"device": "cpu"})
