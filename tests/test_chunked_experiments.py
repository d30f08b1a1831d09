"""Week 06's experiment helpers: workloads as exact token counts, runs that yield both records and
step traces, the stall summary, and the best-budget pick (none when nothing meets the SLOs)."""

import pytest

from infer.experiments.chunked_prefill import (
    best_budget,
    serve,
    stall_summary,
    stall_workload,
    summarize_run,
    time_step_kinds,
)
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
    assert w.output_lens == [128] * 4 + [32] * 2


def test_a_run_gives_records_and_steps_that_agree(model):
    w = mixed_workload("small", model.arch.vocab_size, 5, (4, 40), (2, 5), seed=3)
    run = serve(model, w, "chunked", 16, max_num_seqs=2, max_model_len=64, max_concurrency=3)
    assert [len(r.chunk_times) for r in run.records] == w.output_lens
    assert sum(s.shape.prefill_tokens for s in run.steps) == sum(w.prompt_lens)
    assert all(s.shape.prefill_tokens + s.shape.decode_seqs <= 16 for s in run.steps)
    summary = summarize_run(run, {"ttft": 1e9, "tpot": 1e9})
    assert summary["completed"] == 5 and summary["request_goodput"] > 0 and "p99_itl_ms" in summary


def test_stall_summary_ratios():
    first = {"p99_itl_ms": 900.0, "total_token_throughput": 100.0}
    chunked = {"p99_itl_ms": 150.0, "total_token_throughput": 95.0}
    summary = stall_summary(first, chunked)
    assert summary["p99_itl_ratio_prefill_first_over_chunked"] == pytest.approx(6.0)
    assert summary["total_throughput_change_chunked_vs_prefill_first"] == pytest.approx(-0.05)


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
