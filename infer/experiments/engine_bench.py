"""Week 05's benchmark, each effect of batching measured apart, in one run: `make bench`, or
`python -m infer.experiments.engine_bench`. Writes results/05_engine_bench_<profile>.json and
figures/05_engine_bench.png, and prints how long it took (3.2 minutes on the quiet 2-core machine
of the committed run, 7 on another; 15 under a load average of 6-8).

Each effect is a ratio of output tokens/s between two systems that serve the same requests:
- padding: the engine's static batching against `transformers`' static batched `generate()`, on
  the same batches (32 requests in arrival order). The schedule is the same; `generate()` pads
  every batch's prompts to its longest and keeps computing the rows whose answer is complete;
- continuous against static batching inside the engine: the same code, only the policy differs;
- the engine against `transformers`' own continuous batcher, `generate_batch()`.

Workloads (exact token ids, greedy, EOS ignored, every request sent at once):
- "uniform": 64 x 256 in x 64 out. No padding, and every answer of a batch ends at the same
  step: the control, where both effects should vanish;
- "mixed": 64 requests, in U[32, 512], out U[16, 128];
- "long-tailed": 256 requests, in U[32, 128], out U[8, 64] for 85% of them and U[256, 512] for
  15%: most answers short, a few long, as in chat. A static batch waits for its longest answer.

The systems of a workload run in interleaved rounds (infer.experiments.rounds); every number is
the median over the rounds, with their range.

Why continuous batching gains little or much is measured as well: what a decode step costs
against its batch size (idle slots save little where a step costs about the same at any batch),
the share of the run spent in prefill steps (both policies prefill alike), and the share spent
draining after the last request was admitted (with few requests per slot, a long drain that both
policies share). And what changes on a GPU, where a decode step costs about the same at batch 1
and 32: the same workloads through the simulator (infer.engine.simulator) with a roofline step
cost of the gpu profile's model, labelled SIMULATED.
"""

import argparse
import json
import os
import random
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from infer import hf
from infer.engine.engine import Engine
from infer.engine.replay import replay
from infer.engine.sequence import benchmark_params
from infer.engine.simulator import simulate
from infer.engine.step_record import StepRecord, StepShape
from infer.experiments.chunked_prefill_run import gpu_step_cost
from infer.experiments.engine_bench_plots import plot
from infer.experiments.hf_batching import continuous_batched_generate, static_batched_generate
from infer.experiments.rounds import MIN_ROUNDS, format_spread, interleaved_rounds, ratio_spread, spread
from infer.metrics import calculate_metrics, results_dir
from infer.model import Transformer
from infer.models import load_model
from infer.paged_attention import PagedKV
from infer.profiles import PROFILES, pick_profile
from infer.prompts import random_prompt_ids
from infer.provenance import provenance
from infer.records import RequestRecord
from infer.timing import benchmark, cpu_threads, synchronize
from infer.workloads import Workload

MAX_NUM_SEQS = 32  # the engine's slots, and transformers' static batch size
ENGINE_CONTINUOUS, ENGINE_STATIC = "engine-continuous", "engine-static"
HF_STATIC, HF_GENERATE_BATCH = "hf-static-generate", "hf-generate-batch"
SYSTEMS = (ENGINE_CONTINUOUS, ENGINE_STATIC, HF_STATIC, HF_GENERATE_BATCH)
STEP_BATCHES = (1, 2, 4, 8, 16, 32)  # decode step cost against batch size
# From the rates issue 17 measured on a quiet 2-core machine; 15 minutes under a load average of 6-8 on one thread.
QUIET_MINUTES = 7


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    num_requests: int
    prompt_range: tuple[int, int]  # uniform, inclusive
    output_ranges: tuple[tuple[float, tuple[int, int]], ...]  # (share of the requests, uniform range of their outputs)
    systems: tuple[str, ...]
    not_run: str = ""  # why the other systems sit this workload out

    def describe(self) -> str:
        outputs = " and ".join(
            f"{share:.0%} U[{low},{high}]" if share < 1 else f"U[{low},{high}]"
            for share, (low, high) in self.output_ranges
        )
        return f"{self.num_requests} requests, in U[{self.prompt_range[0]},{self.prompt_range[1]}], out {outputs}"


