"""The engine against `transformers`' batchers, side by side in one run: `make bench`, or
`python -m infer.experiments.engine_bench`. Writes results/05_engine_bench_<profile>.json and
figures/05_engine_bench.png.

Workloads (exact token ids, greedy, EOS ignored), all requests sent at once:
- "uniform": 64 prompts x 256 input x 64 output tokens;
- "mixed": 64 prompts, input lengths uniform in 32-512 and output lengths uniform in 16-128, seeded.
Systems: the engine (static and continuous), `transformers` static batched `generate()` (batch 32,
left-padded), its continuous `generate_batch()` (uniform only: it takes one max_new_tokens for
all requests) and sequential `generate()`. Each system serves a small warm-up first, untimed.

Besides throughput, it times one decode step at batch 32 three ways: the engine's `step()`, the
course model's bare forward over the same 32 tokens, and `transformers`' batched forward of the
same shape ([32, 1] with a KV cache of the same length): what the engine costs on top of the model.
"""

import argparse
import json
import random
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch
from tqdm.auto import tqdm

from infer import hf
from infer.engine.engine import Engine
from infer.engine.replay import replay
from infer.engine.sequence import benchmark_params
from infer.experiments.hf_batching import continuous_batched_generate, static_batched_generate
from infer.metrics import calculate_metrics, results_dir
from infer.model import Transformer
from infer.models import load_model
from infer.paged_attention import PagedKV
from infer.plotting import save_figure
from infer.profiles import pick_profile
from infer.prompts import random_prompt_ids
from infer.provenance import provenance
from infer.timing import benchmark, cpu_threads, synchronize
from infer.workloads import Workload

MAX_NUM_SEQS = 32  # the engine's slots, and transformers' static batch size
TARGETS = {  # issue 10: ratios of output tokens/s within one run (the last: a cost ratio, lower is better)
    "continuous_vs_hf_static_mixed": (">=", 2.0),
    "continuous_vs_hf_static_uniform": (">=", 1.2),
    "continuous_vs_generate_batch": (">=", 10.0),
    "decode_step_vs_bare_forward": ("<=", 1.3),
}


