"""Week 06's measurements in one run: `python -m infer.experiments.chunked_prefill_run` (a few minutes on two
CPU cores). Writes, for the profile in use (cpu unless INFER_PROFILE says otherwise):

- results/06_stalls_<profile>.json and figures/06_stalls.png: prefill-first vs chunked while
  long prompts arrive among decoding streams (Gantt per request, ITL distribution);
- results/06_mixing_<profile>.json: prefill-only, decode-only and mixed steps of equal size;
- results/06_sweep_<profile>.json and figures/06_sweep.png: token budget x concurrency, goodput;
- results/06_simulator_validation_<profile>.json and figures/06_simulator_validation.png: the
  step-cost model fitted on calibration runs, checked on the sweep's runs (held out);
- results/06_sweep_gpu_simulated.json and figures/06_sweep_gpu_simulated.png: the gpu profile's
  grid, which this machine cannot run, simulated with a roofline step cost and stamped SIMULATED.

Everything runs on one CPU thread (infer.timing.cpu_threads), so that a busy second core slows
the variants alike instead of stalling a multi-threaded op.
"""

import argparse
from dataclasses import replace

import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

from infer.engine.simulator import simulate
from infer.engine.step_costs import FEATURES, LinearStepCost, RooflineStepCost
from infer.experiments.chunked_prefill import (
    best_budget,
    median_step_s,
    relative_error,
    serve,
    stall_summary,
    stall_workload,
    summarize_run,
    time_step_kinds,
)
from infer.experiments.chunked_prefill_plots import (
    plot_budget_sweep,
    plot_gantt,
    plot_itl_distribution,
    plot_simulated_vs_measured,
)
from infer.metrics import calculate_metrics, request_latencies_ms, save_results, slo_from_profile
from infer.model import Transformer
from infer.models import MODEL_SPECS, load_model
from infer.plotting import save_figure
from infer.profiles import PROFILES, pick_profile
from infer.provenance import provenance
from infer.timing import cpu_threads
from infer.workloads import Workload, arrival_offsets, mixed_workload

CPU_BUDGETS = (32, 128, 512, 2048)
CPU_CONCURRENCY = (4, 16)
CHUNKED_STALL_BUDGET = 128
# The gpu profile's grid (seed 004): 2,048 input / 64 output tokens, budgets 512 to 16,384.
GPU_BUDGETS = (512, 1024, 2048, 4096, 8192, 16384)
GPU_REQUEST_RATES = (50.0, 110.0, 150.0)
# Datasheet numbers of the GPU the roofline models (H100 SXM, bf16 dense), and an assumed step overhead.
GPU_ROOFLINE = dict(device="H100 SXM (datasheet)", peak_flops=989e12, bandwidth=3.35e12, overhead_ms=4.0)


def stalls(model, vocab_size: int, meta: dict, profile: str):
    _, decode_s = median_step_s(model, 24, 64, vocab_size)
    prefill_s, _ = median_step_s(model, 1, 1984, vocab_size)
    workload = stall_workload(decode_s, prefill_s, vocab_size)
    runs = {
        "prefill-first": serve(model, workload, "continuous", 2048),
        "chunked": serve(model, workload, "chunked", CHUNKED_STALL_BUDGET),
    }
    summaries = {name: summarize_run(run) for name, run in runs.items()}
    summary = stall_summary(summaries["prefill-first"], summaries["chunked"])
    save_results(
        f"06_stalls_{profile}",
        list(summaries.values()),
        meta,
        decode_step_ms=decode_s * 1e3,
        longest_prefill_ms=prefill_s * 1e3,
        summary=summary,
        policies=list(summaries),
    )
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5))
    for ax, (name, run) in zip(axes, runs.items()):
        plot_gantt(ax, run.steps, f"{name} (budget {run.budget})")
    plot_itl_distribution(
        axes[2], {name: [g for r in run.records for g in request_latencies_ms(r).itls_ms] for name, run in runs.items()}
    )
    save_figure(fig, "06_stalls", meta)
    return runs, summary