WORKLOADS = {
    "uniform": WorkloadSpec("uniform", 64, (256, 256), ((1.0, (64, 64)),), SYSTEMS),
    "mixed": WorkloadSpec(
        "mixed",
        64,
        (32, 512),
        ((1.0, (16, 128)),),
        (ENGINE_CONTINUOUS, ENGINE_STATIC, HF_STATIC),
        not_run=f"{HF_GENERATE_BATCH}: it takes one max_new_tokens for every request",
    ),
    "long-tailed": WorkloadSpec(
        "long-tailed",
        256,
        (32, 128),
        ((0.85, (8, 64)), (0.15, (256, 512))),
        (ENGINE_CONTINUOUS, ENGINE_STATIC),
        not_run=f"{HF_GENERATE_BATCH}: one max_new_tokens for all; {HF_STATIC}: padding is "
        f"measured on 'mixed', and here it would add minutes",
    ),
}


@dataclass(frozen=True)
class Effect:
    key: str  # the summary key: it names the effect
    faster: str  # the system expected to be faster (the ratio's numerator)
    slower: str
    workload: str
    what: str
    target: tuple[str, float, str] | None = None  # (">=" or "<=", value, who set it)


EFFECTS = (
    Effect(
        "padding_uniform",
        ENGINE_STATIC,
        HF_STATIC,
        "uniform",
        "no padding here (equal lengths): the two implementations of one schedule alone",
    ),
    Effect(
        "padding_mixed",
        ENGINE_STATIC,
        HF_STATIC,
        "mixed",
        "the same batches; transformers pads each to its longest prompt and computes finished rows",
    ),
    Effect(
        "continuous_vs_static_uniform",
        ENGINE_CONTINUOUS,
        ENGINE_STATIC,
        "uniform",
        "control: every answer of a batch ends at the same step, so no slot idles",
    ),
    Effect(
        "continuous_vs_static_mixed", ENGINE_CONTINUOUS, ENGINE_STATIC, "mixed", "inside the engine: the policy alone"
    ),
    Effect(
        "continuous_vs_static_long_tailed",
        ENGINE_CONTINUOUS,
        ENGINE_STATIC,
        "long-tailed",
        "inside the engine: the policy alone, where a static batch waits for its longest answer",
        target=(">=", 2.0, "issue 17"),
    ),
    Effect(
        "engine_vs_generate_batch_uniform",
        ENGINE_CONTINUOUS,
        HF_GENERATE_BATCH,
        "uniform",
        "two continuous batchers: the engine against transformers' generate_batch()",
        target=(">=", 10.0, "issue 10"),
    ),
)


