"""Four systems, one workload, in interleaved rounds: `transformers` sequential `generate()`
(week 03's baseline), the course engine behind its server (its engine core in a process of its
own, the default, and in a thread of the server's process), and vLLM behind its own server.

    python -m infer.experiments.side_by_side      # writes results/07_side_by_side_<profile>.json and a figure

Both HTTP servers are measured by vLLM's own client, `vllm bench serve` (through
infer.serve.vllm_server.run_vllm_bench), on the same prompts (its random dataset, seeded per
concurrency), serving the same weights (the vLLM server loads the folder that export.py writes).
The sequential baseline is week 03's in-process harness on the same prompts (the course client's
workload_for_model draws vLLM's random dataset): same metrics, no HTTP at all.

Each concurrency (1, 4, 16, 32) is measured in rounds: vLLM, course, course in-process,
sequential, vLLM, ... (three), every server running throughout, so that a slow spell of the
machine hits every system alike. The summary holds each system's median over the rounds with
their range; the course server's output throughput over vLLM's at concurrency 32 and its median
TPOT against vLLM's at concurrency 1 (issue 21's targets), taken within each round; and, from the
course servers' own time counters read before and after each run, where a serving step goes
(infer.experiments.serving_breakdown).

Cores: the course server's engine computes on as many torch threads as the machine has cores;
vLLM's CPU build binds one OpenMP thread per core it computes on and reserves a core for its
front end and scheduler (on two cores: one each). The run records both as the servers' logs
state them.
"""

import argparse
import itertools
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from infer.experiments.rounds import MIN_ROUNDS, format_spread, interleaved_rounds, ratio_spread, spread
from infer.experiments.sequential_baseline import run_sequential_server, supported_percentiles
from infer.experiments.serving_breakdown import format_breakdown, per_step_ms, plot_breakdown, scrape_time_counters
from infer.metrics import calculate_metrics, save_results
from infer.models import load_model
from infer.profiles import dtype_name, pick_profile
from infer.provenance import provenance
from infer.serve.client import workload_for_model
from infer.serve.export import export_model
from infer.serve.server import EngineSettings, running_server_process
from infer.serve.vllm_server import KV_CACHE_GIB, run_vllm_bench, running_vllm_server, vllm_missing_reason

CONCURRENCY = (1, 4, 16, 32)
INPUT_LEN, OUTPUT_LEN = 256, 64
SYSTEMS = ("transformers-sequential", "course-server", "course-server-in-process", "vllm-server")
ROUND_ORDER = ("vllm-server", "course-server", "course-server-in-process", "transformers-sequential")  # each round
COURSE_SERVERS = {"course-server": True, "course-server-in-process": False}  # name: engine in its own process?
SUMMARY_CONCURRENCY = max(CONCURRENCY)
TPOT_CONCURRENCY = min(CONCURRENCY)
TARGET_COURSE_VS_VLLM = 1.0  # issue 21: output throughput at concurrency 32, and TPOT at concurrency 1 no higher


def prompts_for(concurrency: int) -> int:
    """Four requests per slot (128 at concurrency 32), and at least 20, so that a p90 has two
    requests beyond it at every level (sequential_baseline.supported_percentiles)."""
    return max(20, 4 * concurrency)


def bench_server(
    url: str,
    lm,
    folder: Path,
    result_dir: Path,
    name: str,
    concurrency: int,
    *,
    num_prompts: int | None = None,
    input_len: int = INPUT_LEN,
    output_len: int = OUTPUT_LEN,
) -> dict:
    """`vllm bench serve` against a server at `url`, closed loop at `concurrency` (by default with
    `prompts_for(concurrency)` requests of INPUT_LEN in / OUTPUT_LEN out tokens)."""
    return run_vllm_bench(
        url,
        lm.name,
        folder,
        result_dir,
        name,
        num_prompts=num_prompts or prompts_for(concurrency),
        input_len=input_len,
        output_len=output_len,
        max_concurrency=concurrency,
        seed=concurrency,
    )


def bench_course_server(url: str, lm, folder: Path, result_dir: Path, name: str, concurrency: int) -> dict:
    """`bench_server`, with where the server's steps went during the run (its /metrics time counters)."""
    before = scrape_time_counters(url)
    result = bench_server(url, lm, folder, result_dir, name, concurrency)
    return {**result, "breakdown": per_step_ms(before, scrape_time_counters(url))}


