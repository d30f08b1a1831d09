"""A bounded load test of the course server on 127.0.0.1: 32 concurrent streams, a quarter of
the clients hanging up mid-stream. Every request that was not abandoned completes with all its
tokens, and afterwards the /metrics gauges are back to 0: no slot leaked."""

import asyncio
import random
import time

import httpx

from infer.serve.client import completion_payload, stream_record, workload_for_model
from infer.serve.metrics import read_metrics
from infer.serve.server import EngineSettings, start_server

STREAMS = 32
REQUESTS = 64
OUTPUT_LEN = 24
LIMIT_S = 60.0  # the whole test, server start included, stays under this


async def one_client(client, url: str, payload: dict, hang_up_after: int | None):
    """Stream one completion; hang up after `hang_up_after` chunks (None: read to the end)."""
    send_time, events, chunks = time.perf_counter(), [], 0
    async with client.stream("POST", url, json=payload) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            events.append((time.perf_counter(), line))
            chunks += line.startswith('data: {"id"') and '"choices":[{' in line
            if hang_up_after is not None and chunks >= hang_up_after:
                return None  # leaving the block closes the connection mid-stream
    return stream_record(len(payload["prompt"]), send_time, events)


async def load(url: str, requests, hang_ups: dict[int, int]):
    slots = asyncio.Semaphore(STREAMS)
    limits = httpx.Limits(max_connections=STREAMS)
    async with httpx.AsyncClient(timeout=LIMIT_S, limits=limits) as client:

        async def run(i, request):
            async with slots:
                return await one_client(
                    client,
                    url + "/v1/completions",
                    completion_payload("tiny", request, ignore_eos=True),
                    hang_ups.get(i),
                )

        return await asyncio.wait_for(asyncio.gather(*(run(i, r) for i, r in enumerate(requests))), LIMIT_S)


def test_32_streams_with_random_disconnects_leave_no_failure_and_no_leaked_slot(tiny):
    started = time.monotonic()
    rng = random.Random(0)
    requests = workload_for_model(tiny.config, REQUESTS, 48, OUTPUT_LEN, range_ratio=0.5, seed=5)
    hang_ups = {i: rng.randint(1, OUTPUT_LEN // 2) for i in rng.sample(range(REQUESTS), REQUESTS // 4)}
    settings = EngineSettings(
        max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=256
    )  # 32 streams > 16 slots: some wait
    with start_server(tiny, settings) as server:
        records = asyncio.run(load(server.url, requests, hang_ups))
        with httpx.Client(base_url=server.url, timeout=10) as http:
            deadline = time.monotonic() + 10
            while True:
                gauges = read_metrics(http.get("/metrics").text)
                busy = [
                    name
                    for name in (
                        "infer:num_requests_running",
                        "infer:num_requests_waiting",
                        "infer:kv_cache_usage_perc",
                        "infer:num_open_responses",
                    )
                    if gauges[name] != 0
                ]
                if not busy or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert http.get("/health").status_code == 200
            text = http.get("/metrics").text
    assert not busy, f"leaked: {busy} still non-zero after every client left ({gauges})"
    kept = [(i, r) for i, r in enumerate(records) if i not in hang_ups]
    failed = [(i, r.error) for i, r in kept if not r.success]
    assert not failed, f"requests that were not abandoned failed: {failed[:3]}"
    for i, record in kept:
        assert record.num_output_tokens == requests[i].output_len == len(record.chunk_times)
    assert gauges["infer:request_success_total"] >= len(kept)
    assert 'finished_reason="abort"' in text, "no hang-up reached the engine as an abort"
    assert time.monotonic() - started < LIMIT_S
