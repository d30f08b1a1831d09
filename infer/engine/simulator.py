"""The engine without the model: the same scheduler and policies, a virtual clock, and a step-cost
model in place of the forward pass.

Each simulated step asks the real `Scheduler` for its work, charges the clock what the cost model
says that step's shape costs (infer.engine.step_costs), and hands back a placeholder token for
every row that samples, so requests finish after exactly their `max_tokens`. Arrivals, the
concurrency limit and the records are those of `infer.engine.replay`: the output is week 03
RequestRecords (times in virtual seconds), so `infer.metrics.calculate_metrics` applies unchanged.

Token values never matter to a schedule with EOS ignored, so nothing here needs weights, a
device or time: a grid that takes a GPU hours runs in seconds. What it cannot know is anything
its cost model leaves out (memory limits, a slow kernel, a busy host); hence the validation
against the real engine, and the SIMULATED stamp on everything it produces.
"""

import math
from collections import deque
from dataclasses import dataclass
from typing import Sequence as Seq

from infer.engine.kv_store import SlotKVStore
from infer.engine.scheduler import Limits, Policy, Scheduler, make_policy
from infer.engine.sequence import SamplingParams, Sequence
from infer.engine.step_costs import StepTrace, step_shape, trace_items
from infer.records import RequestRecord

PLACEHOLDER_TOKEN = 0


@dataclass
class SimulatedRun:
    records: list[RequestRecord]  # in input order, times in virtual seconds from 0
    steps: list[StepTrace]


def simulate(cost_model, prompt_lens: Seq[int], output_lens: Seq[int], *, policy: str | Policy = "chunked",
             max_num_seqs: int = 32, max_num_batched_tokens: int = 2048, max_model_len: int = 2048,
             offsets: Seq[float] | None = None, max_concurrency: int | None = None) -> SimulatedRun:
    """Serve requests (prompt and output lengths, arrival `offsets` in seconds, default all at
    once) on a virtual clock that each step advances by `cost_model.step_ms(shape)`."""
    if len(prompt_lens) != len(output_lens):
        raise ValueError(f"{len(prompt_lens)} prompt lengths and {len(output_lens)} output lengths: give one of each per request")
    offsets = [0.0] * len(prompt_lens) if offsets is None else list(offsets)
    if len(offsets) != len(prompt_lens):
        raise ValueError(f"{len(offsets)} offsets for {len(prompt_lens)} requests")
    for n_in, n_out in zip(prompt_lens, output_lens):
        if n_in < 1 or n_out < 1 or n_in + n_out > max_model_len:
            raise ValueError(f"a request of {n_in} prompt + {n_out} output tokens does not fit: each needs >= 1 and "
                             f"their sum <= max_model_len={max_model_len}")
    policy = make_policy(policy) if isinstance(policy, str) else policy
    scheduler = Scheduler(policy, Limits(max_num_seqs, max_num_batched_tokens), SlotKVStore(max_num_seqs, max_model_len),
                          set(), max_model_len)
    if not scheduler.policy.splits_prompts and max(prompt_lens) > max_num_batched_tokens:
        raise ValueError(f"policy {scheduler.policy.name!r} prefills whole prompts, and {max(prompt_lens)} tokens exceed "
                         f"max_num_batched_tokens={max_num_batched_tokens}")
    limit = max_concurrency or len(prompt_lens)
    due = deque(sorted(range(len(prompt_lens)), key=lambda i: offsets[i]))
    records: dict[int, RequestRecord] = {}
    in_flight: dict[str, int] = {}
    steps: list[StepTrace] = []
    clock = 0.0
    while due or in_flight:
        while due and len(in_flight) < limit and offsets[due[0]] <= clock:
            index = due.popleft()
            params = SamplingParams(max_tokens=output_lens[index], temperature=0.0, ignore_eos=True)
            scheduler.add(Sequence(str(index), [PLACEHOLDER_TOKEN] * prompt_lens[index], params, clock))
            in_flight[str(index)] = index
            records[index] = RequestRecord(prompt_lens[index], send_time=clock)
        if not in_flight:
            clock = max(clock, offsets[due[0]])
            continue
        work = scheduler.schedule()
        if not work:  # a policy that schedules nothing would wait forever, unless a new request can change its mind
            if not due or len(in_flight) >= limit:
                raise RuntimeError(f"policy {policy.name!r} scheduled no work with {len(in_flight)} requests "
                                   f"unfinished and no arrival to come: the run would never end")
            clock = max(clock, offsets[due[0]])
            continue
        shape = step_shape(work)
        start, clock = clock, clock + cost_model.step_ms(shape) / 1e3
        steps.append(StepTrace(start, clock, shape, trace_items(work)))
        num_sampled = sum(item.samples for item in work)
        for out in scheduler.update(work, [PLACEHOLDER_TOKEN] * num_sampled):
            records[in_flight[out.request_id]].chunk_times.append(clock)
            if out.finished:
                del in_flight[out.request_id]
    if not math.isfinite(clock):
        raise ValueError("the cost model returned a non-finite step time")
    return SimulatedRun([records[i] for i in range(len(prompt_lens))], steps)
