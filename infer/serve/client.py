"""A streaming benchmark client for any OpenAI-compatible server: what `vllm bench serve` does
with `--backend openai --dataset-name random`, written so that it can be read.

- The workload is vLLM's random dataset (the same lengths, offsets and token sequences for the
  same seed), but sent as token ids, so that every prompt is exactly as long as it says. vLLM
  decodes its ids to text and the server encodes them again, which can change the count.
- Requests leave at `request_rate` per second as vLLM schedules them (infer.workloads.arrival_offsets:
  gamma gaps, `burstiness` 1 a Poisson process), or all at once for an infinite rate;
  `max_concurrency` caps the requests in flight. A request's clock starts when it is actually sent, after it got a slot.
- One warm-up request runs first (`num_warmups`, as vLLM's --num-warmups) and must succeed, or
  the run stops with the server's reason.
- Each stream becomes an infer.records.RequestRecord (stream_record), and week 03's
  infer.metrics.calculate_metrics turns the records into vLLM's result keys.
"""

import asyncio
import json
import math
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from infer.metrics import calculate_metrics
from infer.records import RequestRecord
from infer.workloads import arrival_offsets

COMPLETIONS_PATH = "/v1/completions"
CLIENT_TIMEOUT_S = 6 * 3600  # vLLM's client waits this long too: a slow server is measured, not cut off


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    output_len: int


def random_workload(
    vocab_size: int,
    special_ids,
    num_prompts: int,
    input_len: int,
    output_len: int,
    *,
    range_ratio: float = 0.0,
    seed: int = 0,
) -> list[BenchRequest]:
    """vLLM's random dataset as token ids: lengths uniform in [len x (1 - r), len x (1 + r)],
    and each prompt a run of consecutive allowed ids from a random offset (vllm.benchmarks.datasets)."""
    if num_prompts < 1 or input_len < 1 or output_len < 1:
        raise ValueError(
            f"num_prompts, input_len and output_len must be >= 1, got {num_prompts}, {input_len}, {output_len}"
        )
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must lie in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(
        math.floor(input_len * (1 - range_ratio)), math.ceil(input_len * (1 + range_ratio)) + 1, size=num_prompts
    )
    output_lens = rng.integers(
        max(1, math.floor(output_len * (1 - range_ratio))),
        max(1, math.ceil(output_len * (1 + range_ratio))) + 1,
        size=num_prompts,
    )
    offsets = rng.integers(0, vocab_size, size=num_prompts)
    allowed = np.array(sorted(set(range(vocab_size)) - set(special_ids)))
    return [
        BenchRequest(
            allowed[(offsets[i] + i + np.arange(max(1, input_lens[i]))) % len(allowed)].tolist(), int(output_lens[i])
        )
        for i in range(num_prompts)
    ]


