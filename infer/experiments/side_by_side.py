"""Three servers, one workload, one run: `transformers` sequential `generate()` (week 03's
baseline), the course engine behind its server, and vLLM behind its own server.

    python -m infer.experiments.side_by_side      # writes results/07_side_by_side_<profile>.json and a figure

The two HTTP servers are measured by the same client (infer.serve.client) on the same prompts
(vLLM's random workload as token ids), serving the same weights (the vLLM server loads the folder
that export.py writes). The sequential baseline is week 03's in-process harness: same prompts,
same metrics, no HTTP, so it carries no network overhead at all; the servers do.

Concurrency 1, 4, 16 and 32, each after a warm-up request. The summary gives the course server's
output throughput over vLLM's at the highest concurrency.
"""

import argparse
import os
import time
from dataclasses import asdict

import torch

from infer.experiments.sequential_baseline import BASELINE_SIZES, prompts_per_cell, run_sequential_server
from infer.metrics import calculate_metrics, save_results
from infer.models import load_model
from infer.profiles import BenchmarkGrid, dtype_name, pick_profile
from infer.provenance import provenance
from infer.serve.client import run_benchmark, workload_for_model
from infer.serve.export import export_model
from infer.serve.server import EngineSettings, running_server_process
from infer.serve.vllm_server import KV_CACHE_GIB, running_vllm_server, vllm_missing_reason

CONCURRENCY = (1, 4, 16, 32)
INPUT_LEN, OUTPUT_LEN = 256, 64
SYSTEMS = ("transformers-sequential", "course-server", "vllm-server")
SUMMARY_CONCURRENCY = max(CONCURRENCY)


def prompts_for(concurrency: int) -> int:
    """Enough requests to refill every slot twice, and at least 16."""
    return max(16, 2 * concurrency)


def run_servers(lm, settings: EngineSettings, progress: bool = True, log_dir: str = "_build/serve_logs",
                vllm_url: str | None = None) -> list[dict]:
    """Both HTTP servers at every concurrency, the same client and prompts for both. Each server is
    a process of its own; their logs go to `log_dir`. `vllm_url`: a vLLM server already running
    (serving the exported folder under the model's name), instead of starting one."""
    os.makedirs(log_dir, exist_ok=True)
    runs = []

    def sweep(system: str, url: str):
        for concurrency in CONCURRENCY:
            workload = workload_for_model(lm.config, prompts_for(concurrency), INPUT_LEN, OUTPUT_LEN, seed=concurrency)
            result, _ = run_benchmark(url, lm.name, workload, max_concurrency=concurrency, progress=progress)
            runs.append(summary_row(system, concurrency, result))

    with running_server_process(lm.profile.name, settings, os.path.join(log_dir, "course_server.log")) as url:
        sweep("course-server", url)
    if vllm_url:
        sweep("vllm-server", vllm_url)
        return runs
    reason = vllm_missing_reason()
    if reason:
        print(f"vLLM skipped: {reason}")
        return runs
    folder = export_model(lm)
    with running_vllm_server(folder, lm.name, os.path.join(log_dir, "server.log"), dtype=dtype_name(lm.dtype),
                             max_model_len=settings.max_model_len) as url:
        sweep("vllm-server", url)
    return runs


def run_sequential(lm, progress: bool = True) -> list[dict]:
    """Week 03's one-at-a-time `generate()` server over the same prompts, in process."""
    from tqdm.auto import tqdm

    grid = BenchmarkGrid(input_lens=(INPUT_LEN,), output_lens=(OUTPUT_LEN,), concurrency=CONCURRENCY, num_prompts=64)
    sizes = BASELINE_SIZES[lm.profile.name]
    runs = []
    for concurrency in tqdm(CONCURRENCY, desc="transformers sequential", disable=not progress):
        n = prompts_per_cell(grid, sizes, concurrency)
        workload = workload_for_model(lm.config, n, INPUT_LEN, OUTPUT_LEN, seed=concurrency)
        prompts = torch.tensor([r.prompt_ids for r in workload], device=lm.device)
        run_sequential_server(lm.model, prompts[:1], OUTPUT_LEN, 1)  # warm-up
        records = run_sequential_server(lm.model, prompts, OUTPUT_LEN, concurrency)
        runs.append(summary_row("transformers-sequential", concurrency,
                                {"num_prompts": n, **calculate_metrics(records)}))
    return runs


KEPT_KEYS = ("num_prompts", "completed", "failed", "duration", "total_output_tokens", "output_throughput",
             "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms",
             "p99_itl_ms", "median_e2el_ms", "p99_e2el_ms")


def summary_row(system: str, concurrency: int, result: dict) -> dict:
    return {"system": system, "max_concurrency": concurrency, "input_len": INPUT_LEN, "output_len": OUTPUT_LEN,
            **{key: result[key] for key in KEPT_KEYS}}