def mixing(model, meta: dict, profile: str):
    results = [{"num_tokens": n, "context": 256, **time_step_kinds(model, n, 256)} for n in (32, 128)]
    save_results(f"06_mixing_{profile}", results, meta)
    return results


def sweep(model, vocab_size: int, slo_ms: dict, meta: dict, profile: str):
    runs, records = [], []
    grid = [(c, b) for c in CPU_CONCURRENCY for b in CPU_BUDGETS]
    for concurrency, budget in tqdm(grid, desc="budget x concurrency"):
        workload = mixed_workload(
            f"sweep-c{concurrency}", vocab_size, 3 * concurrency, (32, 512), (16, 32), seed=concurrency
        )
        run = serve(model, workload, "chunked", budget, max_num_seqs=concurrency, max_concurrency=concurrency)
        runs.append((concurrency, run))
        records.append({"max_concurrency": concurrency, **summarize_run(run, slo_ms)})
    summary = {
        f"concurrency {c}": {
            "goodput_best_budget": best_budget(records, "max_concurrency", c, "request_goodput"),
            "throughput_best_budget": best_budget(records, "max_concurrency", c, "output_throughput"),
        }
        for c in CPU_CONCURRENCY
    }
    save_results(f"06_sweep_{profile}", records, meta, slo_ms=slo_ms, summary=summary)
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    plot_budget_sweep(axes, records, "max_concurrency", "concurrency")
    save_figure(fig, "06_sweep", meta)
    return runs, summary


def calibration_runs(model, vocab_size: int):
    """Runs whose steps fit the cost model: varied prompts, budgets and policies, none of them the sweep's."""
    workload = mixed_workload("calibration", vocab_size, 16, (16, 768), (8, 32), seed=1234)
    return [
        serve(model, workload, policy, budget, max_num_seqs=8)
        for policy, budget in (("chunked", 24), ("chunked", 160), ("continuous", 1024))
    ]


def validate_simulator(fit_runs, held_out, meta: dict, profile: str):
    steps = [s for run in fit_runs for s in run.steps]
    cost = LinearStepCost.fit([s.shape for s in steps], [s.ms for s in steps])
    rows = []
    for concurrency, run in held_out:
        w: Workload = run.workload
        sim = simulate(
            cost,
            w.prompt_lens,
            w.output_lens,
            policy=run.policy,
            max_num_seqs=concurrency,
            max_num_batched_tokens=run.budget,
            offsets=w.offsets,
            max_concurrency=concurrency,
        )
        measured, simulated = calculate_metrics(run.records), calculate_metrics(sim.records)
        keys = ("median_ttft_ms", "median_tpot_ms", "output_throughput")
        # the cost model on this run's own steps: a large error here is the machine's speed having
        # changed since calibration, not the simulated schedule being wrong
        step_errors = cost.relative_errors([s.shape for s in run.steps], [s.ms for s in run.steps])
        rows.append(
            {
                "workload": w.name,
                "max_num_batched_tokens": run.budget,
                "max_concurrency": concurrency,
                "measured": {k: measured[k] for k in keys},
                "simulated": {k: simulated[k] for k in keys},
                "relative_error": {k: relative_error(simulated[k], measured[k]) for k in keys},
                "median_step_cost_error": float(np.median(step_errors)),
            }
        )
    largest = max(abs(e) for row in rows for e in row["relative_error"].values())
    summary = {
        "largest_abs_relative_error": largest,
        "target": 0.10,
        "within_target": largest <= 0.10,
        "fit_steps": len(steps),
        "fit_ms_per_unit": cost.ms_per_unit,
        "features": list(FEATURES),
    }
    save_results(f"06_simulator_validation_{profile}", rows, meta, summary=summary)
    fig, ax = plt.subplots(figsize=(6.5, 6))
    plot_simulated_vs_measured(ax, rows)
    save_figure(fig, "06_simulator_validation", meta)
    return summary


