"""Week 06's experiment helpers: workloads as exact token counts, runs that yield both records and
step traces, the live stall demo on the engine and on the simulator, the sweep's SLOs, the
step-cost errors by kind, the sweep's summary over rounds, and the best-budget pick (none when
nothing meets the SLOs)."""

import numpy as np
import pytest

from infer.engine import Engine
from infer.engine.simulator import SimulatedEngine
from infer.engine.step_costs import FEATURES, FixedStepCost, LinearStepCost
from infer.experiments.chunked_prefill import (
    best_budget,
    serve,
    stall_demo,
    stall_step_times,
    stall_workload,
    step_cost_errors,
    summarize_run,
    sweep_slos,
    time_step_kinds,
)
from infer.experiments.chunked_prefill_run import STALL_TARGETS, load_summary, median_round, sweep_points
from infer.experiments.rounds import format_target, spread, verdict
from infer.metrics import load_results
from infer.model import Transformer
from infer.workloads import mixed_workload


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


def test_stall_workload_sends_long_prompts_one_by_one_after_the_decoders():
    w = stall_workload(0.01, 0.5, 1024, num_decoding=4, long_prompt_lens=(100, 200))
    assert w.prompt_lens[4:] == [100, 200] and all(32 <= n <= 64 for n in w.prompt_lens[:4])
    assert w.offsets[:4] == [0.0] * 4
    assert w.offsets[4] == pytest.approx(0.5 + 10 * 0.01)
    assert w.offsets[5] - w.offsets[4] == pytest.approx(0.5 + 30 * 0.01)  # room for the previous prefill
    assert w.output_lens == [192] * 4 + [32] * 2


def test_a_run_gives_records_and_steps_that_agree(model):
    w = mixed_workload("small", model.arch.vocab_size, 5, (4, 40), (2, 5), seed=3)
    run = serve(model, w, "chunked", 16, max_num_seqs=2, max_model_len=64, max_concurrency=3)
    assert [len(r.chunk_times) for r in run.records] == w.output_lens
    assert sum(s.shape.prefill_tokens for s in run.steps) == sum(w.prompt_lens)
    assert all(s.shape.prefill_tokens + s.shape.decode_seqs <= 16 for s in run.steps)
    summary = summarize_run(run, {"ttft": 1e9, "tpot": 1e9})
    assert summary["completed"] == 5 and summary["request_goodput"] > 0 and "p99_itl_ms" in summary


