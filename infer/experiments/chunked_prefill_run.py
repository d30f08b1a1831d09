"""Week 06's measurements in one command: `python -m infer.experiments.chunked_prefill_run`
(`--only` runs some parts; each part prints how long it took: about 4 minutes for the stalls, 1 for
the mixing, 16 for the sweep with the simulator's validation and 3 for the simulated gpu grid, on
two quiet CPU cores). Writes, for the profile in use (cpu unless INFER_PROFILE says otherwise):

- results/06_stalls_<profile>.json and figures/06_stalls.png: prefill-first vs chunked while long
  prompts arrive among decoding streams, in interleaved rounds (Gantt charts and ITL
  distributions of the median round);
- results/06_mixing_<profile>.json: prefill-only, decode-only and mixed steps of equal size;
- results/06_sweep_<profile>.json and figures/06_sweep.png: token budget x concurrency in
  interleaved rounds, at SLOs set from this machine's step costs; medians and the rounds' spread;
- results/06_simulator_validation_<profile>.json and figures/06_simulator_validation.png: the
  step-cost model fitted on calibration runs made between the sweep's runs, checked on every
  sweep run (held out): the metrics, the step-cost error by kind of step, the schedule itself;
- results/06_sweep_gpu_simulated.json and figures/06_sweep_gpu_simulated.png: the gpu profile's
  grid, which this machine cannot run, simulated with a roofline step cost and stamped SIMULATED;
  each budget's capacity is simulated too, and a load beyond it is marked overloaded.

Everything runs on one CPU thread (infer.timing.cpu_threads), so that a busy second core slows
the variants alike instead of stalling a multi-threaded op.
"""

import argparse
import statistics
import time
from dataclasses import replace
from functools import partial

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from infer.engine.simulator import simulate
from infer.engine.step_costs import FEATURES, LinearStepCost, RooflineStepCost, SpreadStepCost
from infer.experiments.chunked_prefill import (
    TPOT_SLACK,
    TTFT_PROMPT_ROUNDS,
    best_budget,
    median_step_s,
    relative_error,
    serve,
    stall_workload,
    step_cost_errors,
    summarize_run,
    sweep_slos,
    time_step_kinds,
)
from infer.experiments.chunked_prefill_plots import (
    plot_budget_sweep,
    plot_gantt,
    plot_itl_distribution,
    plot_simulated_vs_measured,
)
from infer.experiments.rounds import interleaved_rounds, median_standard_error, ratio_spread, spread, verdict
from infer.metrics import calculate_metrics, request_latencies_ms, save_results, slo_from_profile
from infer.model import Transformer
from infer.models import MODEL_SPECS, load_model
from infer.plotting import save_figure
from infer.profiles import PROFILES, pick_profile
from infer.provenance import provenance
from infer.timing import cpu_threads
from infer.workloads import Workload, arrival_offsets, mixed_workload

