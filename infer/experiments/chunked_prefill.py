"""Week 06's experiments: decode stalls under prefill-first scheduling, mixed steps, token-budget
sweeps with goodput, and the simulator checked against the engine.

Every experiment runs the real engine (infer.engine) through `replay` with its step log on, so
that each run yields both vLLM-style request records and a record of its steps (shape, time,
each request's part): the Gantt charts and the simulator's calibration data come from the same
runs as the metrics. The heavy measurements run once, as
`python -m infer.experiments.chunked_prefill_run`, which writes results/06_*.json; the notebooks read those.
"""

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass

import torch

from infer.engine import Engine
from infer.engine.replay import replay
from infer.engine.sequence import benchmark_params
from infer.engine.step_costs import step_kind
from infer.engine.step_record import StepRecord
from infer.kv_cache import KVCache
from infer.metrics import calculate_metrics
from infer.paged_attention import PagedKV
from infer.records import RequestRecord
from infer.timing import benchmark
from infer.workloads import Workload, random_prompt

PERCENTILES = (50, 90, 99)


def stall_workload(
    decode_step_s: float,
    prefill_s: float,
    vocab_size: int,
    *,
    num_decoding: int = 24,
    long_prompt_lens: tuple[int, ...] = (1024, 1344, 1664, 1984),
    seed: int = 0,
) -> Workload:
    """`num_decoding` short requests start together and decode 192 tokens each; long prompts
    arrive one by one while they decode, 30 decode steps apart plus room for the previous
    prefill, so that each stall is its own event. Times are in units of this machine's
    `decode_step_s` and `prefill_s` (the longest prompt's prefill), so that the prompts land
    mid-decode on a fast machine and a slow one alike; the last one arrives some 100 decode
    steps in, so the decodes outlast it even when the machine runs twice as fast as measured."""
    rng = random.Random(seed)
    short = [random_prompt(rng, rng.randint(32, 64), vocab_size) for _ in range(num_decoding)]
    long = [random_prompt(rng, n, vocab_size) for n in long_prompt_lens]
    offsets = [0.0] * num_decoding + [(i + 1) * prefill_s + (10 + 30 * i) * decode_step_s for i in range(len(long))]
    return Workload("stalls", short + long, [192] * num_decoding + [32] * len(long), offsets)


@dataclass
class Run:
    """One workload served by the real engine: its records, its steps and vLLM's metrics."""

    policy: str
    budget: int
    workload: Workload
    records: list[RequestRecord]
    steps: list[StepRecord]

    def metrics(self, slo_ms: dict[str, float] | None = None) -> dict:
        return calculate_metrics(self.records, slo_ms=slo_ms, percentiles=PERCENTILES)


def serve(
    model,
    workload: Workload,
    policy: str,
    budget: int,
    *,
    max_num_seqs: int = 32,
    max_model_len: int = 2048,
    max_concurrency: int | None = None,
) -> Run:
    """Replay `workload` on a fresh engine in real time (at most `max_concurrency` requests in
    flight, a new one sent when one finishes); greedy, EOS ignored."""
    engine = Engine(
        model,
        policy=policy,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        log_steps=True,
    )
    records = replay(
        engine,
        workload.prompts,
        [benchmark_params(n) for n in workload.output_lens],
        offsets=workload.offsets,
        max_concurrency=max_concurrency,
    )
    # each step's time as the engine logs it (scheduling and bookkeeping included, not only the
    # forward pass): that is what the requests wait for, so it is what the simulator must charge
    return Run(policy, budget, workload, records, engine.step_log)


def median_step_s(model, batch: int, context: int, vocab_size: int) -> tuple[float, float]:
    """How long, here, one prefill of `batch` prompts of `context` tokens takes, and one decode
    step of those `batch` sequences after it: the stall workload's time units."""
    rng = random.Random(1)
    prompts = [random_prompt(rng, context, vocab_size) for _ in range(batch)]
    params = benchmark_params(64)
    prefill, decode = [], []
    for _ in range(3):
        engine = Engine(
            model,
            policy="chunked",
            max_num_seqs=batch,
            max_num_batched_tokens=batch * context,
            max_model_len=context + 64,
        )
        for prompt in prompts:
            engine.add_request(prompt, params)
        prefill.append(benchmark(engine.step, warmup=0, repeats=1).median_ms)
        decode.append(benchmark(engine.step, warmup=1, repeats=3).median_ms)
    return sorted(prefill)[1] / 1e3, sorted(decode)[1] / 1e3


def summarize_run(run: Run, slo_ms: dict[str, float] | None = None) -> dict:
    """vLLM's keys for a run, plus what it was."""
    return {
        "policy": run.policy,
        "max_num_batched_tokens": run.budget,
        "workload": run.workload.name,
        "num_steps": len(run.steps),
        **run.metrics(slo_ms),
    }


def stall_demo(engine: Engine, short_prompts: list[list[int]], long_prompt: list[int], *, steps_before: int = 4):
    """The lecture's live stall: the short prompts start together and decode 24 tokens each; after
    `steps_before` steps a long prompt arrives and asks for 8. Any engine that logs its steps runs
    it, the real one or the simulator (infer.engine.simulator.SimulatedEngine), so that the two
    schedules can be compared step by step. Returns the step log."""
    for prompt in short_prompts:
        engine.add_request(prompt, benchmark_params(24))
    for _ in range(steps_before):
        engine.step()
    engine.add_request(long_prompt, benchmark_params(8), request_id="long")
    while engine.has_unfinished():
        engine.step()
    return engine.step_log


