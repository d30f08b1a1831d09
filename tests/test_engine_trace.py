"""The model-free trace runner counts what the lecture and lab count by hand."""

from infer.engine.simulator import TraceRequest, run_trace
from infer.experiments.engine_bench import make_workload


def test_static_batching_steps_and_idle_slot_steps_follow_the_formula():
    outputs = (4, 12, 3, 6, 8, 2, 5, 11)
    run = run_trace([TraceRequest(0, 16, n) for n in outputs], "static", max_num_seqs=4, max_num_batched_tokens=512)
    assert run.num_steps == max(outputs[:4]) + max(outputs[4:])
    assert run.idle_slot_steps == 4 * run.num_steps - sum(outputs)
    assert [s.kind for s in run.steps].count("prefill") == 2


def test_continuous_batching_fills_a_freed_slot_at_the_next_step():
    trace = [TraceRequest(0, 8, 2), TraceRequest(0, 8, 6), TraceRequest(0, 8, 3)]
    run = run_trace(trace, "continuous", max_num_seqs=2, max_num_batched_tokens=64)
    # step 0 prefills 0 and 1; step 1 decodes both and request 0 ends; step 2 prefills request 2 alone
    assert run.batches()[:4] == [("prefill", (0, 1)), ("decode", (0, 1)), ("prefill", (2,)), ("decode", (1, 2))]
    assert run.first_token_step == [0, 0, 2] and run.finish_step[0] == 1
    grid = run.occupancy()
    assert grid[0][2] == 2  # request 2 took slot 0, freed by request 0


def test_token_budget_limits_one_prefill_step():
    trace = [TraceRequest(0, n, 2) for n in (60, 30, 50, 10)]
    run = run_trace(trace, "continuous", max_num_seqs=4, max_num_batched_tokens=100)
    assert run.batches()[0][1] == (0, 1)  # 50 does not fit after 90, and 10 may not overtake it


def test_benchmark_workloads_are_the_issues():
    class Config:
        vocab_size, bos_token_id, eos_token_id, pad_token_id = 1024, 256, 257, 258

    uniform, mixed = make_workload("uniform", Config), make_workload("mixed", Config)
    assert (
        len(uniform.prompts) == 64 and {len(p) for p in uniform.prompts} == {256} and set(uniform.output_lens) == {64}
    )
    assert all(32 <= len(p) <= 512 for p in mixed.prompts) and all(16 <= n <= 128 for n in mixed.output_lens)
    assert make_workload("mixed", Config).prompts == mixed.prompts  # seeded