def run_sequential(lm, concurrency: int) -> dict:
    """Week 03's one-at-a-time `generate()` server over the same prompts, in process."""
    workload = workload_for_model(lm.config, prompts_for(concurrency), INPUT_LEN, OUTPUT_LEN, seed=concurrency)
    prompts = torch.tensor([r.prompt_ids for r in workload], device=lm.device)
    run_sequential_server(lm.model, prompts[:1], OUTPUT_LEN, 1)  # warm-up
    records = run_sequential_server(lm.model, prompts, OUTPUT_LEN, concurrency)
    return {"num_prompts": len(workload), **calculate_metrics(records)}


def measure(systems: dict[str, Callable[[int, str], dict]], rounds: int, progress: bool) -> list[dict]:
    """Every system at every concurrency, in interleaved rounds: one row per run. `systems` maps a
    name to a function (concurrency, a name for the run) -> vLLM-keyed result."""
    rows = []
    with tqdm(total=len(CONCURRENCY) * rounds * len(systems), desc="side by side", disable=not progress) as bar:
        for concurrency in CONCURRENCY:
            runners = {name: one_run(systems[name], name, concurrency, bar) for name in ROUND_ORDER if name in systems}
            results = interleaved_rounds(runners, rounds, progress=bar)
            rows += [
                run_row(name, concurrency, index, result)
                for name, by_round in results.items()
                for index, result in enumerate(by_round)
            ]
    return rows


def one_run(system: Callable[[int, str], dict], name: str, concurrency: int, bar) -> Callable[[], dict]:
    """A call of `system` at `concurrency`, each run named after its round (vLLM's client saves it under that name)."""
    rounds = itertools.count()

    def run() -> dict:
        bar.set_postfix_str(f"c={concurrency}: {name}")
        return system(concurrency, f"{name}_c{concurrency}_round{next(rounds)}")

    return run


def run_servers(
    lm,
    settings: EngineSettings,
    rounds: int = MIN_ROUNDS,
    progress: bool = True,
    log_dir: str = "_build/serve_logs",
    vllm_url: str | None = None,
) -> tuple[list[dict], dict]:
    """The HTTP servers (each a process of its own, logs in `log_dir`) and the sequential baseline,
    at every concurrency in interleaved rounds; and the cores each server computed on. `vllm_url`:
    a vLLM server already running (serving the exported folder under the model's name)."""
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    folder, bench_dir = export_model(lm), log_dir / "bench"
    course_log, vllm_log = log_dir / "course_server.log", log_dir / "server.log"
    in_process, in_process_log = replace(settings, engine_process=False), log_dir / "course_server_in_process.log"
    with (
        running_server_process(lm.profile.name, settings, course_log) as course_url,
        running_server_process(lm.profile.name, in_process, in_process_log) as thread_url,
    ):
        systems = {
            "course-server": lambda c, name: bench_course_server(course_url, lm, folder, bench_dir, name, c),
            "course-server-in-process": lambda c, name: bench_course_server(thread_url, lm, folder, bench_dir, name, c),
            "transformers-sequential": lambda c, name: run_sequential(lm, c),
        }
        reason = None if vllm_url else vllm_missing_reason()
        if reason:
            print(f"vLLM skipped: {reason}")
            return measure(systems, rounds, progress), cores_used(course_log, None, in_process_log)
        if vllm_url:
            systems["vllm-server"] = lambda c, name: bench_server(vllm_url, lm, folder, bench_dir, name, c)
            return measure(systems, rounds, progress), cores_used(course_log, None, in_process_log)
        with running_vllm_server(
            folder, lm.name, vllm_log, dtype=dtype_name(lm.dtype), max_model_len=settings.max_model_len
        ) as url:
            systems["vllm-server"] = lambda c, name: bench_server(url, lm, folder, bench_dir, name, c)
            return measure(systems, rounds, progress), cores_used(course_log, vllm_log, in_process_log)


def course_cores(log: Path) -> str:
    """Where a course server's model computed, from its log: the engine core's line if it ran one."""
    text = log.read_text()
    core = re.search(r"engine core: process \d+, (\d+) torch thread", text)
    if core:
        return (
            f"engine core on {core.group(1)} torch thread(s), in a process of its own (every core but one); "
            "the HTTP front end in another process"
        )
    device = re.search(r"device: ([^|]+?) \|", text)
    return f"{device.group(1) if device else 'unknown'}, in one process with its HTTP front end"


