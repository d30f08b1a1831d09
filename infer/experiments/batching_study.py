"""The week 05 experiments, sized per profile: static against continuous batching on a mixed
workload (with each step's slot occupancy), and a concurrency sweep of the continuous engine.

Everything runs the real engine in real time through `infer.engine.replay`, so the metrics are
week 03's, computed from per-token times."""

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np

from infer.engine.engine import Engine
from infer.engine.replay import replay
from infer.engine.sequence import benchmark_params
from infer.experiments.sequential_baseline import run_sequential_server
from infer.metrics import calculate_metrics, littles_law_holds, littles_law_in_flight
from infer.prompts import random_prompt_ids
from infer.workloads import Workload, mixed_workload


@dataclass(frozen=True)
class StudySizes:
    mixed_prompts: int  # the static vs continuous comparison
    mixed_input: tuple[int, int]  # input lengths, uniform in [low, high]
    mixed_output: tuple[int, int]
    mixed_slots: int  # max_num_seqs of that comparison (few, so the occupancy chart stays readable)
    sweep_concurrency: tuple[int, ...]
    sweep_input_len: int
    sweep_output_len: int
    sweep_rounds: int  # requests per level = rounds x concurrency: each slot refilled rounds - 1 times


STUDY_SIZES = {
    "cpu": StudySizes(16, (16, 128), (4, 32), 6, (1, 2, 4, 8, 16, 32, 64), 128, 16, 3),
    "gpu": StudySizes(64, (32, 2048), (16, 256), 16, (1, 2, 4, 8, 16, 32, 64), 2048, 64, 3),
    "gpu-dryrun": StudySizes(8, (8, 32), (2, 8), 4, (1, 4, 16), 32, 4, 3),
}


@dataclass(frozen=True)
class PolicyRun:
    policy: str
    metrics: dict
    occupancy: np.ndarray  # [slots, steps]: the request computed in each slot at each step, -1 if none
    step_kinds: list[str]  # "prefill" or "decode", per step


def comparison_workload(config, sizes: StudySizes, seed: int = 0) -> Workload:
    """The static vs continuous comparison's requests: varied prompt and output lengths, all at once."""
    return mixed_workload(
        "mixed", config.vocab_size, sizes.mixed_prompts, sizes.mixed_input, sizes.mixed_output, seed=seed
    )


