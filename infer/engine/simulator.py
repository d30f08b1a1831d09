"""The engine without the model: the same scheduler, policies and step records, with the forward
pass replaced by a step-cost model and the wall clock by a virtual one.

`SimulatedEngine` is an `Engine` whose runner charges the virtual clock what each step's shape
costs (infer.engine.step_costs) and samples a placeholder token for every row that samples, so
requests finish after exactly their `max_tokens`. `simulate` serves requests on it through the
engine's own arrival loop (infer.engine.replay), so its output is week 03's RequestRecords (times
in virtual seconds) and `infer.metrics.calculate_metrics` applies unchanged.

Token values never matter to a schedule with EOS ignored, so nothing here needs weights, a
device or time: a grid that takes a GPU hours runs in seconds. The KV store is the engine's own,
slots or blocks (week 08), keeping its books without a cache tensor: a small block pool preempts
here as it does in the engine. Prefix caching is left out: every simulated token is the same
placeholder, so every prompt would look like a cached prefix of every other. What the simulator
cannot know is anything its cost model leaves out (memory beyond the KV store it is given, a slow
kernel, a busy host); hence the validation against the real engine, and the SIMULATED stamp on
everything it produces.

`run_trace` is the simulator with a clock that counts steps: a scripted trace of arrivals, one
step per virtual second, and who ran in which slot at every step (week 05's "scheduler on paper").
"""

import math
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from infer.engine.clock import VirtualClock
from infer.engine.engine import Engine
from infer.engine.kv_store import SlotKVStore
from infer.engine.paged_kv_store import PagedKVStore, blocks_like_slots
from infer.engine.replay import replay
from infer.engine.sampler import Sampler
from infer.engine.scheduler import Limits, Policy, Work
from infer.engine.sequence import benchmark_params
from infer.engine.step_costs import FixedStepCost
from infer.engine.step_record import StepRecord, StepShape, step_items
from infer.records import RequestRecord

PLACEHOLDER_TOKEN = 0


class CostModelRunner:
    """Stands in for the model runner: a step takes what its shape costs, on the virtual clock."""

    def __init__(self, cost_model, clock: VirtualClock):
        self.cost_model, self.clock = cost_model, clock
        self.num_forwards = 0

    def forward(self, work: list[Work]) -> None:
        step_ms = self.cost_model.step_ms(StepShape.of(step_items(work)))
        if not (math.isfinite(step_ms) and step_ms >= 0):
            raise ValueError(f"the cost model returned {step_ms} ms for a step: a step costs a finite time >= 0")
        self.clock.advance(step_ms / 1e3)
        self.num_forwards += 1

    def sample(self, work: list[Work], logits: None) -> list[list[int]]:
        return [[PLACEHOLDER_TOKEN] for item in work if item.samples]


class SimulatedEngine(Engine):
    def __init__(
        self,
        cost_model,
        policy: str | Policy = "chunked",
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 2048,
        *,
        kv_store: str = "slots",
        num_kv_blocks: int | None = None,
        block_size: int = 16,
    ):
        """kv_store, num_kv_blocks, block_size: as `Engine`'s (blocks: by default as much memory as the slots)."""
        if kv_store == "slots":
            store = SlotKVStore(max_num_seqs, max_model_len)
        elif kv_store == "paged":
            num_kv_blocks = num_kv_blocks or blocks_like_slots(max_num_seqs, max_model_len, block_size)
            store = PagedKVStore(num_kv_blocks, block_size)
        else:
            raise ValueError(f"unknown kv_store {kv_store!r}; valid: 'slots', 'paged'")
        clock = VirtualClock()
        self.assemble(
            policy,
            Limits(max_num_seqs, max_num_batched_tokens),
            max_model_len,
            store,
            Sampler("cpu"),
            CostModelRunner(cost_model, clock),
            eos_ids=set(),
            vocab_size=PLACEHOLDER_TOKEN + 1,
            clock=clock,
            log_steps=True,
        )


