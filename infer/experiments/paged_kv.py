"""Week 08's measurements: what a paged KV store saves, what it lets run, and what it costs.

- `reservation_waste`: for a workload's lengths, the KV positions reserved vs used, by the slot
  store (max_model_len per sequence) and by the paged store at several block sizes (only the last
  block is partly empty). Arithmetic over lengths: no model.
- `capacity_at_equal_memory`: the same KV memory as a few slots, given as slots or as blocks; how
  many sequences run at once and the output throughput, the two stores in alternating rounds.
- `prefix_caching_ttft`: requests that share a long system prompt, one at a time, with prefix
  caching off and on, in alternating rounds: TTFT and the hit rate.
- `indirection_cost`: one decode step of a full batch through block tables of small blocks vs
  through slots read in place, timed in alternating rounds; and the same for 4 sequences of
  1,088 tokens, the decodes of the shared-prefix comparison with vLLM (prefix_vs_vllm);
- `pressure_sweep`: the course server with a small paged pool, driven by the benchmark client at
  rising concurrency: preemptions (from /metrics), TTFT, TPOT and throughput, the knee marked;
- `gpu_simulated`: what this machine cannot run, modelled and stamped SIMULATED: week 02's memory
  calculator for the gpu profile's model on an 80 GiB card (requests of 2,048 + 64 tokens in slots
  vs in blocks), and the pressure sweep on the simulator (infer.engine.simulator) with the gpu
  roofline's step costs and a deliberately small block pool.

`python -m infer.experiments.paged_kv` runs them all: the measured parts write
results/08_paged_kv_<profile>.json and figures/08_pressure.png, the simulated one
results/08_paged_kv_gpu_simulated.json and figures/08_pressure_gpu_simulated.png (`--only gpu`:
that one alone, in about 10 seconds).
"""

import argparse
import random
import statistics
import time

import httpx
import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

from infer.engine import Engine
from infer.engine.replay import replay
from infer.engine.sequence import benchmark_params
from infer.engine.simulator import simulate
from infer.experiments.chunked_prefill_run import gpu_step_cost, simulated_gpu_provenance
from infer.experiments.rounds import spread, verdict
from infer.generate import cached_greedy_generate
from infer.kv_cache import KVCache
from infer.memory import kv_tokens_that_fit
from infer.metrics import calculate_metrics, save_results
from infer.model import Transformer
from infer.models import MODEL_SPECS, load_model
from infer.plotting import save_figure
from infer.profiles import PROFILES, pick_profile
from infer.provenance import provenance
from infer.serve.client import run_benchmark, workload_for_model
from infer.serve.metrics import read_metrics
from infer.serve.server import EngineSettings, start_server
from infer.timing import cpu_threads
from infer.workloads import Workload, mixed_workload, random_prompt

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)