def test_the_live_demo_runs_the_same_schedule_on_the_engine_and_on_the_simulator(model):
    short = [[(7 * i + j) % 256 for j in range(6)] for i in range(4)]
    long_prompt = list(range(80))
    for policy, budget in (("continuous", 80), ("chunked", 16)):
        engine = Engine(
            model, policy=policy, max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=128, log_steps=True
        )
        live = stall_demo(engine, short, long_prompt)
        simulated = stall_demo(
            SimulatedEngine(FixedStepCost(), policy, max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=128),
            [[0] * len(p) for p in short],
            [0] * len(long_prompt),
        )
        assert [s.items for s in simulated] == [s.items for s in live], policy
        times = stall_step_times(simulated)
        assert times["long_steps"] == (1 if policy == "continuous" else 80 // (16 - 4) + 1)
        assert times["long_median_ms"] == pytest.approx(1.0) and times["decode_median_ms"] == pytest.approx(1.0)


def test_sweep_slos_follow_the_step_costs():
    slo = sweep_slos(decode_step_ms=20.0, prefill_ms_per_token=0.2, concurrency=32, mean_prompt_len=250)
    assert slo["tpot"] == pytest.approx(1.75 * 20.0)  # a stream may decode 1.75 times slower than pure decodes
    assert slo["ttft"] == pytest.approx(2 * 32 * 250 * 0.2)  # twice every stream's prompt prefilled


def test_step_cost_errors_are_reported_by_kind(model):
    w = mixed_workload("small", model.arch.vocab_size, 6, (4, 40), (2, 5), seed=4)
    run = serve(model, w, "chunked", 16, max_num_seqs=3, max_model_len=64)
    zero = LinearStepCost(dict.fromkeys(FEATURES, 0.0))
    errors = step_cost_errors(zero, run.steps)
    assert set(errors) <= {"decode", "mixed", "prefill"} and sum(e["steps"] for e in errors.values()) == len(run.steps)
    assert all(e["median_error"] == e["summed_time_error"] == -1.0 for e in errors.values())  # a model that says 0 ms


def test_the_figure_shows_the_median_round():
    assert median_round([3.0, 1.0, 2.0]) == 2 and median_round([5.0, 4.0]) == 1 and median_round([7.0]) == 0


def test_a_sweep_summary_names_the_budgets_the_rounds_cannot_tell_apart():
    def record(budget, goodput, throughput, round_):
        latencies = dict.fromkeys(("p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms", "p90_tpot_ms"), 1.0)
        return {
            "max_concurrency": 8,
            "max_num_batched_tokens": budget,
            "round": round_,
            "request_goodput": goodput,
            "request_throughput": 10.0,
            "output_throughput": throughput,
            **latencies,
        }

    records = [record(32, 2.0, 100.0 + r, r) for r in range(3)] + [record(128, 5.0, 300.0 + r, r) for r in range(3)]
    records += [record(512, 1.0, 302.0 + 3 * r, r) for r in range(3)]  # the fastest, within 128's spread
    points = sweep_points(records)
    assert points[1]["output_throughput"] == spread([300.0, 301.0, 302.0])
    capacity = {budget: spread([value]) for budget, value in ((32, 200.0), (128, 602.0), (512, 310.0))}
    shares = [p["share_of_capacity"] for p in sweep_points(records, capacity)]
    assert shares == pytest.approx([0.505, 0.5, 305.0 / 310.0]), (
        "a load's share is its median throughput over the capacity's"
    )
    summary = load_summary(points, 8)
    assert summary["goodput_best_budget"] == 128 and summary["throughput_best_budget"] == 512
    assert summary["throughput_tied_within_rounds"] == [128, 512]


def test_best_budget_takes_the_highest_score_smaller_budget_on_ties_and_none_when_all_fail():
    records = [{"c": 1, "max_num_batched_tokens": b, "g": g} for b, g in ((32, 1.0), (128, 3.0), (512, 3.0))]
    assert best_budget(records, "c", 1, "g") == 128
    zeros = [dict(r, g=0.0) for r in records]
    assert best_budget(zeros, "c", 1, "g") is None
    with pytest.raises(ValueError, match="no sweep record has c=2"):
        best_budget(records, "c", 2, "g")


def test_step_kinds_are_timed_side_by_side(model):
    timings = time_step_kinds(model, 8, 16, repeats=2)
    assert {"prefill_only", "decode_only", "mixed", "separate_halves", "mixing_gain"} <= set(timings)
    assert timings["separate_halves"] == pytest.approx(timings["prefill_half"] + timings["decode_half"])
    assert all(timings[k] > 0 for k in ("prefill_only", "decode_only", "mixed"))


def test_the_simulator_is_checked_per_workload_against_the_median_of_its_rounds(model, tiny, tmp_path, monkeypatch):
    from infer.experiments.chunked_prefill_run import validate_simulator
    from infer.provenance import provenance

    for where in ("INFER_FIGURES_DIR", "INFER_RESULTS_DIR"):  # results and figures go there, not to the repository
        monkeypatch.setenv(where, str(tmp_path))
    calibration = mixed_workload("calibration", model.arch.vocab_size, 8, (4, 60), (2, 8), seed=5)
    fit_runs = [serve(model, calibration, "chunked", b, max_num_seqs=4, max_model_len=128) for b in (8, 32, 64)]
    held = mixed_workload("held", model.arch.vocab_size, 6, (4, 40), (2, 6), seed=6)
    rounds = [
        (3, serve(model, held, "chunked", 16, max_num_seqs=3, max_model_len=128, max_concurrency=3)) for _ in range(2)
    ]
    summary = validate_simulator(fit_runs, rounds, provenance(tiny), "test")
    assert summary["every_schedule_the_engines"]
    runs = load_results(tmp_path / "06_simulator_validation_test.json")["runs"]
    assert len(runs) == 1 and all(len(errors) == 2 for errors in runs[0]["round_errors"].values())
    median = runs[0]["measured"]["output_throughput"]["median"]
    assert runs[0]["relative_error"]["output_throughput"] == pytest.approx(
        runs[0]["simulated"]["output_throughput"] / median - 1
    )
    # the spread averages 1, and the fixed-cost simulation is reported beside the one with the spread
    assert np.mean(summary["step_time_ratios"]) == pytest.approx(1.0)
    assert runs[0]["relative_error_fixed_cost"]["output_throughput"] == pytest.approx(
        runs[0]["simulated_fixed_cost"]["output_throughput"] / median - 1
    )


def test_a_target_is_judged_on_the_unrounded_median_and_printed_with_its_verdict():
    # the committed stall run's throughput ratios: a median of 0.898, which prints as 0.90 to two decimals
    ratio = spread([0.9224, 0.8616, 0.8980])
    target = STALL_TARGETS["total_throughput_ratio_chunked_over_prefill_first"]
    assert verdict(ratio["median"], *target) == "MISSED", "0.898 misses '>= 0.90', whatever it rounds to"
    text = format_target(ratio, target, ".2f")
    assert text.endswith("target >= 0.9: MISSED"), (
        f"got {text!r}: a median shown rounded beside its threshold must say whether it met it"
    )
    assert verdict(0.90, ">=", 0.90) == "met" and verdict(1.26, "<=", 1.25) == "MISSED"
    assert format_target(spread([5.1, 5.5, 5.2]), STALL_TARGETS["p99_itl_ratio_prefill_first_over_chunked"], ".1f") == (
        "5.2 (5.1-5.5 over 3 rounds); target >= 3: met"
    )
    with pytest.raises(ValueError, match="'>=' or '<='"):
        verdict(1.0, ">", 0.9)


def test_the_simulator_is_judged_against_the_range_of_its_measured_rounds():
    from infer.experiments.chunked_prefill_run import VALIDATION_KEYS, judged_against_noise

    def row(simulated: float, error: float) -> dict:
        measured = {"median": 100.0, "min": 95.0, "max": 104.0, "per_round": [95.0, 100.0, 104.0]}
        return {
            "max_concurrency": 8,
            "max_num_batched_tokens": 64,
            "measured": {k: measured for k in VALIDATION_KEYS},
            "simulated": {k: simulated for k in VALIDATION_KEYS},
            "relative_error": {k: error for k in VALIDATION_KEYS},
        }

    inside = judged_against_noise([row(102.0, 0.02), row(97.0, -0.03)])
    assert (
        inside["verdict"] == "met"
        and inside["inside_range"] == 2 * len(VALIDATION_KEYS)
        and inside["median_abs_error"] == 0.025
    )
    outside = judged_against_noise([row(102.0, 0.02), row(105.0, 0.05)])
    assert outside["verdict"] == "MISSED", "a simulated value above every measured round must miss"
    assert len(outside["outside_range"]) == len(VALIDATION_KEYS) and outside["outside_range"][0]["simulated"] == 105.0
    assert inside["points"][0]["median_standard_error"] == pytest.approx(1.2533 * 1.4826 * 4.0 / 3**0.5 / 100.0), (
        "the rounds 95, 100, 104 deviate from their median by 5, 0 and 4: a median absolute deviation of 4"
    )
    noisy = judged_against_noise([row(96.0, -0.06), row(103.0, 0.06)])
    assert noisy["verdict"] == "MISSED", "inside every range but a median error of 6% must miss the 5% bar"