def cores_used(course_log: Path, vllm_log: Path | None, in_process_log: Path | None = None) -> dict:
    """What each server's log says about the cores its model computed on."""
    cores = {"course-server": course_cores(course_log)}
    if in_process_log is not None:
        cores["course-server-in-process"] = course_cores(in_process_log)
    if vllm_log is not None:
        text = vllm_log.read_text()
        found = {
            key: re.search(pattern, text)
            for key, pattern in (
                ("bound", r"core ids=(\[[^\]]*\])"),
                ("reserved", r"reserved_cpus=(\[[^\]]*\])"),
                ("threads", r"Reducing Torch threads from (\d+) to (\d+)"),
            )
        }
        cores["vllm-server"] = (
            f"model on cores {found['bound'].group(1) if found['bound'] else 'unknown'} (one OpenMP thread each), "
            f"cores {found['reserved'].group(1) if found['reserved'] else 'unknown'} reserved for its front end and "
            f"scheduler"
            + (
                f"; torch threads reduced from {found['threads'].group(1)} to {found['threads'].group(2)}"
                if found["threads"]
                else ""
            )
        )
    return cores


KEPT_KEYS = (
    "num_prompts",
    "completed",
    "failed",
    "duration",
    "total_output_tokens",
    "output_throughput",
    "request_throughput",
    "mean_e2el_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p90_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "p99_itl_ms",
    "median_e2el_ms",
    "p90_e2el_ms",
    "p99_e2el_ms",
)


def run_row(system: str, concurrency: int, round_index: int, result: dict) -> dict:
    return {
        "system": system,
        "max_concurrency": concurrency,
        "round": round_index,
        "input_len": INPUT_LEN,
        "output_len": OUTPUT_LEN,
        **{key: result[key] for key in KEPT_KEYS},
        **({"breakdown": result["breakdown"]} if "breakdown" in result else {}),
    }


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per system and concurrency: each metric's median over the rounds, and the
    output throughput's range."""
    groups = {}
    for run in runs:
        groups.setdefault((run["system"], run["max_concurrency"]), []).append(run)
    rows = []
    for (system, concurrency), group in groups.items():
        throughput = spread([r["output_throughput"] for r in group])
        row = {
            "system": system,
            "max_concurrency": concurrency,
            "rounds": len(group),
            **{key: statistics.median(r[key] for r in group) for key in KEPT_KEYS},
            "output_throughput_min": throughput["min"],
            "output_throughput_max": throughput["max"],
        }
        if "breakdown" in group[0]:
            row["breakdown"] = {
                part: statistics.median(r["breakdown"][part] for r in group) for part in group[0]["breakdown"]
            }
        rows.append(row)
    return rows


def summarize(runs: list[dict], rounds: int) -> dict:
    """Each system's medians; at the top concurrency, the course server's output throughput over
    vLLM's, over the sequential baseline's and over its own in-process mode's; at concurrency 1,
    its median TPOT over vLLM's. Every ratio is taken within each round."""

    def runs_of(system: str, concurrency: int) -> list[dict]:
        return sorted((r for r in runs if r["system"] == system and r["max_concurrency"] == concurrency), key=round_of)

    summary = {
        "rounds": rounds,
        "round_order": list(ROUND_ORDER),
        "concurrency": SUMMARY_CONCURRENCY,
        "target_course_vs_vllm": TARGET_COURSE_VS_VLLM,
        "medians": median_rows(runs),
    }
    for concurrency, other, metric, key in (
        (SUMMARY_CONCURRENCY, "vllm-server", "output_throughput", "course_vs_vllm_output_throughput"),
        (SUMMARY_CONCURRENCY, "transformers-sequential", "output_throughput", "course_vs_sequential_output_throughput"),
        (SUMMARY_CONCURRENCY, "course-server-in-process", "output_throughput", "split_vs_in_process_output_throughput"),
        (TPOT_CONCURRENCY, "vllm-server", "median_tpot_ms", "course_vs_vllm_median_tpot_c1"),
    ):
        course, others = runs_of("course-server", concurrency), runs_of(other, concurrency)
        if course and len(others) == len(course):
            summary[key] = ratio_spread(course, others, metric)
    if "course_vs_vllm_output_throughput" in summary:
        summary["target_met"] = {
            "output_throughput_c32": summary["course_vs_vllm_output_throughput"]["median"] >= TARGET_COURSE_VS_VLLM,
            "median_tpot_c1": summary["course_vs_vllm_median_tpot_c1"]["median"] <= 1.0,
        }
    return summary


def round_of(run: dict) -> int:
    return run["round"]


def format_table(medians: list[dict]) -> str:
    """Medians over the rounds (the throughput's range beside it); p90 only where the requests support it."""
    lines = [
        f"{'system':<24} {'conc':>4} {'n':>4} | {'out tok/s (range)':>21} | {'TTFT p50':>8} {'p90':>8} | "
        f"{'TPOT p50':>8} {'p90':>7} | failed"
    ]
    for r in sorted(medians, key=lambda r: (SYSTEMS.index(r["system"]), r["max_concurrency"])):
        p90 = 90 in supported_percentiles(r["num_prompts"], (90,))
        ttft90, tpot90 = (
            (f"{r['p90_ttft_ms']:>8.1f}", f"{r['p90_tpot_ms']:>7.2f}") if p90 else (f"{'-':>8}", f"{'-':>7}")
        )
        throughput = f"{r['output_throughput']:.1f} ({r['output_throughput_min']:.0f}-{r['output_throughput_max']:.0f})"
        lines.append(
            f"{r['system']:<24} {r['max_concurrency']:>4} {r['num_prompts']:>4} | {throughput:>21} | "
            f"{r['median_ttft_ms']:>8.1f} {ttft90} | {r['median_tpot_ms']:>8.2f} {tpot90} | {r['failed']:g}"
        )
    return "\n".join(lines)


