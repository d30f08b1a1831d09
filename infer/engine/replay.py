"""Requests that arrive over time, served step by step, measured like `vllm bench serve`.

Arrival times are offsets in seconds from the start (infer.workloads.arrival_offsets draws them
as vLLM does); at most `max_concurrency` requests are in flight, a new one sent when one
finishes. The engine runs in this thread: between steps, every request whose time has come is
added. Each request's send time is when it was added, and each token's time when the step that
made it ended (the step ends by copying the tokens to the host, so the device is synchronized).
The records are week 03's RequestRecords, so `infer.metrics.calculate_metrics` applies unchanged.

Time is the engine's clock: the wall clock for the real engine, a virtual one for the simulator
(infer.engine.simulator), which serves through this same loop.
"""

from collections import deque
from collections.abc import Sequence as Seq

from infer.engine.engine import Engine
from infer.engine.sequence import SamplingParams
from infer.records import RequestRecord


def replay(
    engine: Engine,
    prompts: Seq[Seq[int]],
    params: SamplingParams | Seq[SamplingParams],
    *,
    offsets: Seq[float] | None = None,
    max_concurrency: int | None = None,
    progress=None,
) -> list[RequestRecord]:
    """Serve `prompts` arriving at `offsets` (seconds; default all at once) with at most
    `max_concurrency` in flight, on an engine with nothing unfinished (request i gets the id
    str(i)). Returns one RequestRecord per prompt, in input order."""
    params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
    offsets = [0.0] * len(prompts) if offsets is None else list(offsets)
    if not len(prompts) == len(params_list) == len(offsets):
        raise ValueError(
            f"{len(prompts)} prompts, {len(params_list)} SamplingParams and {len(offsets)} offsets: "
            f"give one of each per prompt"
        )
    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 or None, got {max_concurrency}")
    limit = max_concurrency or len(prompts)
    clock = engine.clock
    due = deque(sorted(range(len(prompts)), key=lambda i: offsets[i]))
    records: dict[int, RequestRecord] = {}
    in_flight: set[int] = set()
    start = clock.now()
    while due or in_flight:
        now = clock.now()
        while due and len(in_flight) < limit and start + offsets[due[0]] <= now:
            index = due.popleft()
            engine.add_request(prompts[index], params_list[index], request_id=str(index), arrival_time=now)
            in_flight.add(index)
            records[index] = RequestRecord(len(prompts[index]), send_time=now)
        steps_before = engine.num_steps
        outputs = engine.step() if in_flight else []
        if engine.num_steps == steps_before:  # nothing could run: wait for the next arrival, if one can come
            if not due or len(in_flight) >= limit:
                raise RuntimeError(
                    f"policy {engine.policy.name!r} scheduled no work with {len(in_flight)} requests "
                    f"unfinished and no arrival to come: the run would never end"
                )
            clock.wait_until(start + offsets[due[0]])
            continue
        done = clock.now()
        for out in outputs:
            index = int(out.request_id)
            records[index].chunk_times.append(done)
            if out.finished:
                in_flight.discard(index)
                if progress is not None:
                    progress.update(1)
    return [records[i] for i in range(len(prompts))]