def summarize(runs: list[dict]) -> dict:
    at = {(r["system"], r["max_concurrency"]): r for r in runs}
    course, vllm = at.get(("course-server", SUMMARY_CONCURRENCY)), at.get(("vllm-server", SUMMARY_CONCURRENCY))
    summary = {"concurrency": SUMMARY_CONCURRENCY, "target_course_vs_vllm": 0.8}
    if course and vllm:
        summary["course_vs_vllm_output_throughput"] = course["output_throughput"] / vllm["output_throughput"]
    baseline = at.get(("transformers-sequential", SUMMARY_CONCURRENCY))
    if course and baseline:
        summary["course_vs_sequential_output_throughput"] = course["output_throughput"] / baseline["output_throughput"]
    return summary


def format_table(runs: list[dict]) -> str:
    lines = [f"{'system':<24} {'conc':>4} {'n':>3} | {'out tok/s':>9} | {'TTFT p50':>8} {'p99':>8} | "
             f"{'TPOT p50':>8} {'p99':>7} | failed"]
    for r in runs:
        lines.append(f"{r['system']:<24} {r['max_concurrency']:>4} {r['num_prompts']:>3} | {r['output_throughput']:>9.1f} | "
                     f"{r['median_ttft_ms']:>8.1f} {r['p99_ttft_ms']:>8.1f} | {r['median_tpot_ms']:>8.2f} "
                     f"{r['p99_tpot_ms']:>7.2f} | {r['failed']}")
    return "\n".join(lines)


def plot_side_by_side(runs: list[dict], meta: dict):
    """Throughput, TTFT and TPOT (p50 solid, p99 dashed) against concurrency, one colour per system;
    the three panels stacked, so that each spans the width where the figure is read."""
    import matplotlib.pyplot as plt

    from infer.plotting import COLUMN_WIDTH_IN, save_figure

    fig, axes = plt.subplots(3, 1, figsize=(COLUMN_WIDTH_IN, 10), sharex=True)
    for index, system in enumerate(SYSTEMS):
        rows = sorted((r for r in runs if r["system"] == system), key=lambda r: r["max_concurrency"])
        if not rows:
            continue
        x = [r["max_concurrency"] for r in rows]
        color = f"C{index}"
        axes[0].plot(x, [r["output_throughput"] for r in rows], marker="o", color=color, label=system)
        for ax, metric in ((axes[1], "ttft"), (axes[2], "tpot")):
            ax.plot(x, [r[f"median_{metric}_ms"] for r in rows], marker="o", color=color)
            ax.plot(x, [r[f"p99_{metric}_ms"] for r in rows], marker="^", linestyle="--", color=color)
    labels = ("output throughput (tokens/s)", "TTFT (ms)", "TPOT (ms)")
    for ax, label in zip(axes, labels):
        ax.set_xscale("log", base=2)
        ax.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("concurrency (requests in flight)")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(title="one colour per system")
    for ax, metric in ((axes[1], "TTFT"), (axes[2], "TPOT")):
        ax.set_yscale("log")
        ax.set_title(f"{metric}: p50 solid, p99 dashed")
    fig.suptitle(f"{INPUT_LEN} in / {OUTPUT_LEN} out tokens, EOS ignored, greedy; one HTTP client for both servers "
                 f"(transformers sequential: week 03's in-process harness)")
    return save_figure(fig, "07_side_by_side", meta)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.side_by_side", description=__doc__)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--vllm-url", default=None, help="a running vLLM server of the exported model (default: start one)")
    args = parser.parse_args(argv)
    profile = pick_profile()
    lm = load_model(profile=profile, weights="random")
    settings = EngineSettings(max_num_seqs=max(CONCURRENCY))
    started = time.perf_counter()
    meta = provenance(lm)

    def save(runs: list[dict], complete: bool):
        """Saved after each part, so that an interrupted run keeps what it measured."""
        return save_results(f"07_side_by_side_{profile.name}", runs, meta, summary=summarize(runs), complete=complete,
                            settings={"engine": asdict(settings),
                                      "vllm": {"dtype": dtype_name(lm.dtype), "VLLM_CPU_KVCACHE_SPACE_GiB": KV_CACHE_GIB,
                                               "started_by_this_run": args.vllm_url is None},
                                      "torch_threads": torch.get_num_threads(),
                                      "wall_s": time.perf_counter() - started})

    runs = run_servers(lm, settings, progress=not args.no_progress, vllm_url=args.vllm_url)
    save(runs, complete=False)
    runs += run_sequential(lm, progress=not args.no_progress)
    path = save(runs, complete=True)
    print(format_table(runs))
    print(summarize(runs))
    print(f"saved {path} and {plot_side_by_side(runs, meta)}")


if __name__ == "__main__":
    main()