def make_workload(name: str, config, num_prompts: int = 64, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    if name == "uniform":
        input_lens, output_lens = [256] * num_prompts, [64] * num_prompts
    elif name == "mixed":
        input_lens = [rng.randint(32, 512) for _ in range(num_prompts)]
        output_lens = [rng.randint(16, 128) for _ in range(num_prompts)]
    else:
        raise ValueError(f"unknown workload {name!r}; valid: 'uniform', 'mixed'")
    prompts = [random_prompt_ids(config, n, seed=seed * 10_000 + i)[0].tolist() for i, n in enumerate(input_lens)]
    return Workload(name, prompts, output_lens)


def run_engine(model, workload: Workload, policy: str) -> dict:
    engine = Engine(model, policy=policy, max_num_seqs=MAX_NUM_SEQS,
                    max_num_batched_tokens=MAX_NUM_SEQS * max(map(len, workload.prompts)),
                    max_model_len=workload.max_model_len, log_steps=True)
    replay(engine, workload.prompts[:2], [benchmark_params(4)] * 2)  # warm-up
    engine.step_log.clear()
    records = replay(engine, workload.prompts, [benchmark_params(n) for n in workload.output_lens])
    metrics = calculate_metrics(records)
    metrics["num_steps"] = len(engine.step_log)
    return metrics


def run_timed(fn, workload: Workload, device) -> dict:
    """Output tokens/s of a system that reports no per-token times: requested tokens / wall time."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    duration = time.perf_counter() - start
    return {"duration": duration, "total_output_tokens": sum(workload.output_lens),
            "output_throughput": sum(workload.output_lens) / duration}


def run_system(system: str, lm, model, workload: Workload) -> dict | None:
    hf_model, pad = lm.model, lm.config.pad_token_id or 0
    if system in ("engine-static", "engine-continuous"):
        return run_engine(model, workload, system.removeprefix("engine-"))
    if system == "hf-static-generate":
        static_batched_generate(hf_model, workload.prompts[:2], [4, 4], MAX_NUM_SEQS, pad)  # warm-up
        return run_timed(lambda: static_batched_generate(hf_model, workload.prompts, workload.output_lens,
                                                         MAX_NUM_SEQS, pad), workload, lm.device)
    if system == "hf-generate-batch":
        if len(set(workload.output_lens)) > 1:
            return None  # one max_new_tokens for all requests: it cannot run "mixed" as asked
        sizing = dict(max_batch_tokens=2048, num_blocks=MAX_NUM_SEQS * (-(-workload.max_model_len // 64)) + 8)
        continuous_batched_generate(hf_model, workload.prompts[:2], 4, **sizing)  # warm-up
        return run_timed(lambda: continuous_batched_generate(hf_model, workload.prompts, workload.output_lens[0],
                                                             **sizing), workload, lm.device)
    if system == "hf-sequential":
        hf.greedy_generate(hf_model, torch.tensor([workload.prompts[0]], device=lm.device), 4)  # warm-up
        return run_timed(lambda: [hf.greedy_generate(hf_model, torch.tensor([p], device=lm.device), n)
                                  for p, n in zip(workload.prompts, workload.output_lens)], workload, lm.device)
    raise ValueError(f"unknown system {system!r}")


SYSTEMS = ("engine-continuous", "engine-static", "hf-static-generate", "hf-generate-batch", "hf-sequential")


@torch.no_grad()
def decode_step_costs(lm, model, batch: int = MAX_NUM_SEQS, context: int = 288, repeats: int = 15) -> dict:
    """Median ms of one decode step of `batch` sequences at `context` tokens: the engine's step,
    the course model's bare forward, and transformers' [batch, 1] forward with a KV cache."""
    device = lm.device
    engine = Engine(model, max_num_seqs=batch, max_num_batched_tokens=batch * context,
                    max_model_len=context + 2 * repeats + 8)
    prompt = random_prompt_ids(lm.config, context, seed=1)[0].tolist()
    for _ in range(batch):
        engine.add_request(prompt, benchmark_params(2 * repeats + 4))
    engine.step()  # every prefill; what follows are decode steps of `batch` sequences
    engine_step = benchmark(engine.step, device=device, warmup=2, repeats=repeats)

    cache = engine.kv_store.cache
    tokens = torch.randint(0, 250, (batch,), device=device)
    positions, slots = torch.full((batch,), context), torch.arange(batch)
    kv = PagedKV.for_slots(cache, positions, slots)  # the step's block tables, as the engine's runner builds them
    bare = benchmark(lambda: model(tokens, positions, kv, logits_rows=torch.arange(batch, device=device)),
                     device=device, warmup=2, repeats=repeats)

    hf_cache = hf.new_cache(lm.model)
    hf.forward(lm.model, torch.tensor([prompt] * batch, device=device), hf_cache)
    step_ids = tokens[:, None]
    hf_bare = benchmark(lambda: hf.forward(lm.model, step_ids, hf_cache), device=device, warmup=2, repeats=repeats)
    return {"batch": batch, "context": context, "engine_step_ms": engine_step.median_ms,
            "model_forward_ms": bare.median_ms, "hf_forward_ms": hf_bare.median_ms}


def summarize(runs: dict, step_costs: dict) -> dict:
    cont = {w: runs[w]["engine-continuous"]["output_throughput"] for w in runs}
    measured = {
        "continuous_vs_hf_static_mixed": cont["mixed"] / runs["mixed"]["hf-static-generate"]["output_throughput"],
        "continuous_vs_hf_static_uniform": cont["uniform"] / runs["uniform"]["hf-static-generate"]["output_throughput"],
        "continuous_vs_generate_batch": cont["uniform"] / runs["uniform"]["hf-generate-batch"]["output_throughput"],
        "decode_step_vs_bare_forward": step_costs["engine_step_ms"] / step_costs["hf_forward_ms"],
    }
    summary = {}
    for key, value in measured.items():
        op, target = TARGETS[key]
        summary[key] = {"measured": round(value, 3), "target": f"{op} {target}",
                        "met": value >= target if op == ">=" else value <= target}
    summary["decode_step_vs_own_model_forward"] = {
        "measured": round(step_costs["engine_step_ms"] / step_costs["model_forward_ms"], 3),
        "note": "the engine's overhead (schedule, inputs, sampling, update) over its own model's forward"}
    return summary


def plot(runs: dict, step_costs: dict, meta: dict):
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.2), gridspec_kw={"width_ratios": [2, 2, 1.3]})
    for ax, (workload, by_system) in zip(axes, runs.items()):
        names = [s for s in SYSTEMS if by_system.get(s)]
        values = [by_system[s]["output_throughput"] for s in names]
        bars = ax.barh(names, values, color=["C0" if s.startswith("engine") else "C7" for s in names])
        ax.bar_label(bars, fmt="%.0f", padding=3, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("output tokens/s (higher is better)")
        skipped = [s for s in SYSTEMS if s in by_system and not by_system[s]]
        ax.set_title(f'"{workload}" workload, {len(names)} systems in one run'
                     + (f"\n(not run: {', '.join(skipped)}, one max_new_tokens for all)" if skipped else ""), fontsize=9)
    labels = ["engine step()", "own model forward", "transformers forward"]
    values = [step_costs[k] for k in ("engine_step_ms", "model_forward_ms", "hf_forward_ms")]
    axes[2].bar(labels, values, color=["C0", "C2", "C7"])
    axes[2].set_ylabel("ms per decode step (median)")
    axes[2].set_title(f"one decode step, batch {step_costs['batch']}, {step_costs['context']} tokens", fontsize=9)
    axes[2].tick_params(axis="x", labelsize=7, rotation=15)
    return save_figure(fig, "05_engine_bench", meta)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=None, help="cpu or gpu (default: picked from the hardware)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: leave as is)")
    parser.add_argument("--num-prompts", type=int, default=64)
    args = parser.parse_args(argv)
    profile = pick_profile(args.profile)
    lm = load_model(profile=profile)
    model = Transformer.from_hf(lm.model)
    runs = {}
    with cpu_threads(args.threads):
        with tqdm(total=2 * len(SYSTEMS), desc="systems x workloads") as bar:
            for name in ("uniform", "mixed"):
                workload = make_workload(name, lm.config, args.num_prompts)
                runs[name] = {}
                for system in SYSTEMS:
                    bar.set_postfix_str(f"{name}: {system}")
                    runs[name][system] = run_system(system, lm, model, workload)
                    bar.update(1)
        step_costs = decode_step_costs(lm, model)
    meta = provenance(lm)
    meta["threads"] = str(torch.get_num_threads() if args.threads is None else args.threads)
    summary = summarize(runs, step_costs)
    document = {"metadata": meta, "summary": summary, "decode_step": step_costs,
                "workloads": {"uniform": "64 x 256 in x 64 out", "mixed": "64 x U[32,512] in x U[16,128] out, seed 0"},
                "runs": runs}
    path = results_dir() / f"05_engine_bench_{profile.name}.json"
    path.write_text(json.dumps(document, indent=2) + "\n")
    figure = plot(runs, step_costs, meta)
    for key, value in summary.items():
        print(f"{key}: {value}")
    print(f"wrote {path} and {figure}")
    return document


if __name__ == "__main__":
    main()