@dataclass
class SimulatedRun:
    records: list[RequestRecord]  # in input order, times in virtual seconds from 0
    steps: list[StepRecord]
    num_preemptions: int


def simulate(
    cost_model,
    prompt_lens: Seq[int],
    output_lens: Seq[int],
    *,
    policy: str | Policy = "chunked",
    max_num_seqs: int = 32,
    max_num_batched_tokens: int = 2048,
    max_model_len: int = 2048,
    offsets: Seq[float] | None = None,
    max_concurrency: int | None = None,
    kv_store: str = "slots",
    num_kv_blocks: int | None = None,
    block_size: int = 16,
) -> SimulatedRun:
    """Serve requests (prompt and output lengths, arrival `offsets` in seconds, default all at
    once) on a virtual clock that each step advances by `cost_model.step_ms(shape)`, with the KV
    store `kv_store` ("slots", or "paged": `num_kv_blocks` of `block_size`)."""
    if len(prompt_lens) != len(output_lens):
        raise ValueError(
            f"{len(prompt_lens)} prompt lengths and {len(output_lens)} output lengths: give one of each per request"
        )
    engine = SimulatedEngine(
        cost_model,
        policy,
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len,
        kv_store=kv_store,
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
    )
    records = replay(
        engine,
        [[PLACEHOLDER_TOKEN] * n for n in prompt_lens],
        [benchmark_params(n) for n in output_lens],
        offsets=offsets,
        max_concurrency=max_concurrency,
    )
    return SimulatedRun(records, engine.step_log, engine.num_preemptions)


# ---------------------------------------------------------------- a scheduler on paper


@dataclass(frozen=True)
class TraceRequest:
    arrival_step: int  # it joins the waiting queue just before this step
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class TraceRun:
    steps: list[StepRecord]  # one per step, idle steps (nobody to run) included
    first_token_step: list[int]  # per request
    finish_step: list[int]
    max_num_seqs: int

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def idle_slot_steps(self) -> int:
        """Slot-steps in which a slot held no request at all."""
        return sum(self.max_num_seqs - step.num_running for step in self.steps)

    def batches(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each step's kind and the requests (trace indices) it ran, in batch order."""
        return [(step.kind, tuple(int(r) for r in step.request_ids)) for step in self.steps]

    def occupancy(self) -> list[list[int]]:
        """[slot][step]: the request computed in that slot at that step, or -1."""
        grid = [[-1] * self.num_steps for _ in range(self.max_num_seqs)]
        for index, step in enumerate(self.steps):
            for item in step.items:
                grid[item.slot][index] = int(item.request_id)
        return grid


STEP = FixedStepCost(ms=1000.0)  # one virtual second per step: times are step numbers


def run_trace(
    trace: list[TraceRequest], policy: str | Policy, max_num_seqs: int, max_num_batched_tokens: int
) -> TraceRun:
    """Step the scheduler over `trace` until every request has finished."""
    engine = SimulatedEngine(
        STEP,
        policy,
        max_num_seqs,
        max_num_batched_tokens,
        max_model_len=max(r.prompt_len + r.output_len for r in trace),
    )
    records = replay(
        engine,
        [[PLACEHOLDER_TOKEN] * r.prompt_len for r in trace],
        [benchmark_params(r.output_len) for r in trace],
        offsets=[r.arrival_step for r in trace],
    )
    ran = {round(step.start): step for step in engine.step_log}
    steps = [ran.get(t) or StepRecord(t, t, t + 1, (), 0) for t in range(round(engine.clock.now()))]
    step_of = lambda t: round(t) - 1  # noqa: E731 - a token's time is the end of the step that made it
    return TraceRun(
        steps, [step_of(r.chunk_times[0]) for r in records], [step_of(r.chunk_times[-1]) for r in records], max_num_seqs
    )