def stall_step_times(steps: list[StepRecord], long_id: str = "long") -> dict:
    """What the lecture compares in the demo: the steps that ran a chunk of the long prompt (how
    many, their median and longest ms) and the median decode-only step."""
    long = [s.ms for s in steps if any(i.request_id == long_id and i.prefill for i in s.items)]
    decode = [s.ms for s in steps if step_kind(s.shape) == "decode"]
    return {
        "long_steps": len(long),
        "long_median_ms": statistics.median(long),
        "long_max_ms": max(long),
        "decode_median_ms": statistics.median(decode),
    }


# ------------------------------------------------------------ mixing prefill and decode in one step


@torch.no_grad()
def time_step_kinds(model, num_tokens: int, context: int, *, repeats: int = 15) -> dict[str, float]:
    """Median ms of three forward passes of `num_tokens` rows each: a prefill chunk alone, decodes
    alone (one row per sequence, each at `context` tokens of cache), and half of each mixed, plus
    the two half-size steps run apart. Each kind is timed in turn, round after round, so that a
    busy machine slows all of them alike."""
    half = num_tokens // 2
    cache = KVCache.for_model(model, num_tokens + 1, context + num_tokens + 1)
    device = model.embed.weight.device
    prompt = torch.randint(model.arch.vocab_size, (context,), device=device)
    for slot in range(num_tokens + 1):  # every slot holds `context` tokens of history
        model(
            prompt,
            torch.arange(context, device="cpu"),
            cache,
            torch.full((context,), slot, device="cpu"),
            logits_rows=torch.tensor([context - 1], device=device),
        )

    def step(num_prefill: int, num_decodes: int):
        chunk_slot = num_tokens  # the prefill chunk continues slot `num_tokens`' prompt
        positions = list(range(context, context + num_prefill)) + [context] * num_decodes
        slots = [chunk_slot] * num_prefill + list(range(num_decodes))
        token_ids = torch.randint(model.arch.vocab_size, (len(slots),), device=device)
        rows = ([num_prefill - 1] if num_prefill else []) + list(range(num_prefill, num_prefill + num_decodes))
        positions = torch.tensor(positions, device="cpu")
        kv = PagedKV.for_slots(cache, positions, torch.tensor(slots, device="cpu"))  # as the engine's runner builds it
        return lambda: model(token_ids, positions, kv, logits_rows=torch.tensor(rows, device=device))

    kinds = {
        "prefill_only": step(num_tokens, 0),
        "decode_only": step(0, num_tokens),
        "mixed": step(half, half),
        "prefill_half": step(half, 0),
        "decode_half": step(0, half),
    }
    samples = {name: [] for name in kinds}
    for _ in range(repeats):
        for name, fn in kinds.items():
            samples[name] += benchmark(fn, device=device, warmup=1, repeats=1).samples_ms
    medians = {name: sorted(values)[len(values) // 2] for name, values in samples.items()}
    medians["separate_halves"] = medians["prefill_half"] + medians["decode_half"]
    medians["mixing_gain"] = medians["separate_halves"] / medians["mixed"] - 1
    return medians


# ------------------------------------------------------------ sweeps and goodput


def best_budget(records: list[dict], load_key: str, load, key: str) -> int | None:
    """The budget with the highest `key` (e.g. "request_goodput") among the sweep records of one
    load; ties go to the smaller budget, which holds less work per step. None when every record
    scores 0 (no budget meets the SLOs): then there is no best budget to mark."""
    rows = [r for r in records if r[load_key] == load]
    if not rows:
        raise ValueError(f"no sweep record has {load_key}={load!r}")
    best = max(rows, key=lambda r: (r[key], -r["max_num_batched_tokens"]))
    return best["max_num_batched_tokens"] if best[key] > 0 else None


# How the sweep's SLOs follow from this machine's step costs (see sweep_slos).
TPOT_SLACK = 1.75
TTFT_PROMPT_ROUNDS = 2


def sweep_slos(decode_step_ms: float, prefill_ms_per_token: float, concurrency: int, mean_prompt_len: float) -> dict:
    """SLOs for a machine, from its step costs, so that a budget sweep at `concurrency` streams
    can show the trade-off: a stream may decode at most TPOT_SLACK times slower than in a step of
    pure decodes (`decode_step_ms`, at that concurrency), and a new request may wait at most as long
    as prefilling every stream's prompt TTFT_PROMPT_ROUNDS times over."""
    return {
        "ttft": TTFT_PROMPT_ROUNDS * concurrency * mean_prompt_len * prefill_ms_per_token,
        "tpot": TPOT_SLACK * decode_step_ms,
    }


# ------------------------------------------------------------ the simulator against the engine


def relative_error(simulated: float, measured: float) -> float:
    if measured == 0:
        return math.inf if simulated else 0.0
    return simulated / measured - 1


def step_cost_errors(cost, steps: list[StepRecord]) -> dict[str, dict]:
    """A cost model's error on measured steps, by kind: how many steps, the median per-step error,
    and the error of their summed time, which is what a TTFT or a run's duration adds up. Decode
    steps are most of a run, so one number for all steps would hide the steps that decide TTFT."""
    by_kind = defaultdict(list)
    for step in steps:
        by_kind[step_kind(step.shape)].append(step)
    errors = {}
    for kind, group in sorted(by_kind.items()):
        predicted = [cost.step_ms(s.shape) for s in group]
        measured = [s.ms for s in group]
        errors[kind] = {
            "steps": len(group),
            "median_error": statistics.median(p / m - 1 for p, m in zip(predicted, measured)),
            "summed_time_error": sum(predicted) / sum(measured) - 1,
        }
    return errors