ROUNDS = 3
CHUNKED_STALL_BUDGET = 128
# The stall experiment's targets, judged on the median of the rounds (unrounded: 0.898 misses 0.90).
STALL_TARGETS = {
    "p99_itl_ratio_prefill_first_over_chunked": (">=", 3.0),
    "total_throughput_ratio_chunked_over_prefill_first": (">=", 0.90),
}
# The sweep's rounds: this machine's speed drifts by 10-20% over seconds, and the simulator is judged
# on the median of each workload's rounds, so it gets more of them than the stall demo.
SWEEP_ROUNDS = 5
# The sweep: budgets at two loads (closed loops of 8 and 32 streams), enough requests for a p90.
SWEEP_BUDGETS = (32, 64, 128, 256, 512, 2048)
SWEEP_CONCURRENCY = (8, 32)
SWEEP_REQUESTS = 192
SWEEP_PROMPT_LENS, SWEEP_OUTPUT_LENS = (32, 512), (16, 64)
SWEEP_PERCENTILES = (50, 90)
# A budget's capacity, the load each point is placed against: every request there from the start.
CAPACITY = "capacity"
CAPACITY_RULE = (
    f"output tok/s of the concurrency-{max(SWEEP_CONCURRENCY)} workload's {SWEEP_REQUESTS} requests, all sent at "
    f"once, with up to {SWEEP_REQUESTS} sequences in a step (the budget the only limit), once per round"
)
SWEEP_KEYS = ("p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms", "output_throughput", "request_goodput")
# The simulator's calibration: (policy, budget, concurrency), none of them the sweep's, on other
# prompts; one runs before each load's budgets in every round, and one after the last. Their
# concurrencies bracket the sweep's 8 and 32: a decode row costs less in a larger batch, so a
# straight line fitted to batches on one side of a load would overcharge it.
CALIBRATION = (("chunked", 96, 40), ("chunked", 48, 6), ("continuous", 1024, 16))
CALIBRATION_REQUESTS = 96
VALIDATION_KEYS = ("median_ttft_ms", "p90_ttft_ms", "median_tpot_ms", "p90_tpot_ms", "output_throughput")
VALIDATION_TARGET = 0.10
# The simulator judged against the measurement's own noise: at every held-out point and metric the
# simulated value lies inside the range of the measured rounds, and the median absolute error over
# all of them is at most this.
NOISE_CRITERION_MEDIAN_ERROR = 0.05
SPREAD_SEEDS = 5  # simulations with the step-time spread per held-out workload: each metric's median is compared
# The gpu profile's grid (seed 004): 2,048 input / 64 output tokens, budgets 512 to 16,384.
GPU_BUDGETS = (512, 1024, 2048, 4096, 8192, 16384)
# (requests/s, burstiness): Poisson arrivals (burstiness 1), and bursts at the highest rate, as
# `vllm bench serve --burstiness 0.25` sends them: the steps that carry many prompts at once.
GPU_LOADS = ((30.0, 1.0), (60.0, 1.0), (100.0, 1.0), (100.0, 0.25))
GPU_TIED_GOODPUT = 0.01  # budgets within 1% of the best goodput: a tie, not a ranking
GPU_REQUESTS = 1000  # at a load near a budget's capacity, a short run shows its start, not its steady state
GPU_MAX_UTILIZATION = 0.95  # a load above this share of a budget's capacity is overloaded: its queue only grows
# Datasheet numbers of the GPU the roofline models (H100 SXM, bf16 dense), and an assumed step overhead.
GPU_ROOFLINE = dict(device="H100 SXM (datasheet)", peak_flops=989e12, bandwidth=3.35e12, overhead_ms=4.0)


# ------------------------------------------------------------ stalls


def stalls(model, vocab_size: int, meta: dict, profile: str):
    _, decode_s = median_step_s(model, 24, 64, vocab_size)
    prefill_s, _ = median_step_s(model, 1, 1984, vocab_size)
    workload = stall_workload(decode_s, prefill_s, vocab_size)
    policies = {"prefill-first": ("continuous", 2048), "chunked": ("chunked", CHUNKED_STALL_BUDGET)}
    runs = interleaved_rounds(
        {name: partial(serve, model, workload, policy, budget) for name, (policy, budget) in policies.items()}, ROUNDS
    )
    summaries = {name: [summarize_run(run) for run in rounds] for name, rounds in runs.items()}
    summary = {
        "p99_itl_ratio_prefill_first_over_chunked": ratio_spread(
            summaries["prefill-first"], summaries["chunked"], "p99_itl_ms"
        ),
        "total_throughput_ratio_chunked_over_prefill_first": ratio_spread(
            summaries["chunked"], summaries["prefill-first"], "total_token_throughput"
        ),
    }
    summary["targets"] = {
        key: f"{op} {value:g}: {verdict(summary[key]['median'], op, value)}"
        for key, (op, value) in STALL_TARGETS.items()
    }
    records = [{"round": r, **s} for rounds in summaries.values() for r, s in enumerate(rounds)]
    save_results(
        f"06_stalls_{profile}",
        records,
        meta,
        decode_step_ms=decode_s * 1e3,
        longest_prefill_ms=prefill_s * 1e3,
        summary=summary,
        policies=list(summaries),
        rounds=ROUNDS,
    )
    shown = median_round(summary["p99_itl_ratio_prefill_first_over_chunked"]["per_round"])
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5))
    for ax, (name, rounds) in zip(axes, runs.items()):
        plot_gantt(ax, rounds[shown].steps, f"{name} (budget {rounds[shown].budget}), round {shown + 1} of {ROUNDS}")
    itls = {
        name: [g for r in rounds[shown].records for g in request_latencies_ms(r).itls_ms]
        for name, rounds in runs.items()
    }
    plot_itl_distribution(axes[2], itls)
    save_figure(fig, "06_stalls", meta)
    return summary