def make_workload(name: str, config, scale: float = 1.0, seed: int = 0) -> Workload:
    """The named workload's requests (`scale` x its number of requests, at least 2), seeded."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; valid: {', '.join(map(repr, WORKLOADS))}")
    spec, rng = WORKLOADS[name], random.Random(seed)
    count = max(2, round(spec.num_requests * scale))
    counts = [round(share * count) for share, _ in spec.output_ranges[1:]]  # exact shares: no luck in how many
    counts = [count - sum(counts), *counts]  # answers are long
    output_lens = [rng.randint(*bounds) for n, (_, bounds) in zip(counts, spec.output_ranges) for _ in range(n)]
    rng.shuffle(output_lens)
    prompts = [
        random_prompt_ids(config, rng.randint(*spec.prompt_range), seed=seed * 10_000 + i)[0].tolist()
        for i in range(count)
    ]
    return Workload(name, prompts, output_lens)


# ---------------------------------------------------------------- the systems

KEPT_METRICS = ("duration", "output_throughput", "median_ttft_ms", "median_e2el_ms")


def schedule_shares(steps: list[StepRecord], records: list[RequestRecord]) -> dict:
    """What a run's time went to: prefill steps, decode steps and their batch, and the drain after
    the last request was admitted (from its first token, the end of its prefill, to the run's end)."""
    total_ms = sum(step.ms for step in steps)
    decodes = [step for step in steps if step.kind == "decode"]
    start, end = min(r.send_time for r in records), max(r.chunk_times[-1] for r in records)
    last_admitted = max(r.chunk_times[0] for r in records)
    return {
        "num_steps": len(steps),
        "decode_steps": len(decodes),
        "mean_decode_batch": float(np.mean([step.shape.decode_seqs for step in decodes])) if decodes else 0.0,
        "prefill_share": sum(step.ms for step in steps if step.kind == "prefill") / total_ms,
        "drain_share": (end - last_admitted) / (end - start),
    }


def run_engine(model, workload: Workload, policy: str) -> dict:
    engine = Engine(
        model,
        policy=policy,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_SEQS * max(workload.prompt_lens),
        max_model_len=workload.max_model_len,
        log_steps=True,
    )
    replay(engine, workload.prompts[:2], [benchmark_params(4)] * 2)  # warm-up
    engine.step_log.clear()
    records = replay(engine, workload.prompts, [benchmark_params(n) for n in workload.output_lens])
    metrics = calculate_metrics(records)
    return {**{key: metrics[key] for key in KEPT_METRICS}, **schedule_shares(engine.step_log, records)}


def run_timed(fn, workload: Workload, device) -> dict:
    """Output tokens/s of a system that reports no per-token times: requested tokens / wall time."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    duration = time.perf_counter() - start
    return {"duration": duration, "output_throughput": sum(workload.output_lens) / duration}


def run_system(system: str, lm, model, workload: Workload) -> dict:
    """One timed run of `system` over the workload, after a small untimed warm-up."""
    hf_model, pad = lm.model, lm.config.pad_token_id or 0
    if system in (ENGINE_CONTINUOUS, ENGINE_STATIC):
        return run_engine(model, workload, system.removeprefix("engine-"))
    if system == HF_STATIC:
        static_batched_generate(hf_model, workload.prompts[:2], [4, 4], MAX_NUM_SEQS, pad)
        return run_timed(
            lambda: static_batched_generate(hf_model, workload.prompts, workload.output_lens, MAX_NUM_SEQS, pad),
            workload,
            lm.device,
        )
    if system == HF_GENERATE_BATCH:
        if len(set(workload.output_lens)) > 1:
            raise ValueError(
                f"{HF_GENERATE_BATCH} takes one max_new_tokens for all requests; "
                f"workload {workload.name!r} asks for {len(set(workload.output_lens))} different ones"
            )
        sizing = dict(max_batch_tokens=2048, num_blocks=MAX_NUM_SEQS * (-(-workload.max_model_len // 64)) + 8)
        continuous_batched_generate(hf_model, workload.prompts[:2], 4, **sizing)
        return run_timed(
            lambda: continuous_batched_generate(hf_model, workload.prompts, workload.output_lens[0], **sizing),
            workload,
            lm.device,
        )
    raise ValueError(f"unknown system {system!r}; valid: {', '.join(SYSTEMS)}")


def run_workload(lm, model, workload: Workload, systems: tuple[str, ...], rounds: int, bar) -> dict[str, list[dict]]:
    """Every system over the workload, in interleaved rounds; the bar counts output tokens served."""

    def timed(system):
        def run():
            bar.set_postfix_str(f"{workload.name}: {system}")
            result = run_system(system, lm, model, workload)
            bar.update(sum(workload.output_lens))
            return result

        return run

    return interleaved_rounds({system: timed(system) for system in systems}, rounds)


# ---------------------------------------------------------------- what a decode step costs


def decoding_engine(model, config, batch: int, context: int, steps: int) -> Engine:
    """An engine holding `batch` sequences of `context` tokens, prefilled, with `steps` decode steps to go."""
    engine = Engine(
        model, max_num_seqs=batch, max_num_batched_tokens=batch * context, max_model_len=context + steps + 2
    )
    prompt = random_prompt_ids(config, context, seed=1)[0].tolist()
    for _ in range(batch):
        engine.add_request(prompt, benchmark_params(steps + 1))
    engine.step()  # every prefill; what follows are decode steps of `batch` sequences
    return engine


def median_ms(fn, device, repeats: int) -> dict:
    return {"ms": benchmark(fn, device=device, warmup=1, repeats=repeats).median_ms}


def step_cost_by_batch(
    model, config, device, batches=STEP_BATCHES, context: int = 128, rounds: int = MIN_ROUNDS, repeats: int = 8
) -> dict:
    """Median ms of one engine decode step at each batch size, the sizes interleaved in rounds."""
    engines = {b: decoding_engine(model, config, b, context, rounds * (repeats + 1) + 2) for b in batches}
    runs = interleaved_rounds(
        {str(b): (lambda e=e: median_ms(e.step, device, repeats)) for b, e in engines.items()}, rounds
    )
    return {"context": context, "ms": {str(b): spread([r["ms"] for r in runs[str(b)]]) for b in batches}}


@torch.no_grad()
def decode_step_costs(
    lm, model, batch: int = MAX_NUM_SEQS, context: int = 288, rounds: int = 5, repeats: int = 8
) -> dict:
    """One decode step of `batch` sequences at about `context` tokens, three ways, interleaved in
    rounds: the engine's step(), the course model's bare forward over the same tokens (what the
    engine costs on top of its model), and transformers' [batch, 1] forward with a KV cache."""
    device, steps = lm.device, rounds * (repeats + 1) + 2
    engine = decoding_engine(model, lm.config, batch, context, steps)
    bare_cache = decoding_engine(model, lm.config, batch, context, steps).kv_store.cache
    tokens = torch.randint(0, 250, (batch,), device=device)
    positions, slots = torch.full((batch,), context), torch.arange(batch)
    kv = PagedKV.for_slots(bare_cache, positions, slots)  # the step's block tables, as the engine's runner builds them
    logits_rows = torch.arange(batch, device=device)
    hf_cache = hf.new_cache(lm.model)
    hf.forward(lm.model, random_prompt_ids(lm.config, context, batch=batch, seed=1).to(device), hf_cache)
    runs = interleaved_rounds(
        {
            "engine_step": lambda: median_ms(engine.step, device, repeats),
            "own_model_forward": lambda: median_ms(
                lambda: model(tokens, positions, kv, logits_rows=logits_rows), device, repeats
            ),
            "transformers_forward": lambda: median_ms(
                lambda: hf.forward(lm.model, tokens[:, None], hf_cache), device, repeats
            ),
        },
        rounds,
    )
    return {
        "batch": batch,
        "context": context,
        "ms": {name: spread([r["ms"] for r in rs]) for name, rs in runs.items()},
        "engine_step_vs_transformers_forward": ratio_spread(runs["engine_step"], runs["transformers_forward"], "ms"),
        "engine_step_vs_own_forward": ratio_spread(runs["engine_step"], runs["own_model_forward"], "ms"),
    }


# ---------------------------------------------------------------- the same on a GPU, simulated

SIMULATED_POLICIES = ("continuous", "static")


def gpu_simulated(workloads: list[Workload], batches=STEP_BATCHES, context: int = 128) -> dict:
    """Both policies over each workload on the gpu profile's model, with a roofline step cost:
    nothing here is measured."""
    gpu = PROFILES["gpu"]
    cost = gpu_step_cost()
    by_workload = {}
    for w in workloads:
        runs = {
            policy: simulate(
                cost,
                w.prompt_lens,
                w.output_lens,
                policy=policy,
                max_num_seqs=MAX_NUM_SEQS,
                max_num_batched_tokens=MAX_NUM_SEQS * max(w.prompt_lens),
                max_model_len=w.max_model_len,
            )
            for policy in SIMULATED_POLICIES
        }
        by_workload[w.name] = {
            policy: {
                "output_throughput": calculate_metrics(run.records)["output_throughput"],
                **schedule_shares(run.steps, run.records),
            }
            for policy, run in runs.items()
        }
        by_workload[w.name]["continuous_vs_static"] = (
            by_workload[w.name]["continuous"]["output_throughput"] / by_workload[w.name]["static"]["output_throughput"]
        )
    step_ms = {
        str(b): cost.step_ms(
            StepShape(
                prefill_tokens=0,
                decode_seqs=b,
                decode_kv_tokens=b * context,
                prefill_attention_pairs=0,
                sampled_rows=b,
                decode_padded_kv_tokens=b * context,
            )
        )
        for b in batches
    }
    return {
        "kind": "SIMULATED",
        "model": gpu.model_name,
        "dtype": "bfloat16",
        "assumptions": cost.assumptions(),
        "decode_step_ms_by_batch": {"context": context, "ms": step_ms},
        "workloads": by_workload,
    }


# ---------------------------------------------------------------- the summary


def summarize(runs: dict, step_costs: dict) -> dict:
    """Each effect's ratio (median over rounds, range), with its target where one was set."""
    summary = {}
    for effect in EFFECTS:
        by_system = runs.get(effect.workload, {})
        if effect.faster not in by_system or effect.slower not in by_system:
            continue
        entry = {
            **ratio_spread(by_system[effect.faster], by_system[effect.slower], "output_throughput"),
            "ratio": f"{effect.faster} / {effect.slower} output tokens/s, {effect.workload}",
            "what": effect.what,
        }
        summary[effect.key] = with_target(entry, effect.target)
    summary["engine_step_vs_transformers_forward"] = with_target(
        {
            **step_costs["engine_step_vs_transformers_forward"],
            "ratio": "ms per decode step (lower is better)",
            "what": "the engine's whole step against transformers' bare forward of the same shape",
        },
        ("<=", 1.3, "issue 10"),
    )
    overhead = step_costs["engine_step_vs_own_forward"]
    summary["engine_step_vs_own_forward"] = {
        **overhead,
        "ratio": "ms per decode step (lower is better)",
        "what": "the engine's overhead (schedule, inputs, sampling, update) over its own model's forward",
        "resolved": overhead["min"] >= 1.0,  # an overhead cannot make a step faster: below 1 is noise
    }
    return summary


def with_target(entry: dict, target: tuple[str, float, str] | None) -> dict:
    if target is None:
        return entry
    op, value, source = target
    met = entry["median"] >= value if op == ">=" else entry["median"] <= value
    return {**entry, "target": f"{op} {value:g} ({source})", "met": met}


def why_table(runs: dict, step_by_batch: dict) -> dict:
    """The reasons, measured: step cost against batch size, and per workload and engine policy the
    median prefill share, drain share and mean decode batch over the rounds."""
    shares = ("prefill_share", "drain_share", "mean_decode_batch")
    workloads = {
        name: {
            system: {key: statistics.median(r[key] for r in by_system[system]) for key in shares}
            for system in (ENGINE_CONTINUOUS, ENGINE_STATIC)
            if system in by_system
        }
        for name, by_system in runs.items()
    }
    ms = step_by_batch["ms"]
    smallest, largest = str(min(STEP_BATCHES)), str(max(STEP_BATCHES))
    return {
        "decode_step_ms_by_batch": step_by_batch,
        "decode_step_cost_largest_vs_smallest_batch": ms[largest]["median"] / ms[smallest]["median"],
        "workloads": workloads,
    }


def format_report(document: dict) -> str:
    """The results file as text: each system's output tokens/s, each effect, and the reasons."""
    runs, summary, why, gpu = document["runs"], document["summary"], document["why"], document["gpu_simulated"]
    lines = []
    for name, by_system in runs.items():
        lines.append(
            f"{name} ({document['workloads'][name]['requests']} requests; "
            f"full size: {document['workloads'][name]['full_size']}):"
        )
        for system, results in by_system.items():
            throughput = format_spread(spread([r["output_throughput"] for r in results]), ".0f")
            lines.append(f"  {system:>20}: {throughput} output tok/s")
    lines.append("effects (ratios; median and range over the rounds):")
    for key, entry in summary.items():
        verdict = f"; target {entry['target']}: {'met' if entry['met'] else 'MISSED'}" if "target" in entry else ""
        if entry.get("resolved") is False:
            verdict = "; not resolved: the rounds range below 1, so the noise exceeds the overhead"
        lines.append(f"  {key}: {format_spread(entry)}{verdict}")
    ms = why["decode_step_ms_by_batch"]["ms"]
    lines.append(
        "why: a decode step of the engine, in ms, by batch: "
        + ", ".join(f"{b}: {ms[b]['median']:.1f}" for b in ms)
        + f" ({why['decode_step_cost_largest_vs_smallest_batch']:.1f}x from the smallest batch to the largest)"
    )
    for name, by_policy in why["workloads"].items():
        lines.append(
            f"  {name}: "
            + "; ".join(
                f"{system} prefill {s['prefill_share']:.0%} of the time, drain {s['drain_share']:.0%}, "
                f"mean decode batch {s['mean_decode_batch']:.1f}"
                for system, s in by_policy.items()
            )
        )
    lines.append(
        f"SIMULATED on a GPU ({gpu['model']}, {gpu['assumptions']}): continuous / static = "
        + ", ".join(f"{name} {w['continuous_vs_static']:.2f}x" for name, w in gpu["workloads"].items())
    )
    return "\n".join(lines)


def reading(document: dict) -> list[str]:
    """What the run says, in sentences whose directions and sizes come from its own numbers."""
    summary, why, gpu = document["summary"], document["why"], document["gpu_simulated"]
    gain = {name: summary[f"continuous_vs_static_{name.replace('-', '_')}"]["median"] for name in WORKLOADS}
    largest = max(gain, key=gain.get)
    shares = {name: why["workloads"][name][ENGINE_CONTINUOUS] for name in WORKLOADS}
    gpu_ms = gpu["decode_step_ms_by_batch"]["ms"]
    sentences = [
        f"Inside the engine, continuous batching gained most on the {largest} workload ({gain[largest]:.2f}x "
        f"static batching's output tokens/s); "
        + ", ".join(f"{n}: {g:.2f}x" for n, g in gain.items() if n != largest)
        + ".",
        "The continuous runs spent "
        + "; ".join(
            f"{s['prefill_share']:.0%} of their time in prefill steps and {s['drain_share']:.0%} draining ({n}, "
            f"{document['workloads'][n]['requests'] / MAX_NUM_SEQS:g} requests per slot)"
            for n, s in shares.items()
        )
        + ".",
        f"Here a decode step at the largest batch cost {why['decode_step_cost_largest_vs_smallest_batch']:.1f}x one "
        f"at the smallest; on the simulated GPU {gpu_ms[max(gpu_ms, key=int)] / gpu_ms[min(gpu_ms, key=int)]:.2f}x, "
        f"where continuous batching gains "
        + ", ".join(f"{n} {w['continuous_vs_static']:.2f}x" for n, w in gpu["workloads"].items())
        + " (SIMULATED).",
    ]
    if "padding_mixed" in summary and "padding_uniform" in summary:
        sentences.append(
            f"On the same batches, the engine's static batching served {summary['padding_mixed']['median']:.2f}x "
            f"transformers' padded static generate() on 'mixed' and {summary['padding_uniform']['median']:.2f}x on "
            f"'uniform', where nothing is padded."
        )
    return sentences


# ---------------------------------------------------------------- the run


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=None, help="cpu or gpu (default: picked from the hardware)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: leave as is)")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"interleaved rounds (default {MIN_ROUNDS})")
    parser.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="scale every workload's number of requests (a quick check of the harness: 0.1)",
    )
    args = parser.parse_args(argv)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    print(
        f"expect about {QUIET_MINUTES} minutes on a quiet 2-core machine at full size, more on a busy one", flush=True
    )
    profile = pick_profile(args.profile)
    lm = load_model(profile=profile)
    model = Transformer.from_hf(lm.model)
    workloads = {name: make_workload(name, lm.config, args.scale) for name in WORKLOADS}
    with cpu_threads(args.threads):
        step_by_batch = step_cost_by_batch(model, lm.config, lm.device, rounds=args.rounds)
        step_costs = decode_step_costs(lm, model)
        total_tokens = args.rounds * sum(sum(w.output_lens) * len(WORKLOADS[n].systems) for n, w in workloads.items())
        runs = {}
        with tqdm(total=total_tokens, desc="output tokens served", unit="tok") as bar:
            for name, workload in workloads.items():
                runs[name] = run_workload(lm, model, workload, WORKLOADS[name].systems, args.rounds, bar)
    gpu = gpu_simulated(list(workloads.values()))
    meta = {
        **provenance(lm),
        "threads": str(torch.get_num_threads() if args.threads is None else args.threads),
        "rounds": str(args.rounds),
        "load_average_1min": f"{load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
    }
    summary, why = summarize(runs, step_costs), why_table(runs, step_by_batch)
    document = {
        "metadata": meta,
        "summary": summary,
        "why": why,
        "gpu_simulated": gpu,
        "decode_step": step_costs,
        "workloads": {
            name: {
                "requests": len(workloads[name].prompts),
                "scale": args.scale,
                "full_size": spec.describe(),
                "seed": 0,
                "systems": list(spec.systems),
                "not_run": spec.not_run,
            }
            for name, spec in WORKLOADS.items()
        },
        "runs": runs,
        "wall_s": time.perf_counter() - started,
    }
    path = results_dir() / f"05_engine_bench_{profile.name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    figure = plot(runs, summary, why, gpu, meta, systems=SYSTEMS, continuous=ENGINE_CONTINUOUS, static=ENGINE_STATIC)
    print(format_report(document))
    print(*reading(document), sep="\n")
    print(f"wrote {path} and {figure} in {document['wall_s'] / 60:.1f} minutes")
    return document


if __name__ == "__main__":
    main()
