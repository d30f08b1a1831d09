"""Requests that arrive over time, served in real time, measured like `vllm bench serve`.

Arrival schedules are vLLM's: requests at a rate (per second) with gaps drawn from a gamma
distribution whose shape is the `burstiness` (1.0 is a Poisson process; lower is burstier, higher
more regular; rate inf sends everything at once), and optionally at most `max_concurrency`
requests in flight, a new one sent when one finishes. The engine runs in this thread: between
steps, every request whose time has come is added. Each request's send time is when it was
added, and each token's time when the step that made it ended (the step ends by copying the
tokens to the host, so the device is synchronized). The records are week 03's RequestRecords, so
`infer.metrics.calculate_metrics` applies unchanged.
"""

import math
import time
from collections import deque
from typing import Sequence as Seq

import numpy as np

from infer.engine.engine import Engine
from infer.engine.sequence import SamplingParams
from infer.records import RequestRecord


def arrival_offsets(num_requests: int, request_rate: float = math.inf, burstiness: float = 1.0,
                    seed: int = 0) -> list[float]:
    """Send times in seconds from the start: gamma-distributed gaps with mean 1/request_rate."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 requests/s (inf: all at once), got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (1.0 is Poisson), got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    gaps[0] = 0.0  # the first request starts the clock
    return np.cumsum(gaps).tolist()


def replay(engine: Engine, prompts: Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams], *,
           offsets: Seq[float] | None = None, max_concurrency: int | None = None,
           progress=None) -> list[RequestRecord]:
    """Serve `prompts` arriving at `offsets` (seconds; default all at once) with at most
    `max_concurrency` in flight. Returns one RequestRecord per prompt, in input order."""
    params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    offsets = [0.0] * len(prompts) if offsets is None else list(offsets)
    if not len(prompts) == len(params_list) == len(offsets):
        raise ValueError(f"{len(prompts)} prompts, {len(params_list)} SamplingParams and {len(offsets)} offsets: "
                         f"give one of each per prompt")
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
    limit = max_concurrency or len(prompts)
    due = deque(sorted(range(len(prompts)), key=lambda i: offsets[i]))
    records: dict[int, RequestRecord] = {}
    in_flight: dict[str, int] = {}  # engine request id -> prompt index
    start = time.perf_counter()
    while due or in_flight:
        now = time.perf_counter()
        while due and len(in_flight) < limit and start + offsets[due[0]] <= now:
            index = due.popleft()
            request_id = engine.add_request(prompts[index], params_list[index], arrival_time=now)
            in_flight[request_id] = index
            records[index] = RequestRecord(len(prompts[index]), send_time=now)
        if not in_flight:  # idle until the next arrival
            time.sleep(max(0.0, start + offsets[due[0]] - time.perf_counter()))
            continue
        outputs = engine.step()
        done = time.perf_counter()
        for out in outputs:
            index = in_flight[out.request_id]
            records[index].chunk_times.append(done)
            if out.finished:
                del in_flight[out.request_id]
                if progress is not None:
                    progress.update(1)
    return [records[i] for i in range(len(prompts))]
