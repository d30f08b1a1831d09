"""A bounded soak of the course server on 127.0.0.1: 64 streams at concurrency 32, a quarter of
the clients hanging up mid-stream, on the default store and on a paged pool small enough to
preempt, with prefix caching over shared system prompts. No request gets a 5xx; every request that
was not abandoned completes with all its tokens; the abort counter equals the hang-ups; afterwards
/metrics shows nothing running, waiting, held or open (no request or block leaked), and a new
request is served. It runs in the serial phase of `make test`, alone: its clients give up after
LIMIT_S, which a busy machine could reach."""

import asyncio
import random
import time

import httpx
import pytest

from infer.serve.client import BenchRequest, completion_payload, stream_record, workload_for_model
from infer.serve.metrics import metric_samples, read_metrics
from infer.serve.server import EngineSettings, start_server

pytestmark = pytest.mark.serial

STREAMS = 32
REQUESTS = 64
OUTPUT_LEN = 32
# A client that leaves after a few chunks leaves its request far from done, so the server must abort
# it: with a short answer the engine could finish it before the disconnect reached the server.
HANG_UP_OUTPUT_LEN = 192
LIMIT_S = 60.0  # the clients give up after this: a hung server fails the test instead of stalling it
SETTINGS = {
    # 32 streams > 16 slots: some wait
    "slots": EngineSettings(max_num_seqs=16, max_num_batched_tokens=1024, max_model_len=512),
    # 16 sequences of up to 264 tokens want up to 272 blocks of 16; 48 make them preempt
    "small paged pool": EngineSettings(
        policy="continuous",
        max_num_seqs=16,
        max_num_batched_tokens=256,
        max_model_len=512,
        kv_store="paged",
        num_kv_blocks=48,
        enable_prefix_caching=True,
    ),
}


async def one_client(client, url: str, payload: dict, hang_up_after: int | None):
    """Stream one completion; hang up after `hang_up_after` chunks (None: read to the end)."""
    send_time, events, chunks = time.perf_counter(), [], 0
    async with client.stream("POST", url, json=payload) as response:
        assert response.status_code == 200, f"HTTP {response.status_code}: {await response.aread()}"
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


def workload(tiny, rng: random.Random) -> list[BenchRequest]:
    """vLLM's random prompts, half of them after one of two shared system prompts (prefix caching's case)."""
    requests = workload_for_model(tiny.config, REQUESTS, 48, OUTPUT_LEN, range_ratio=0.5, seed=5)
    system_prompts = [[rng.randrange(10, 200) for _ in range(24)] for _ in range(2)]
    return [
        BenchRequest(system_prompts[i % 2] + r.prompt_ids[:48], r.output_len) if i % 4 < 2 else r
        for i, r in enumerate(requests)
    ]


def leftovers(http: httpx.Client) -> tuple[list[str], dict]:
    """The gauges that are not back to 0 within 10 s of the last client leaving."""
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
            return busy, gauges
        time.sleep(0.05)


@pytest.mark.parametrize("store", SETTINGS)
def test_streams_with_disconnects_leave_no_failure_and_no_leaked_request_or_block(tiny, store):
    rng = random.Random(0)
    requests = workload(tiny, rng)
    hang_ups = {i: rng.randint(1, 4) for i in rng.sample(range(REQUESTS), REQUESTS // 4)}
    requests = [BenchRequest(r.prompt_ids, HANG_UP_OUTPUT_LEN) if i in hang_ups else r for i, r in enumerate(requests)]
    with start_server(tiny, SETTINGS[store]) as server:
        records = asyncio.run(load(server.url, requests, hang_ups))
        with httpx.Client(base_url=server.url, timeout=10) as http:
            busy, gauges = leftovers(http)
            aborts = sum(
                value
                for name, labels, value in metric_samples(http.get("/metrics").text)
                if name == "infer:request_success_total" and labels["finished_reason"] == "abort"
            )
            over_limit = http.post("/v1/completions", json={"prompt": [5] * 400, "max_tokens": 200})
            after = http.post("/v1/completions", json={"prompt": [5] * 16, "max_tokens": 8, "ignore_eos": True})
            assert http.get("/health").status_code == 200
    assert not busy, f"leaked: {busy} still non-zero after every client left ({gauges})"
    kept = [(i, r) for i, r in enumerate(records) if i not in hang_ups]
    failed = [(i, r.error) for i, r in kept if not r.success]
    assert not failed, f"requests that were not abandoned failed: {failed[:3]}"
    for i, record in kept:
        assert record.num_output_tokens == requests[i].output_len == len(record.chunk_times)
    assert gauges["infer:request_success_total"] == REQUESTS, "every request ends once: finished or aborted"
    assert aborts == len(hang_ups), f"{len(hang_ups)} clients hung up mid-stream, the server counted {aborts} aborts"
    if store == "small paged pool":
        assert gauges["infer:num_preemptions_total"] > 0, "the pool was meant to be small enough to preempt"
        assert gauges["infer:prefix_cache_hit_rate"] > 0, "the shared system prompts were never found in the cache"
    assert over_limit.status_code == 400 and "context length" in over_limit.json()["error"]["message"]
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 8