def gpu_grid_simulated():
    """The gpu profile's sweep, simulated with a roofline step cost: nothing here is measured."""
    gpu = PROFILES["gpu"]
    cost = RooflineStepCost.for_model(MODEL_SPECS[gpu.model_name].config(), 2, **GPU_ROOFLINE)
    slo_ms = slo_from_profile(gpu)
    records = []
    for rate in GPU_REQUEST_RATES:
        offsets = arrival_offsets(gpu.grid.num_prompts, rate, seed=0)
        for budget in GPU_BUDGETS:
            sim = simulate(
                cost,
                [2048] * gpu.grid.num_prompts,
                [64] * gpu.grid.num_prompts,
                policy="chunked",
                max_num_seqs=256,
                max_num_batched_tokens=budget,
                max_model_len=2048 + 64,
                offsets=offsets,
            )
            records.append(
                {
                    "request_rate": rate,
                    "policy": "chunked",
                    "max_num_batched_tokens": budget,
                    **calculate_metrics(sim.records, slo_ms=slo_ms, percentiles=(50, 99)),
                }
            )
    summary = {
        f"rate {r:g}/s": {
            "goodput_best_budget": best_budget(records, "request_rate", r, "request_goodput"),
            "throughput_best_budget": best_budget(records, "request_rate", r, "output_throughput"),
        }
        for r in GPU_REQUEST_RATES
    }
    # provenance of the machine that ran the simulation, with the simulated device in its place
    meta = {
        **provenance(replace(gpu, device="cpu"), kind="simulated"),
        "model": gpu.model_name,
        "weights": "none (simulated)",
        "device": cost.assumptions(),
        "profile": "gpu (simulated)",
    }
    save_results(
        "06_sweep_gpu_simulated",
        records,
        meta,
        slo_ms=slo_ms,
        summary=summary,
        assumptions={
            "cost_model": cost.as_dict(),
            "in_tokens": 2048,
            "out_tokens": 64,
            "max_num_seqs": 256,
            "num_prompts": gpu.grid.num_prompts,
            "arrivals": "Poisson",
        },
    )
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    plot_budget_sweep(axes, records, "request_rate", "req/s", stamp="SIMULATED")
    fig.suptitle(
        f"SIMULATED: {gpu.model_name} shape, 2,048 in / 64 out, {cost.assumptions()}", color="red", fontsize=10
    )
    save_figure(fig, "06_sweep_gpu_simulated", meta)
    return summary


PARTS = ("stalls", "mixing", "sweep", "gpu")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        nargs="+",
        choices=PARTS,
        default=PARTS,
        help="run these parts only (sweep includes the simulator's validation)",
    )
    parts = parser.parse_args().only
    profile = pick_profile()
    lm = load_model(profile=profile, quiet=True)
    print(lm.header(), flush=True)
    model, vocab, meta = Transformer.from_hf(lm.model), lm.config.vocab_size, provenance(lm)
    with cpu_threads(1 if profile.device == "cpu" else None):
        if "stalls" in parts:
            print("stalls:", stalls(model, vocab, meta, profile.name)[1], flush=True)
        if "mixing" in parts:
            print("mixing:", mixing(model, meta, profile.name), flush=True)
        if "sweep" in parts:
            fit_runs = calibration_runs(model, vocab)  # just before the held-out runs: a shared machine's speed drifts
            sweep_runs, best = sweep(model, vocab, slo_from_profile(profile), meta, profile.name)
            print("sweep:", best, flush=True)
            print("simulator:", validate_simulator(fit_runs, sweep_runs, meta, profile.name))
    if "gpu" in parts:
        print("gpu grid (simulated):", gpu_grid_simulated())


if __name__ == "__main__":
    main()
