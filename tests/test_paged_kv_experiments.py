"""Week 08's measurements, at toy sizes: the arithmetic of reservation waste, and each harness
running end to end on the tiny model with the keys the lecture reads."""

import pytest

from infer.experiments.paged_kv import (
    capacity_at_equal_memory,
    indirection_cost,
    prefix_caching_ttft,
    reservation_waste,
    shared_prefix_workload,
)
from infer.model import Transformer
from infer.workloads import mixed_workload


def test_reservation_waste_counts_empty_positions():
    waste = reservation_waste([10, 30], max_model_len=40, block_sizes=(1, 16))
    assert waste["slots"] == pytest.approx(1 - 40 / 80)
    assert waste["paged_b1"] == 0.0
    assert waste["paged_b16"] == pytest.approx(1 - 40 / (16 + 32)), "10 tokens take one block of 16, 30 take two"


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


def test_the_harnesses_run_and_report_what_the_lecture_reads(model):
    varied = mixed_workload("varied", model.arch.vocab_size, 12, (4, 16), (2, 8), seed=1)
    capacity = capacity_at_equal_memory(model, varied, slots=2, max_model_len=32, block_size=4, rounds=1)
    assert capacity["slots"]["max_running"] <= 2 < capacity["paged"]["max_running"], (
        "the same memory as 2 slots holds more short sequences as blocks"
    )
    prefix = prefix_caching_ttft(
        model, shared_prefix_workload(model.arch.vocab_size, 3, 64, 4, 2), block_size=16, rounds=1
    )
    assert prefix["hit_rate"] > 0.5 and set(prefix["median_ttft_ms"]) == {"off", "on"}
    cost = indirection_cost(model, batch=4, context=20, steps=2, rounds=1)
    assert cost["ratio_paged_over_slots"] > 0


def test_preemptions_are_counted_per_round_not_since_the_engine_started(model):
    from infer.engine import Engine
    from infer.experiments.paged_kv import serve_once

    varied = mixed_workload("varied", model.arch.vocab_size, 12, (4, 16), (2, 8), seed=1)
    engine = Engine(
        model,
        "chunked",
        max_num_seqs=12,
        max_model_len=32,
        kv_store="paged",
        num_kv_blocks=16,
        block_size=4,
        log_steps=True,
    )
    first, second = serve_once(engine, varied)["preemptions"], serve_once(engine, varied)["preemptions"]
    assert first > 0, "16 blocks of 4 for 12 requests of up to 24 tokens were meant to preempt: the test tests nothing"
    assert second == first, (
        f"the same workload on the same schedule: {first} preemption(s) in its first run, then reportedly {second}: "
        "serve_once must report its own run's preemptions (engine.num_preemptions after the run minus before), "
        "not the engine's counter, which runs from its start"
    )
    capacity = capacity_at_equal_memory(model, varied, slots=2, max_model_len=32, block_size=4, rounds=2)
    paged = capacity["paged"]
    assert paged.get("preemptions_per_round") == [first, first], (
        f"expected each round's own preemptions, [{first}, {first}], under 'preemptions_per_round'; got "
        f"{paged.get('preemptions_per_round')}"
    )
    assert paged["preemptions"] == 2 * first, "'preemptions' is the total over the timed rounds, the warm-up excluded"
    assert capacity["slots"]["preemptions_per_round"] == [0, 0], (
        "a slot is reserved whole: the slot store never preempts"
    )


def test_the_prefix_hit_rate_counts_the_timed_requests_only(model):
    # 3 requests of a 64-token system prompt (4 blocks of 16) and 4 tokens of their own, one at a time:
    # the first finds nothing cached, the other two its 64 shared tokens
    prefix = prefix_caching_ttft(
        model, shared_prefix_workload(model.arch.vocab_size, 3, 64, 4, 2), block_size=16, rounds=1
    )
    assert prefix["hit_rate"] == pytest.approx(2 * 64 / (3 * 68)), (
        f"hit rate {prefix['hit_rate']:.4f}, expected 128 / 204 = {128 / 204:.4f}: the warm-up must share no block "
        "with the system prompt (or the first timed request finds part of it cached), and its own lookups must not "
        "count in the timed requests' hit rate"
    )


def test_comparing_with_alone_tells_a_near_tie_from_a_bug(model):
    from infer.experiments.paged_kv import compare_with_alone
    from tests.engine_helpers import single_request_greedy

    prompt = [5, 9, 11, 3]
    tokens = single_request_greedy(model, prompt, 6)
    assert compare_with_alone(model, prompt, tokens) == "same tokens"
    wrong = tokens[:2] + [(tokens[2] + 1) % model.arch.vocab_size] + tokens[3:]
    assert "NOT a near-tie: a bug" in compare_with_alone(model, prompt, wrong), "a token that is simply wrong is a bug"


def test_the_pressure_sweep_sees_preemptions_past_the_knee(tiny):
    from infer.experiments.paged_kv import pressure_sweep, requests_that_fit

    rows = pressure_sweep(
        tiny, (1, 6), num_kv_blocks=8, block_size=16, input_len=24, output_len=24, rounds=1, max_model_len=64
    )
    assert requests_that_fit(8, 16, 48) == 2
    assert rows[0]["preemptions"] == 0, "one request at a time always fits"
    assert rows[1]["preemptions"] > 0, "six requests of three blocks in a pool of eight must preempt"
    assert all(r["completed"] == r["concurrency"] and r["failed"] == 0 for r in rows)


def test_the_gpu_part_is_stamped_simulated_and_holds_what_the_summary_promises():
    from infer.experiments.paged_kv import GPU_SUMMARY_KEYS, gpu_simulated

    part = gpu_simulated(levels=(1, 12), num_requests=12)
    summary = part["summary"]
    assert summary["kind"] == "SIMULATED" and "not measured" in summary["what"]
    assert part["meta"]["kind"] == "simulated" and part["meta"]["weights"] == "none (simulated)"
    fits = summary["requests_on_80_gib"]
    assert fits["paged_b16"] == fits["slots_by_max_model_len"]["2112"], "2,112 tokens fill 132 blocks exactly"
    assert fits["slots_by_max_model_len"]["32768"] < fits["paged_b16"] // 10, "a slot of the whole context wastes most"
    assert summary["knee_concurrency"] == 8, "384 blocks of 16 hold 8 requests of 768 tokens"
    assert {level: set(row) for level, row in summary["by_concurrency"].items()} == {
        "1": set(GPU_SUMMARY_KEYS),
        "12": set(GPU_SUMMARY_KEYS),
    }
    assert summary["by_concurrency"]["1"]["preemptions"] == 0 and summary["first_preempting_concurrency"] == 12
    assert all(row["completed"] == 12 for row in part["rows"]), "every request finishes, preempted or not"