def compare_policies(
    model, prompts: list[list[int]], output_lens: list[int], max_num_seqs: int, repeats: int = 3
) -> list[PolicyRun]:
    """Serve the same requests (all sent at once) with each policy, `repeats` times, the policies
    interleaved so that a busy moment of a shared machine hits both; one warm-up request first.
    Each policy keeps the run of its median output throughput (the steps are the same every time)."""
    longest = max(len(p) + n for p, n in zip(prompts, output_lens))
    trials: dict[str, list[tuple[dict, list]]] = {"static": [], "continuous": []}
    for _ in range(repeats):
        for policy in trials:
            engine = Engine(
                model,
                policy=policy,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_seqs * max(map(len, prompts)),
                max_model_len=longest,
                log_steps=True,
            )
            replay(engine, prompts[:1], benchmark_params(2))  # warm-up
            engine.step_log.clear()
            records = replay(engine, prompts, [benchmark_params(n) for n in output_lens])
            trials[policy].append((calculate_metrics(records), engine.step_log))
    runs = []
    for policy, results in trials.items():
        metrics, step_log = sorted(results, key=lambda r: r[0]["output_throughput"])[len(results) // 2]
        grid = np.full((max_num_seqs, len(step_log)), -1)
        for step, log in enumerate(step_log):
            for item in log.items:
                grid[item.slot, step] = int(item.request_id)  # replay numbers the requests as given
        kinds = [log.kind for log in step_log]
        runs.append(PolicyRun(policy, metrics, grid, kinds))
    return runs


def concurrency_sweep(model, config, sizes: StudySizes, progress=None) -> list[dict]:
    """Continuous engine at each concurrency level, with max_num_seqs at the level so that every
    admitted request runs. A closed loop, as vLLM's --max-concurrency: `sweep_rounds` x level
    requests queued, a new one sent the moment one ends, so that the level holds until the queue
    runs dry; each row says whether Little's law comes back to the level (infer.metrics)."""
    rows = []
    for level in sizes.sweep_concurrency:
        count = sizes.sweep_rounds * level
        prompts = [random_prompt_ids(config, sizes.sweep_input_len, seed=100 + i)[0].tolist() for i in range(count)]
        engine = Engine(
            model,
            max_num_seqs=level,
            max_num_batched_tokens=level * sizes.sweep_input_len,
            max_model_len=sizes.sweep_input_len + sizes.sweep_output_len,
        )
        replay(engine, prompts[:1], benchmark_params(2))  # warm-up
        metrics = calculate_metrics(
            replay(engine, prompts, benchmark_params(sizes.sweep_output_len), max_concurrency=level)
        )
        rows.append(
            {
                "concurrency": level,
                **metrics,
                "littles_law_in_flight": littles_law_in_flight(metrics),
                "littles_law_holds": littles_law_holds(metrics, level),
            }
        )
        if progress is not None:
            progress.update(1)
    return rows


def sequential_baseline(
    hf_model, config, sizes: StudySizes, levels: tuple[int, ...] = (1, 2, 4), rounds: int = 2
) -> list[dict]:
    """Week 03's baseline, rerun in the same session: `transformers`' generate() serving one
    request at a time (infer.experiments.sequential_baseline.run_sequential_server) at a few concurrency levels of the
    sweep's shape. One-at-a-time throughput does not grow with concurrency, so a few levels show it."""
    prompts = random_prompt_ids(config, sizes.sweep_input_len, batch=rounds * max(levels), seed=7).to(hf_model.device)
    run_sequential_server(hf_model, prompts[:1], sizes.sweep_output_len, 1)  # warm-up
    return [
        {
            "concurrency": level,
            **calculate_metrics(
                run_sequential_server(hf_model, prompts[: rounds * level], sizes.sweep_output_len, level)
            ),
        }
        for level in levels
    ]


def plot_occupancy(runs: list[PolicyRun]):
    """One panel per policy: slots (rows) x steps (columns), a colour per request, prefill steps marked."""
    width = max(run.occupancy.shape[1] for run in runs)
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(11, 1.2 + 0.35 * runs[0].occupancy.shape[0] * len(runs)), sharex=True
    )
    colours = plt.get_cmap("tab20")
    for ax, run in zip(axes, runs):
        grid = np.full((run.occupancy.shape[0], width, 3), 1.0)
        for (slot, step), request in np.ndenumerate(run.occupancy):
            if request >= 0:
                grid[slot, step] = colours(request % 20)[:3]
        ax.imshow(grid, aspect="auto", interpolation="nearest")
        prefill_steps = [i for i, kind in enumerate(run.step_kinds) if kind == "prefill"]
        ax.scatter(prefill_steps, [-0.9] * len(prefill_steps), marker="v", s=12, color="k", clip_on=False)
        busy = (run.occupancy >= 0).mean()
        ax.set_title(
            f"{run.policy}: {run.occupancy.shape[1]} steps, slots busy in {busy:.0%} of slot-steps "
            f"(white: idle; ▼ prefill step, decodes stalled)",
            fontsize=9,
        )
        ax.set_ylabel("KV slot")
    axes[-1].set_xlabel("engine step")
    return fig


def plot_sweep(rows: list[dict], baseline: list[dict] | None = None):
    """Output tokens/s and median TPOT against concurrency, the engine beside week 03's baseline."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    levels = [r["concurrency"] for r in rows]
    left.plot(levels, [r["output_throughput"] for r in rows], "o-", label="course engine (continuous)")
    right.plot(levels, [r["median_tpot_ms"] for r in rows], "o-", label="course engine (continuous)")
    if baseline:
        base_levels = [r["concurrency"] for r in baseline]
        left.plot(
            base_levels,
            [r["output_throughput"] for r in baseline],
            "s--",
            color="C7",
            label="week 03 baseline: sequential generate()",
        )
        right.plot(
            base_levels,
            [r["median_tpot_ms"] for r in baseline],
            "s--",
            color="C7",
            label="week 03 baseline: sequential generate()",
        )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.legend(fontsize=8)
    left.set_ylabel("output tokens/s")
    right.set_ylabel("median TPOT (ms)")
    left.set_title("output throughput against concurrency")  # what it shows is the run's to say, not the title's
    right.set_title("each stream's speed: median TPOT")
    return fig