def reservation_waste(total_lens: list[int], max_model_len: int, block_sizes=BLOCK_SIZES) -> dict:
    """Fraction of reserved KV positions that hold no token, each sequence at its full length."""
    used = sum(total_lens)

    def waste(reserved: int) -> float:
        return 1 - used / reserved

    return {
        "slots": waste(max_model_len * len(total_lens)),
        **{f"paged_b{b}": waste(sum(-(-n // b) * b for n in total_lens)) for b in block_sizes},
    }


def serve_once(engine: Engine, workload: Workload) -> dict:
    """Serve the whole workload at once: its metrics, the most sequences that ran at once, and the
    preemptions of this run alone (the engine's counter runs from its start, warm-up included)."""
    engine.step_log.clear()
    preempted_before = engine.num_preemptions
    metrics = calculate_metrics(replay(engine, workload.prompts, [benchmark_params(n) for n in workload.output_lens]))
    return {
        **metrics,
        "max_running": max(step.num_running for step in engine.step_log),
        "preemptions": engine.num_preemptions - preempted_before,
    }


def capacity_at_equal_memory(
    model, workload: Workload, *, slots: int, max_model_len: int, block_size: int = 16, rounds: int = 3
) -> dict:
    """Room for `slots` sequences of max_model_len, as slots or as blocks of `block_size`. Per store:
    output throughput over the rounds, the most sequences run at once, and the preemptions of each
    round (`preemptions_per_round`) and of all of them together (`preemptions`)."""
    num_blocks = slots * max_model_len // block_size
    engines = {
        "slots": Engine(model, "chunked", max_num_seqs=slots, max_model_len=max_model_len, log_steps=True),
        "paged": Engine(
            model,
            "chunked",
            max_num_seqs=len(workload.prompts),
            max_model_len=max_model_len,
            kv_store="paged",
            num_kv_blocks=num_blocks,
            block_size=block_size,
            log_steps=True,
        ),
    }
    for engine in engines.values():
        replay(engine, workload.prompts[:2], benchmark_params(4))  # warm-up
    runs = {name: [] for name in engines}
    for _ in tqdm(range(rounds), desc="capacity: slots vs paged, alternating"):
        for name, engine in engines.items():
            runs[name].append(serve_once(engine, workload))
    return {
        name: {
            "output_throughput": spread([r["output_throughput"] for r in results]),
            "max_running": max(r["max_running"] for r in results),
            "preemptions_per_round": [r["preemptions"] for r in results],
            "preemptions": sum(r["preemptions"] for r in results),  # over all the rounds, the warm-up excluded
        }
        for name, results in runs.items()
    } | {
        "kv_positions": slots * max_model_len,
        "num_slots": slots,
        "num_blocks": num_blocks,
        "block_size": block_size,
        "throughput_ratio_paged_over_slots": statistics.median(r["output_throughput"] for r in runs["paged"])
        / statistics.median(r["output_throughput"] for r in runs["slots"]),
    }


def shared_prefix_workload(
    vocab_size: int, num_requests: int, prefix_len: int, suffix_len: int, output_len: int, seed: int = 0
) -> Workload:
    """A system prompt of `prefix_len` tokens that every request starts with, then its own suffix."""
    rng = random.Random(seed)
    system_prompt = random_prompt(rng, prefix_len, vocab_size)
    prompts = [system_prompt + random_prompt(rng, suffix_len, vocab_size) for _ in range(num_requests)]
    return Workload("shared-prefix", prompts, [output_len] * num_requests)


def prefix_caching_ttft(model, workload: Workload, *, block_size: int = 16, rounds: int = 3) -> dict:
    """One request at a time (concurrency 1): median TTFT with prefix caching off and on, and the
    hit rate of the timed requests (prompt tokens found cached over prompt tokens looked up)."""
    max_model_len = workload.max_model_len
    # tokens that no request starts with: the warm-up names blocks of its own, none of the system prompt's
    warm_up = random_prompt(random.Random("warm-up"), 32, model.arch.vocab_size)
    ttft = {"off": [], "on": []}
    hit_rate = 0.0
    for _ in tqdm(range(rounds), desc="prefix caching: off vs on, alternating"):
        for mode in ttft:
            engine = Engine(
                model,
                "chunked",
                max_num_seqs=4,
                max_num_batched_tokens=max_model_len,
                max_model_len=max_model_len,
                kv_store="paged",
                block_size=block_size,
                enable_prefix_caching=mode == "on",
                log_steps=True,
            )
            replay(engine, [warm_up], benchmark_params(2))
            store = engine.kv_store
            hits_before, queried_before = store.hit_tokens, store.queried_tokens
            metrics = calculate_metrics(
                replay(engine, workload.prompts, [benchmark_params(n) for n in workload.output_lens], max_concurrency=1)
            )
            ttft[mode].append(metrics["median_ttft_ms"])
            if mode == "on":  # the timed requests' own lookups, without the warm-up's
                hit_rate = (store.hit_tokens - hits_before) / (store.queried_tokens - queried_before)
    return {
        "median_ttft_ms": {mode: spread(values) for mode, values in ttft.items()},
        "ttft_ratio_off_over_on": statistics.median(ttft["off"]) / statistics.median(ttft["on"]),
        "hit_rate": hit_rate,
        "num_requests": len(workload.prompts),
    }


@torch.no_grad()
def indirection_cost(
    model, batch: int = 32, context: int = 288, block_size: int = 16, steps: int = 20, rounds: int = 3
) -> dict:
    """Median ms of a decode step of `batch` sequences: slots read in place vs small blocks gathered."""
    prompt = [1 + i % (model.arch.vocab_size - 1) for i in range(context)]  # any ids: the cost is in the shapes
    engines = {
        "slots": Engine(
            model,
            max_num_seqs=batch,
            max_num_batched_tokens=batch * context,
            max_model_len=context + rounds * steps + 8,
        ),
        "paged": Engine(
            model,
            max_num_seqs=batch,
            max_num_batched_tokens=batch * context,
            max_model_len=context + rounds * steps + 8,
            kv_store="paged",
            block_size=block_size,
        ),
    }
    for engine in engines.values():
        for _ in range(batch):
            engine.add_request(prompt, benchmark_params(rounds * steps + 4))
        engine.step()  # every prefill; the steps timed below are decodes of `batch` sequences
        engine.step()
    step_ms = {name: [] for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                engine.step()
                times.append((time.perf_counter() - start) * 1e3)
            step_ms[name].append(statistics.median(times))
    return {
        "batch": batch,
        "context": context,
        "block_size": block_size,
        "decode_step_ms": {name: spread(values) for name, values in step_ms.items()},
        "ratio_paged_over_slots": statistics.median(step_ms["paged"]) / statistics.median(step_ms["slots"]),
    }


def pressure_sweep(
    lm,
    levels: tuple[int, ...],
    *,
    num_kv_blocks: int,
    block_size: int = 16,
    input_len: int = 128,
    output_len: int = 64,
    rounds: int = 3,
    max_model_len: int = 512,
) -> list[dict]:
    """The course server with a paged store of `num_kv_blocks`, driven by the benchmark client at
    each concurrency (a closed loop: `rounds` x level requests, a new one as soon as one ends).
    Per level: the client's TTFT, TPOT and throughput, and the server's preemptions from /metrics."""
    settings = EngineSettings(
        policy="chunked",
        max_num_seqs=max(levels),
        max_num_batched_tokens=2048,
        max_model_len=max_model_len,
        kv_store="paged",
        num_kv_blocks=num_kv_blocks,
        block_size=block_size,
    )
    rows = []
    with start_server(lm, settings, model_name="pressure") as server, httpx.Client(timeout=30) as http:
        for level in tqdm(levels, desc="pressure: concurrency sweep"):
            before = read_metrics(http.get(server.url + "/metrics").text)["infer:num_preemptions_total"]
            requests = workload_for_model(lm.config, rounds * level, input_len, output_len, seed=level)
            metrics, _ = run_benchmark(server.url, "pressure", requests, max_concurrency=level, progress=False)
            after = read_metrics(http.get(server.url + "/metrics").text)["infer:num_preemptions_total"]
            summary = {key: value for key, value in metrics.items() if not isinstance(value, list)}  # not per request
            rows.append({"concurrency": level, "preemptions": after - before, **summary})
    return rows


def requests_that_fit(num_kv_blocks: int, block_size: int, request_len: int) -> int:
    """How many requests of `request_len` tokens the pool holds whole at once: past this concurrency
    (the knee), running requests must be preempted to let the others grow."""
    return num_kv_blocks // -(-request_len // block_size)


def plot_pressure(
    rows: list[dict],
    knee: int,
    tail: str = "p90",
    title: str = "Expected: past the knee, preemptions appear and TTFT's tail grows",
):
    """Preemptions, TTFT (median and the `tail` percentile), TPOT and throughput against
    concurrency, the knee marked."""
    x = [r["concurrency"] for r in rows]
    fig, axes = plt.subplots(4, 1, figsize=(7, 10), sharex=True)
    panels = [
        ("preemptions", ["preemptions"], "preemptions in the level's run"),
        ("TTFT", ["median_ttft_ms", f"{tail}_ttft_ms"], f"TTFT (ms): median, {tail}"),
        ("TPOT", ["median_tpot_ms"], "median TPOT (ms)"),
        ("throughput", ["output_throughput"], "output tokens/s"),
    ]
    for ax, (_, keys, label) in zip(axes, panels):
        for key in keys:
            ax.plot(x, [r[key] for r in rows], marker="o", label=key)
        ax.axvline(knee, color="0.5", linestyle="--")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)  # from zero: a flat TPOT must not look like a climb
    axes[0].text(knee, 0, f" the pool holds {knee} requests whole", va="bottom", color="0.3")
    axes[1].legend(fontsize=8)
    axes[-1].set_xlabel("concurrency (requests in flight, closed loop)")
    fig.suptitle(title)
    return fig


@torch.no_grad()
def compare_with_alone(model, prompt: list[int], tokens: list[int]) -> str:
    """Whether `tokens` are the prompt's greedy tokens when it runs alone through week 02's cache,
    and if not, where they part and how close the two best logits were there: a batch computes the
    same sums in another order (on a GPU, with other attention kernels), so a near-tie can go either
    way without anything being wrong. What counts as near depends on the model's dtype (near_tie)."""
    cache = KVCache.for_model(model, 1, len(prompt) + len(tokens))
    alone = cached_greedy_generate(model, torch.tensor(prompt, device="cpu"), len(tokens), cache)[0].tolist()
    if alone == tokens:
        return "same tokens"
    step = next(i for i, (a, b) in enumerate(zip(alone, tokens)) if a != b)
    context = prompt + alone[:step]
    logits = model(
        torch.tensor(context, device=model.embed.weight.device),
        torch.arange(len(context), device="cpu"),
        KVCache.for_model(model, 1, len(context)),
    )[-1].float()
    best, second = logits.topk(2).values.tolist()
    return f"differs from token {step}, where the two best logits alone are {best:.7f} and {second:.7f}: " + (
        "a near-tie that rounding decides"
        if near_tie(best, second, model.embed.weight.dtype)
        else "NOT a near-tie: a bug"
    )


def near_tie(best: float, second: float, dtype: torch.dtype) -> bool:
    """Whether two logits computed in `dtype` are close enough for rounding to order them either way.

    In float32 two paths that sum in another order agree to ~1e-6 relative, so 1e-5 is a near-tie.
    A bf16 logit between 4 and 8 moves in steps of 2^-5 (eps = 2^-7 of its size), and two kernels that
    round differently through 28 layers part by a few such steps: there the bound is 4 x eps (3%)."""
    return best - second <= max(1e-5, 4 * torch.finfo(dtype).eps) * max(abs(best), 1.0)


PRESSURE_BLOCKS = 96  # room for 8 requests of 128 + 64 tokens, in blocks of 16
PRESSURE_LEVELS = (2, 4, 8, 12, 16, 24, 32)

TARGETS = {
    "throughput_ratio_paged_over_slots": (">=", 1.5),
    "ttft_ratio_off_over_on": (">=", 3.0),
    "ratio_paged_over_slots": ("<=", 1.25),
}


# ---------------------------------------------------------------- on a GPU: modelled, not measured

GPU_CARD_GIB, GPU_ACTIVATION_GIB = 80, 2  # week 02's budget: 0.9 of the card, less the weights and activations
GPU_PROMPT_LEN, GPU_OUTPUT_LEN = 2048, 64  # the gpu profile's requests
GPU_MAX_MODEL_LENS = (GPU_PROMPT_LEN + GPU_OUTPUT_LEN, 8192, 32768)  # 32,768: the model's whole context
# The pressure sweep's requests: the gpu grid's shorter prompts, with answers half as long (as in the cpu
# sweep). With 2,048 + 64 the simulator preempts nothing: a request grows by only 4 blocks after its
# prompt's 128, so a full pool just makes newcomers wait. Preemption needs running requests that outgrow it.
GPU_PRESSURE_PROMPT_LEN, GPU_PRESSURE_OUTPUT_LEN = 512, 256
# Deliberately small (an 80 GiB card holds about 400 times more), so that the knee sits where a sweep reaches it.
GPU_PRESSURE_BLOCKS = 384  # room for 8 requests of 768 tokens, in blocks of 16
GPU_REQUESTS = PROFILES["gpu"].grid.num_prompts  # 200 per level: enough for a p99 (two requests beyond it)


def gpu_capacity(block_size: int = 16) -> dict:
    """Requests of 2,048 + 64 tokens whose KV fits at once next to the gpu profile's model on an
    80 GiB card (week 02's calculator, a model of vLLM's budget): in slots, each reserving a whole
    max_model_len, and in blocks, each request holding only the blocks it fills."""
    gpu = PROFILES["gpu"]
    tokens = kv_tokens_that_fit(MODEL_SPECS[gpu.model_name].config(), gpu.dtype, GPU_CARD_GIB, GPU_ACTIVATION_GIB)
    request_len = GPU_PROMPT_LEN + GPU_OUTPUT_LEN
    return {
        "kv_tokens": tokens,
        "request_tokens": request_len,
        "slots_by_max_model_len": {str(n): tokens // n for n in GPU_MAX_MODEL_LENS},
        f"paged_b{block_size}": requests_that_fit(tokens // block_size, block_size, request_len),
    }


def simulated_pressure(
    cost_model,
    levels: tuple[int, ...],
    *,
    num_kv_blocks: int,
    block_size: int = 16,
    input_len: int,
    output_len: int,
    num_requests: int,
) -> list[dict]:
    """`pressure_sweep` on the simulator: `num_requests` requests in a closed loop at each
    concurrency, a paged pool of `num_kv_blocks`. Per level: the preemptions, and vLLM's metrics
    (median and p99) on the virtual clock."""
    rows = []
    for level in levels:
        run = simulate(
            cost_model,
            [input_len] * num_requests,
            [output_len] * num_requests,
            policy="chunked",
            max_num_seqs=max(levels),
            max_num_batched_tokens=2048,
            max_model_len=input_len + output_len,
            max_concurrency=level,
            kv_store="paged",
            num_kv_blocks=num_kv_blocks,
            block_size=block_size,
        )
        rows.append(
            {
                "concurrency": level,
                "preemptions": run.num_preemptions,
                **calculate_metrics(run.records, percentiles=(50, 99)),
            }
        )
    return rows


GPU_SUMMARY_KEYS = ("preemptions", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "output_throughput")


def gpu_simulated(levels: tuple[int, ...] = PRESSURE_LEVELS, num_requests: int = GPU_REQUESTS) -> dict:
    """The gpu part: the calculator's answer and the simulated pressure sweep, with a summary that
    says SIMULATED. Nothing here is measured."""
    cost = gpu_step_cost()
    rows = simulated_pressure(
        cost,
        levels,
        num_kv_blocks=GPU_PRESSURE_BLOCKS,
        input_len=GPU_PRESSURE_PROMPT_LEN,
        output_len=GPU_PRESSURE_OUTPUT_LEN,
        num_requests=num_requests,
    )
    knee = requests_that_fit(GPU_PRESSURE_BLOCKS, 16, GPU_PRESSURE_PROMPT_LEN + GPU_PRESSURE_OUTPUT_LEN)
    capacity = gpu_capacity()
    summary = {
        "kind": "SIMULATED",
        "what": f"modelled, not measured: {PROFILES['gpu'].model_name} (bf16) on a {cost.assumptions()}",
        "requests_on_80_gib": capacity,
        "pressure_workload": f"{GPU_PRESSURE_PROMPT_LEN} in / {GPU_PRESSURE_OUTPUT_LEN} out tokens, {num_requests} "
        f"requests per concurrency in a closed loop, a pool of {GPU_PRESSURE_BLOCKS} blocks of 16",
        "knee_concurrency": knee,
        "first_preempting_concurrency": next((r["concurrency"] for r in rows if r["preemptions"]), None),
        "by_concurrency": {str(r["concurrency"]): {key: r[key] for key in GPU_SUMMARY_KEYS} for r in rows},
    }
    return {
        "rows": rows,
        "summary": summary,
        "assumptions": {
            "cost_model": cost.as_dict(),
            "in_tokens": GPU_PRESSURE_PROMPT_LEN,
            "out_tokens": GPU_PRESSURE_OUTPUT_LEN,
            "num_prompts_per_level": num_requests,
            "num_kv_blocks": GPU_PRESSURE_BLOCKS,
            "block_size": 16,
            "policy": "chunked, max_num_batched_tokens 2048",
            "card_gib": GPU_CARD_GIB,
            "activation_gib": GPU_ACTIVATION_GIB,
        },
        "meta": simulated_gpu_provenance(cost),
    }


def save_gpu_simulated(part: dict):
    """results/08_paged_kv_gpu_simulated.json and figures/08_pressure_gpu_simulated.png."""
    summary = part["summary"]
    title = (
        f"SIMULATED: {PROFILES['gpu'].model_name}, {GPU_PRESSURE_PROMPT_LEN} in / {GPU_PRESSURE_OUTPUT_LEN} out "
        f"tokens, a pool of {GPU_PRESSURE_BLOCKS} blocks of 16, a roofline's step costs"
    )
    figure = save_figure(
        plot_pressure(part["rows"], summary["knee_concurrency"], tail="p99", title=title),
        "08_pressure_gpu_simulated",
        part["meta"],
    )
    path = save_results(
        "08_paged_kv_gpu_simulated", part["rows"], part["meta"], summary=summary, assumptions=part["assumptions"]
    )
    return path, figure


def measured(profile_name: str | None, rounds: int) -> dict:
    """The parts measured on this machine's profile: results/08_paged_kv_<profile>.json and figures/08_pressure.png."""
    profile = pick_profile(profile_name)
    lm = load_model(profile=profile)
    model = Transformer.from_hf(lm.model)
    vocab = lm.config.vocab_size
    varied = mixed_workload("varied", vocab, 128, (32, 128), (32, 128), seed=8)
    with cpu_threads(1 if profile.device == "cpu" else None):
        pressure = pressure_sweep(lm, PRESSURE_LEVELS, num_kv_blocks=PRESSURE_BLOCKS, rounds=rounds)
        knee = requests_that_fit(PRESSURE_BLOCKS, 16, 128 + 64)
        save_figure(plot_pressure(pressure, knee), "08_pressure", provenance(lm))
        results = {
            "pressure": {"rows": pressure, "knee_concurrency": knee, "num_kv_blocks": PRESSURE_BLOCKS},
            "waste": reservation_waste([len(p) + n for p, n in zip(varied.prompts, varied.output_lens)], 1024),
            "capacity": capacity_at_equal_memory(model, varied, slots=8, max_model_len=1024, rounds=rounds),
            "prefix": prefix_caching_ttft(model, shared_prefix_workload(vocab, 12, 1024, 16, 8), rounds=rounds),
            "indirection": indirection_cost(model, rounds=rounds),
            # the decodes of prefix_vs_vllm: 4 in flight, each with a 1,024-token prompt and 32 of its own
            "indirection_long_context": indirection_cost(model, batch=4, context=1088, rounds=rounds),
        }
    summary = {
        "throughput_ratio_paged_over_slots": results["capacity"]["throughput_ratio_paged_over_slots"],
        "ttft_ratio_off_over_on": results["prefix"]["ttft_ratio_off_over_on"],
        "ratio_paged_over_slots": results["indirection"]["ratio_paged_over_slots"],
    }
    summary["targets"] = {
        key: f"{op} {value}: {verdict(summary[key], op, value)}" for key, (op, value) in TARGETS.items()
    }
    path = save_results(f"08_paged_kv_{profile.name}", [], provenance(lm), **results, summary=summary)
    print(f"wrote {path}: {summary}")
    return results


PARTS = ("measured", "gpu")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.paged_kv", description=__doc__)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        default=PARTS,
        help="measured: the parts run on this machine's profile; gpu: the gpu profile, simulated",
    )
    args = parser.parse_args(argv)
    results = {}
    if "measured" in args.only:
        results["measured"] = measured(args.profile, args.rounds)
    if "gpu" in args.only:
        results["gpu"] = gpu_simulated()
        path, figure = save_gpu_simulated(results["gpu"])
        summary = results["gpu"]["summary"]
        print(
            f"wrote {path} and {figure} (SIMULATED): requests of {GPU_PROMPT_LEN} + {GPU_OUTPUT_LEN} tokens on "
            f"{GPU_CARD_GIB} GiB: {summary['requests_on_80_gib']}; the pool holds {summary['knee_concurrency']}, "
            f"first preemptions at concurrency {summary['first_preempting_concurrency']}"
        )
    return results


if __name__ == "__main__":
    main()