def workload_for_model(config, num_prompts: int, input_len: int, output_len: int, **kwargs) -> list[BenchRequest]:
    """random_workload for a `transformers` config: its vocabulary, without its special tokens."""
    special = [getattr(config, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")]
    return random_workload(
        config.vocab_size, [i for i in special if i is not None], num_prompts, input_len, output_len, **kwargs
    )


# ---------------------------------------------------------------- one stream


def parse_sse_line(line: str) -> dict | None:
    """The JSON of one server-sent-event line, or None for what carries no data: blank lines,
    comments (": ping"), other fields, and the final `data: [DONE]`."""
    if not line.startswith("data:"):
        return None
    payload = line[len("data:") :].strip()
    if payload == "[DONE]":
        return None
    return json.loads(payload)


def stream_record(prompt_len: int, send_time: float, events: list[tuple[float, str]]) -> RequestRecord:
    """A RequestRecord from a completion stream: `events` are (arrival time, SSE line) in order.

    As in vLLM's client, every message with a non-empty `choices` list is one output chunk (its
    text may be empty, e.g. for a special token), and the usage message (empty `choices`) gives
    the output token count. A stream without any chunk is a failed request."""
    record = RequestRecord(prompt_len=prompt_len, send_time=send_time)
    for arrival, line in events:
        message = parse_sse_line(line)
        if message is None:
            continue
        if "error" in message:
            error = message["error"]
            record.error = error.get("message", str(error)) if isinstance(error, dict) else str(error)
            record.end_time = arrival
            break
        if message.get("choices"):
            record.chunk_times.append(arrival)
        elif message.get("usage"):
            record.output_tokens = message["usage"].get("completion_tokens")
    if not record.chunk_times and record.error is None:
        record.error = "the stream carried no output chunk"
        record.end_time = events[-1][0] if events else send_time
    return record


def completion_payload(model: str, request: BenchRequest, ignore_eos: bool) -> dict:
    """The body `vllm bench serve` sends to /v1/completions, with the prompt as token ids."""
    return {
        "model": model,
        "prompt": request.prompt_ids,
        "max_tokens": request.output_len,
        "temperature": 0.0,
        "repetition_penalty": 1.0,
        "logprobs": None,
        "ignore_eos": ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def send_request(client, url: str, model: str, request: BenchRequest, ignore_eos: bool) -> RequestRecord:
    """Stream one completion; any failure (refused, HTTP error, broken stream) is a failed record."""
    prompt_len = len(request.prompt_ids)
    send_time = time.perf_counter()
    events: list[tuple[float, str]] = []
    try:
        async with client.stream("POST", url, json=completion_payload(model, request, ignore_eos)) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                return RequestRecord(
                    prompt_len,
                    send_time,
                    error=f"HTTP {response.status_code}: {body[:500]}",
                    end_time=time.perf_counter(),
                )
            async for line in response.aiter_lines():
                events.append((time.perf_counter(), line))  # the clock first, the parsing later
    except Exception as exc:  # noqa: BLE001 - a benchmark counts failures instead of stopping
        return RequestRecord(prompt_len, send_time, error=f"{type(exc).__name__}: {exc}", end_time=time.perf_counter())
    return stream_record(prompt_len, send_time, events)


# ---------------------------------------------------------------- a benchmark run


async def run_benchmark_async(
    base_url: str,
    model: str,
    requests: list[BenchRequest],
    *,
    request_rate: float = math.inf,
    burstiness: float = 1.0,
    max_concurrency: int | None = None,
    ignore_eos: bool = True,
    seed: int = 0,
    slo_ms: dict | None = None,
    progress: bool = True,
    num_warmups: int = 1,
) -> tuple[dict, list[RequestRecord]]:
    import httpx
    from tqdm.auto import tqdm

    if not requests:
        raise ValueError("no requests to send")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 (or None: no cap), got {max_concurrency}")
    url = base_url.rstrip("/") + COMPLETIONS_PATH
    offsets = arrival_offsets(len(requests), request_rate, burstiness, seed)
    limits = httpx.Limits(max_connections=max_concurrency or len(requests), max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(CLIENT_TIMEOUT_S), limits=limits) as client:
        for _ in range(num_warmups):  # untimed, as vLLM's --num-warmups
            warmup = await send_request(client, url, model, requests[0], ignore_eos)
            if not warmup.success:
                raise RuntimeError(f"the warm-up request to {url} failed: {warmup.error}")

        slots = asyncio.Semaphore(max_concurrency or len(requests))
        bar = tqdm(total=len(requests), desc=f"requests to {base_url}", disable=not progress)

        async def one(request: BenchRequest, offset: float) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            async with slots:
                record = await send_request(client, url, model, request, ignore_eos)
            bar.update(1)
            return record

        start = time.perf_counter()
        records = await asyncio.gather(*(one(r, o) for r, o in zip(requests, offsets)))
        duration_s = time.perf_counter() - start  # the wall clock, as vLLM's duration
        bar.close()
    settings = {
        "backend": "openai",
        "base_url": base_url,
        "model_id": model,
        "num_prompts": len(requests),
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
        "ignore_eos": ignore_eos,
        "num_warmups": 1,
    }
    return {
        **settings,
        **calculate_metrics(records, slo_ms=slo_ms, duration_s=duration_s),
        **detailed_fields(records),
    }, list(records)


def detailed_fields(records: list[RequestRecord]) -> dict:
    """vLLM's per-request lists (its --save-detailed keys), times in seconds."""
    return {
        "input_lens": [r.prompt_len for r in records],
        "output_lens": [r.num_output_tokens for r in records],
        "ttfts": [r.chunk_times[0] - r.send_time if r.success else 0.0 for r in records],
        "itls": [[b - a for a, b in zip(r.chunk_times, r.chunk_times[1:])] for r in records],
        "latencies": [r.finish_time - r.send_time for r in records],
        "errors": [r.error or "" for r in records],
    }


def run_benchmark(
    base_url: str, model: str, requests: list[BenchRequest], **kwargs
) -> tuple[dict, list[RequestRecord]]:
    """run_benchmark_async from ordinary code, including a notebook (whose event loop is already
    running: the run then gets a fresh loop in a worker thread)."""
    coroutine = run_benchmark_async(base_url, model, requests, **kwargs)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def run_benchmark_in_own_process(
    base_url: str, model: str, requests: list[BenchRequest], **kwargs
) -> tuple[dict, list[RequestRecord]]:
    """run_benchmark in a fresh process, as `vllm bench serve` runs. A client that shares its
    interpreter with other work (a test worker, a notebook's kernel) reads its chunks late when
    that work holds the CPU, and every late chunk adds to the TPOT it reports."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(run_benchmark, base_url, model, requests, **kwargs).result()