def median_round(values: list[float]) -> int:
    """The round whose value is the median one (the lower middle of an even count): the round a figure shows."""
    return sorted(range(len(values)), key=values.__getitem__)[(len(values) - 1) // 2]


# ------------------------------------------------------------ mixing


def mixing(model, meta: dict, profile: str):
    results = [{"num_tokens": n, "context": 256, **time_step_kinds(model, n, 256)} for n in (32, 128)]
    save_results(f"06_mixing_{profile}", results, meta)
    return results


# -------------------------------------------------- the sweep, with the simulator's calibration between its runs


def this_machines_slos(model, vocab_size: int) -> tuple[dict, dict]:
    """The sweep's SLOs from step costs measured here (infer.experiments.chunked_prefill.sweep_slos),
    and the costs they come from."""
    mean_prompt = sum(SWEEP_PROMPT_LENS) / 2
    context = int(mean_prompt + sum(SWEEP_OUTPUT_LENS) / 4)  # a stream halfway through its answer
    _, decode_s = median_step_s(model, max(SWEEP_CONCURRENCY), context, vocab_size)
    prefill_s, _ = median_step_s(model, 1, SWEEP_PROMPT_LENS[1], vocab_size)
    streams, decode_ms, per_token_ms = max(SWEEP_CONCURRENCY), decode_s * 1e3, prefill_s * 1e3 / SWEEP_PROMPT_LENS[1]
    costs = {
        "decode_step_ms": decode_ms,
        "decode_batch": streams,
        "context": context,
        "prefill_ms_per_token": per_token_ms,
        "mean_prompt_len": mean_prompt,
        "rule": f"TPOT <= {TPOT_SLACK:g} x a step of {streams} decodes ({decode_ms:.1f} ms here); TTFT <= "
        f"{TTFT_PROMPT_ROUNDS} x the prefill of every stream's prompt ({streams} x {mean_prompt:.0f} tokens at "
        f"{per_token_ms:.3f} ms each)",
    }
    return sweep_slos(decode_ms, per_token_ms, streams, mean_prompt), costs


def sweep_workload(concurrency: int, vocab_size: int) -> Workload:
    """The requests the sweep serves at one load (the same in every round and on the simulator)."""
    return mixed_workload(
        f"sweep-c{concurrency}", vocab_size, SWEEP_REQUESTS, SWEEP_PROMPT_LENS, SWEEP_OUTPUT_LENS, seed=concurrency
    )


def sweep(model, vocab_size: int, meta: dict, profile: str):
    """Every budget at every load, once per round, with the calibration runs in between, so that
    a shared machine's drift meets the sweep and the calibration alike."""
    slo_ms, step_costs = this_machines_slos(model, vocab_size)
    workloads = {c: sweep_workload(c, vocab_size) for c in SWEEP_CONCURRENCY}
    calibration = mixed_workload("calibration", vocab_size, CALIBRATION_REQUESTS, (16, 768), (8, 64), seed=1234)
    calibrations = [
        ("calibration", partial(serve, model, calibration, policy, budget, max_num_seqs=c, max_concurrency=c))
        for policy, budget, c in CALIBRATION
    ]

    def one_round(number: int) -> list:
        # each round starts the budgets at another one, so that no budget always runs at the same
        # moment of a round (right after a calibration run, say)
        budgets = SWEEP_BUDGETS[number % len(SWEEP_BUDGETS) :] + SWEEP_BUDGETS[: number % len(SWEEP_BUDGETS)]
        jobs = calibrations[:1]
        for c, after in zip(SWEEP_CONCURRENCY, calibrations[1:], strict=True):
            jobs += [
                (c, partial(serve, model, workloads[c], "chunked", b, max_num_seqs=c, max_concurrency=c))
                for b in budgets
            ]
            jobs.append(after)
        jobs += [
            (CAPACITY, partial(serve, model, capacity_workload, "chunked", b, max_num_seqs=SWEEP_REQUESTS))
            for b in budgets
        ]
        return jobs

    capacity_workload = workloads[max(SWEEP_CONCURRENCY)]
    fit_runs, held_out, records, capacity_runs = [], [], [], {}
    jobs_per_round = len(calibrations) + (len(workloads) + 1) * len(SWEEP_BUDGETS)
    with tqdm(total=SWEEP_ROUNDS * jobs_per_round, desc="sweep, capacity and calibration") as bar:
        for number in range(SWEEP_ROUNDS):
            for what, job in one_round(number):
                run = job()
                bar.update(1)
                if what == "calibration":
                    fit_runs.append(run)
                elif what == CAPACITY:
                    capacity_runs.setdefault(run.budget, []).append(calculate_metrics(run.records)["output_throughput"])
                else:
                    held_out.append((what, run))
                    records.append({"max_concurrency": what, "round": number, **summarize_run(run, slo_ms)})
    capacity = {budget: spread(values) for budget, values in sorted(capacity_runs.items())}
    points = sweep_points(records, capacity)
    summary = {f"concurrency {c}": load_summary(points, c) for c in SWEEP_CONCURRENCY}
    save_results(
        f"06_sweep_{profile}",
        records,
        meta,
        slo_ms=slo_ms,
        step_costs=step_costs,
        points=points,
        summary=summary,
        rounds=SWEEP_ROUNDS,
        requests_per_run=SWEEP_REQUESTS,
        capacity_output_throughput={str(budget): value for budget, value in capacity.items()},
        capacity_rule=CAPACITY_RULE,
    )
    fig, axes = plt.subplots(1, 4, figsize=(20, 5))
    plot_budget_sweep(axes, points, "max_concurrency", "concurrency {}", slo_ms=slo_ms)
    save_figure(fig, "06_sweep", meta)
    return fit_runs, held_out, summary, capacity


def sweep_points(records: list[dict], capacity: dict[int, dict] | None = None) -> list[dict]:
    """One point per (load, budget): each metric's median over the rounds, with its spread, and the
    load as a share of the budget's `capacity` (output tok/s, medians of the rounds) where given."""
    groups = {}
    for r in records:
        groups.setdefault((r["max_concurrency"], r["max_num_batched_tokens"]), []).append(r)
    points = []
    for (c, budget), rows in sorted(groups.items()):
        point = {"max_concurrency": c, "max_num_batched_tokens": budget, "rounds": len(rows)}
        point.update({key: spread([r[key] for r in rows]) for key in SWEEP_KEYS})
        point["within_slo_share"] = spread([r["request_goodput"] / r["request_throughput"] for r in rows])
        if capacity is not None:
            point["share_of_capacity"] = point["output_throughput"]["median"] / capacity[budget]["median"]
        points.append(point)
    return points


def load_summary(points: list[dict], concurrency: int) -> dict:
    """The goodput-best and the throughput-best budget of one load, by their medians over the
    rounds, and the budgets whose throughput the rounds cannot tell from the best's (the range of
    their rounds reaches the best's slowest round): the throughput-best is one of those by noise."""
    rows = [p for p in points if p["max_concurrency"] == concurrency]
    medians = [
        {
            "load": concurrency,
            "max_num_batched_tokens": p["max_num_batched_tokens"],
            **{key: p[key]["median"] for key in ("request_goodput", "output_throughput")},
        }
        for p in rows
    ]
    fastest = best_budget(medians, "load", concurrency, "output_throughput")
    fastest_slowest_round = next(p["output_throughput"]["min"] for p in rows if p["max_num_batched_tokens"] == fastest)
    return {
        "goodput_best_budget": best_budget(medians, "load", concurrency, "request_goodput"),
        "throughput_best_budget": fastest,
        "throughput_tied_within_rounds": [
            p["max_num_batched_tokens"] for p in rows if p["output_throughput"]["max"] >= fastest_slowest_round
        ],
    }


def simulate_sweep_point(cost_model, workload: Workload, concurrency: int, budget: int):
    """One point of the sweep (a closed loop of `concurrency` streams, chunked at `budget`) on the simulator."""
    return simulate(
        cost_model,
        workload.prompt_lens,
        workload.output_lens,
        policy="chunked",
        max_num_seqs=concurrency,
        max_num_batched_tokens=budget,
        offsets=workload.offsets,
        max_concurrency=concurrency,
    )


def judged_against_noise(rows: list[dict]) -> dict:
    """The validation's criterion: each held-out point's simulated value of each metric against the
    range of its measured rounds, and the median absolute error (simulated against the rounds'
    median) over every point and metric. Computed from the rows alone, so that a saved validation
    can be judged again."""
    points = [
        {
            "max_concurrency": row["max_concurrency"],
            "max_num_batched_tokens": row["max_num_batched_tokens"],
            "metric": key,
            "rounds": len(row["measured"][key]["per_round"]),
            "requests": sum(row.get("requests_per_round", ())),
            "share_of_capacity": row.get("share_of_capacity"),
            "median_standard_error": median_standard_error(row["measured"][key]["per_round"]),
            "measured_min": row["measured"][key]["min"],
            "measured_median": row["measured"][key]["median"],
            "measured_max": row["measured"][key]["max"],
            "simulated": row["simulated"][key],
            "signed_error": row["relative_error"][key],
            "inside_range": row["measured"][key]["min"] <= row["simulated"][key] <= row["measured"][key]["max"],
        }
        for row in rows
        for key in VALIDATION_KEYS
    ]
    median_error = statistics.median(abs(p["signed_error"]) for p in points)
    outside = [p for p in points if not p["inside_range"]]
    standard_errors = [p["median_standard_error"] for p in points]
    return {
        "median_known_to": {"median": statistics.median(standard_errors), "largest": max(standard_errors)},
        "criterion": f"simulated inside the measured rounds' range at every point, and median |error| <= "
        f"{NOISE_CRITERION_MEDIAN_ERROR:.0%}",
        "points": points,
        "median_abs_error": median_error,
        "inside_range": len(points) - len(outside),
        "outside_range": outside,
        "verdict": verdict(median_error, "<=", NOISE_CRITERION_MEDIAN_ERROR) if not outside else "MISSED",
    }


def validate_simulator(fit_runs, held_out, meta: dict, profile: str, capacity: dict[int, dict] | None = None):
    """The cost model fitted on the calibration runs' steps, and the spread of those steps around
    it; each held-out workload (a load and a budget, measured once per round) simulated with the
    spread SPREAD_SEEDS times and compared, each metric's median over them, with the median of its
    rounds (one round's error holds that round's machine noise as well). The same workload with a
    fixed cost per step shape is reported beside it: what the spread changes. Each point says how
    many requests it measured and, given the budgets' `capacity` (output tok/s), its load as a
    share of it."""
    steps = [s for run in fit_runs for s in run.steps]
    shapes, times = [s.shape for s in steps], [s.ms for s in steps]
    cost = LinearStepCost.fit(shapes, times)
    ratios = cost.spread(shapes, times)
    rounds = {}
    for concurrency, run in held_out:
        rounds.setdefault((concurrency, run.budget), []).append(run)
    rows = []
    for (concurrency, budget), runs in sorted(rounds.items()):
        w = runs[0].workload
        fixed = simulate_sweep_point(cost, w, concurrency, budget)
        with_spread = [
            simulate_sweep_point(SpreadStepCost(cost, ratios, seed), w, concurrency, budget)
            for seed in range(SPREAD_SEEDS)
        ]
        spread_metrics = [calculate_metrics(sim.records) for sim in with_spread]
        sim_metrics = {k: statistics.median(m[k] for m in spread_metrics) for k in VALIDATION_KEYS}
        fixed_metrics = calculate_metrics(fixed.records)
        measured = [calculate_metrics(run.records) for run in runs]
        measured_median = {k: statistics.median(m[k] for m in measured) for k in VALIDATION_KEYS}
        rows.append(
            {
                "workload": w.name,
                "max_num_batched_tokens": budget,
                "max_concurrency": concurrency,
                "requests_per_round": [m["completed"] for m in measured],
                "share_of_capacity": (
                    measured_median["output_throughput"] / capacity[budget]["median"] if capacity else None
                ),
                "measured": {k: spread([m[k] for m in measured]) for k in VALIDATION_KEYS},
                "simulated": sim_metrics,
                "simulated_fixed_cost": {k: fixed_metrics[k] for k in VALIDATION_KEYS},
                "relative_error": {k: relative_error(sim_metrics[k], measured_median[k]) for k in VALIDATION_KEYS},
                "relative_error_fixed_cost": {
                    k: relative_error(fixed_metrics[k], measured_median[k]) for k in VALIDATION_KEYS
                },
                "round_errors": {k: [relative_error(sim_metrics[k], m[k]) for m in measured] for k in VALIDATION_KEYS},
                # the simulated schedule, step for step the engine's: then every error is the cost model's
                "same_schedule": all(
                    [s.items for s in sim.steps] == [s.items for s in run.steps]
                    for sim in [fixed, *with_spread]
                    for run in runs
                ),
                "step_cost_error": step_cost_errors(cost, [s for run in runs for s in run.steps]),
            }
        )
    largest = max(abs(e) for row in rows for e in row["relative_error"].values())
    # the measurement's own noise: how far a round's value lies from its workload's median
    round_deviations = [
        abs(m / row["measured"][k]["median"] - 1)
        for row in rows
        for k in VALIDATION_KEYS
        for m in row["measured"][k]["per_round"]
    ]
    summary = {
        "largest_abs_relative_error": largest,
        "largest_abs_relative_error_fixed_cost": max(
            abs(e) for row in rows for e in row["relative_error_fixed_cost"].values()
        ),
        "measured_round_deviation": {
            "median": statistics.median(round_deviations),
            "largest": max(round_deviations),
        },
        "largest_abs_relative_error_of_one_round": max(
            abs(e) for row in rows for errors in row["round_errors"].values() for e in errors
        ),
        "target": VALIDATION_TARGET,
        "within_target": largest <= VALIDATION_TARGET,
        "every_schedule_the_engines": all(row["same_schedule"] for row in rows),
        "against_the_noise": judged_against_noise(rows),
        "held_out_step_cost_error": step_cost_errors(cost, [s for _, run in held_out for s in run.steps]),
        "fit_step_cost_error": step_cost_errors(cost, steps),
        "fit_steps": len(steps),
        "fit_ms_per_unit": cost.ms_per_unit,
        "step_time_ratios": list(ratios),
        "spread_seeds": SPREAD_SEEDS,
        "features": list(FEATURES),
        "calibration": [{"policy": p, "max_num_batched_tokens": b, "max_concurrency": c} for p, b, c in CALIBRATION],
    }
    # the y axis is simulated, the x axis measured: the stamp says both
    meta = {**meta, "kind": "simulated (y) vs measured (x)"}
    save_results(f"06_simulator_validation_{profile}", rows, meta, summary=summary)
    fig, ax = plt.subplots(figsize=(6.5, 6))
    plot_simulated_vs_measured(ax, rows)
    save_figure(fig, "06_simulator_validation", meta)
    return summary


# ------------------------------------------------------------ the gpu profile's grid, simulated


def gpu_step_cost() -> RooflineStepCost:
    """The gpu profile's model on the GPU_ROOFLINE device: the step cost of every simulated GPU
    number of the course (weeks 05, 06 and 08)."""
    gpu = PROFILES["gpu"]
    return RooflineStepCost.for_model(MODEL_SPECS[gpu.model_name].config(), gpu.dtype.itemsize, **GPU_ROOFLINE)


def simulated_gpu_provenance(cost: RooflineStepCost) -> dict:
    """The provenance of the machine that ran a simulation, with the simulated device in its place."""
    gpu = PROFILES["gpu"]
    return {
        **provenance(replace(gpu, device="cpu"), kind="simulated"),
        "model": gpu.model_name,
        "weights": "none (simulated)",
        "device": cost.assumptions(),
        "profile": "gpu (simulated)",
    }


def gpu_grid_simulated():
    """The gpu profile's sweep, simulated with a roofline step cost: nothing here is measured."""
    gpu = PROFILES["gpu"]
    cost = gpu_step_cost()
    slo_ms = slo_from_profile(gpu)
    serve_simulated = partial(
        simulate,
        cost,
        [2048] * GPU_REQUESTS,
        [64] * GPU_REQUESTS,
        policy="chunked",
        max_num_seqs=256,
        max_model_len=2048 + 64,
    )
    # a budget's capacity: the requests per second it finishes when every request is there from the start
    capacity = {
        b: calculate_metrics(serve_simulated(max_num_batched_tokens=b).records)["request_throughput"]
        for b in GPU_BUDGETS
    }
    points = []
    for rate, burstiness in GPU_LOADS:
        offsets = arrival_offsets(GPU_REQUESTS, rate, burstiness, seed=0)
        for budget in GPU_BUDGETS:
            sim = serve_simulated(max_num_batched_tokens=budget, offsets=offsets)
            points.append(
                {
                    "load": f"{rate:g} req/s" + (f", burstiness {burstiness:g}" if burstiness != 1 else ""),
                    "request_rate": rate,
                    "burstiness": burstiness,
                    "policy": "chunked",
                    "max_num_batched_tokens": budget,
                    "capacity_req_s": capacity[budget],
                    "overloaded": rate > GPU_MAX_UTILIZATION * capacity[budget],
                    **calculate_metrics(sim.records, slo_ms=slo_ms, percentiles=SWEEP_PERCENTILES),
                }
            )
    summary = {
        "loads": {load: load_summary_simulated(points, load) for load in dict.fromkeys(p["load"] for p in points)},
        "capacity_req_s": {str(b): c for b, c in capacity.items()},
        "highest_capacity_budget": max(capacity, key=capacity.get),
    }
    meta = simulated_gpu_provenance(cost)
    save_results(
        "06_sweep_gpu_simulated",
        points,
        meta,
        slo_ms=slo_ms,
        summary=summary,
        assumptions={
            "cost_model": cost.as_dict(),
            "in_tokens": 2048,
            "out_tokens": 64,
            "max_num_seqs": 256,
            "num_prompts": GPU_REQUESTS,
            "arrivals": "gamma-distributed gaps of the given burstiness (1: Poisson), as vllm bench serve",
            "overloaded": f"rate > {GPU_MAX_UTILIZATION:g} x the budget's capacity",
        },
    )
    fig, axes = plt.subplots(1, 4, figsize=(20, 5))
    plot_budget_sweep(axes, points, "load", "{}", slo_ms=slo_ms, capacity=capacity, stamp="SIMULATED")
    fig.suptitle(f"SIMULATED: {gpu.model_name} shape, 2,048 in / 64 out, a roofline's step costs", color="red")
    save_figure(fig, "06_sweep_gpu_simulated", meta)
    return summary


def load_summary_simulated(points: list[dict], load: str) -> dict:
    """Among the budgets that keep up with `load`: the goodput-best (None if none keeps up), the
    budgets within GPU_TIED_GOODPUT of its goodput, and the throughput-best; and the overloaded ones."""
    rows = [p for p in points if p["load"] == load]
    steady = [p for p in rows if not p["overloaded"]]
    best = best_budget(steady, "load", load, "request_goodput") if steady else None
    best_goodput = max((p["request_goodput"] for p in steady), default=0.0)
    return {
        "goodput_best_budget": best,
        "goodput_within_1_percent": [
            p["max_num_batched_tokens"] for p in steady if p["request_goodput"] >= (1 - GPU_TIED_GOODPUT) * best_goodput
        ],
        "throughput_best_budget": best_budget(steady, "load", load, "output_throughput") if steady else None,
        "overloaded_budgets": [p["max_num_batched_tokens"] for p in rows if p["overloaded"]],
    }


PARTS = ("stalls", "mixing", "sweep", "gpu")


def timed(name: str, part, *args):
    """Run one part; say how long it took."""
    start = time.perf_counter()
    result = part(*args)
    print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    return result


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
    start = time.perf_counter()
    profile = pick_profile()
    lm = load_model(profile=profile, quiet=True)
    print(lm.header(), flush=True)
    model, vocab = Transformer.from_hf(lm.model), lm.config.vocab_size
    with cpu_threads(1 if profile.device == "cpu" else None):
        meta = provenance(lm)  # inside: it records the threads the runs use
        if "stalls" in parts:
            print("stalls:", timed("stalls", stalls, model, vocab, meta, profile.name))
        if "mixing" in parts:
            print("mixing:", timed("mixing", mixing, model, meta, profile.name))
        if "sweep" in parts:
            fit_runs, held_out, summary, capacity = timed("sweep", sweep, model, vocab, meta, profile.name)
            print("sweep:", summary)
            print(
                "simulator:",
                timed("simulator", validate_simulator, fit_runs, held_out, meta, profile.name, capacity),
            )
    if "gpu" in parts:
        print("gpu grid (simulated):", timed("gpu grid (simulated)", gpu_grid_simulated))
    print(f"all parts: {(time.perf_counter() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