def plot_side_by_side(runs: list[dict], meta: dict):
    """Throughput, TTFT and TPOT (p50 solid, p90 dashed) against concurrency, one colour per system,
    from median rows (median_rows: each value the median over the rounds, the throughput's range as
    error bars); the three panels stacked, so that each spans the width where the figure is read."""
    import matplotlib.pyplot as plt

    from infer.plotting import COLUMN_WIDTH_IN, save_figure

    fig, axes = plt.subplots(3, 1, figsize=(COLUMN_WIDTH_IN, 10), sharex=True)
    for index, system in enumerate(SYSTEMS):
        rows = sorted((r for r in runs if r["system"] == system), key=lambda r: r["max_concurrency"])
        if not rows:
            continue
        x = [r["max_concurrency"] for r in rows]
        color = f"C{index}"
        throughput = [r["output_throughput"] for r in rows]
        spread = [
            [t - r["output_throughput_min"] for t, r in zip(throughput, rows)],
            [r["output_throughput_max"] - t for t, r in zip(throughput, rows)],
        ]
        axes[0].errorbar(x, throughput, yerr=spread, marker="o", capsize=3, color=color, label=system)
        for ax, metric in ((axes[1], "ttft"), (axes[2], "tpot")):
            ax.plot(x, [r[f"median_{metric}_ms"] for r in rows], marker="o", color=color)
            ax.plot(x, [r[f"p90_{metric}_ms"] for r in rows], marker="^", linestyle="--", color=color)
    labels = ("output throughput (tokens/s;\nbars: range over rounds)", "TTFT (ms)", "TPOT (ms)")
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
        ax.set_title(f"{metric}: p50 solid, p90 dashed")
    fig.suptitle(
        f"{INPUT_LEN} in / {OUTPUT_LEN} out tokens, EOS ignored, greedy; medians of interleaved rounds; vLLM's "
        f"client for both servers (transformers sequential: week 03's in-process harness)"
    )
    return save_figure(fig, "07_side_by_side", meta)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m infer.experiments.side_by_side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"interleaved rounds (default {MIN_ROUNDS})")
    parser.add_argument(
        "--vllm-url", default=None, help="a running vLLM server of the exported model (default: start one)"
    )
    args = parser.parse_args(argv)
    profile = pick_profile()
    lm = load_model(profile=profile, weights="random")
    settings = EngineSettings(max_num_seqs=max(CONCURRENCY))
    started = time.perf_counter()
    meta = provenance(lm)
    runs, cores = run_servers(lm, settings, args.rounds, progress=not args.no_progress, vllm_url=args.vllm_url)
    summary = summarize(runs, args.rounds)
    path = save_results(
        f"07_side_by_side_{profile.name}",
        runs,
        meta,
        summary=summary,
        settings={
            "engine": asdict(settings),
            "vllm": {
                "dtype": dtype_name(lm.dtype),
                "VLLM_CPU_KVCACHE_SPACE_GiB": KV_CACHE_GIB,
                "started_by_this_run": args.vllm_url is None,
            },
            "client": "vllm bench serve for every server; the sequential baseline in process",
            "cores": cores,
            "torch_threads_sequential": torch.get_num_threads(),
            "wall_s": time.perf_counter() - started,
        },
    )
    print(format_table(summary["medians"]))
    for key in (
        "course_vs_vllm_output_throughput",
        "course_vs_sequential_output_throughput",
        "split_vs_in_process_output_throughput",
        "course_vs_vllm_median_tpot_c1",
    ):
        if key in summary:
            print(f"{key}: {format_spread(summary[key])}")
    print(f"cores: {cores}")
    steps = [r for r in summary["medians"] if "breakdown" in r and r["max_concurrency"] in (1, SUMMARY_CONCURRENCY)]
    print(format_breakdown(steps))
    figures = plot_side_by_side(summary["medians"], meta), plot_breakdown(steps, meta)
    print(f"saved {path} and {figures} in {(time.perf_counter() - started) / 60:.1f} minutes")


if __name__ == "__main__":
    main()
