"""The simulator: the real scheduler on a virtual clock. Its schedule is the engine's, step for
step; its clock is exactly the cost model's; the fitted cost model recovers known costs; the
roofline model is bandwidth-bound for small decode steps and compute-bound for long prefills."""

import random

import numpy as np
import pytest

from infer.engine.simulator import simulate
from infer.engine.step_costs import (
    FEATURES,
    FixedStepCost,
    LinearStepCost,
    RooflineStepCost,
    SpreadStepCost,
    StepShape,
)
from infer.experiments.chunked_prefill import serve
from infer.metrics import calculate_metrics
from infer.model import Transformer
from infer.models import MODEL_SPECS
from infer.workloads import mixed_workload


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


def test_clock_counts_prefill_chunks_and_decodes():
    run = simulate(FixedStepCost(10.0), [5], [3], policy="chunked", max_num_seqs=1, max_num_batched_tokens=2)
    # prompt 5 at 2 a step: 3 steps (the last one samples the first token), then 2 decodes
    assert run.records[0].chunk_times == pytest.approx([0.03, 0.04, 0.05])
    assert [s.shape.prefill_tokens for s in run.steps] == [2, 2, 1, 0, 0]
    assert [s.shape.decode_seqs for s in run.steps] == [0, 0, 0, 1, 1]


def test_arrivals_wait_for_their_time_and_the_concurrency_limit():
    run = simulate(
        FixedStepCost(1.0),
        [4, 4, 4],
        [2, 2, 2],
        policy="continuous",
        max_num_seqs=8,
        max_num_batched_tokens=64,
        offsets=[0.0, 0.5, 0.5],
        max_concurrency=1,
    )
    sends = [r.send_time for r in run.records]
    assert sends[0] == 0.0 and sends[1] == pytest.approx(0.5) and sends[2] == pytest.approx(0.5 + 0.002)


@pytest.mark.parametrize("policy, budget", [("chunked", 7), ("chunked", 64), ("continuous", 256), ("static", 256)])
def test_the_simulated_schedule_is_the_engines(model, policy, budget):
    workload = mixed_workload("same", model.arch.vocab_size, 9, (3, 90), (2, 9), seed=budget)
    real = serve(model, workload, policy, budget, max_num_seqs=4, max_model_len=128)
    sim = simulate(
        FixedStepCost(1.0),
        workload.prompt_lens,
        workload.output_lens,
        policy=policy,
        max_num_seqs=4,
        max_num_batched_tokens=budget,
        max_model_len=128,
    )
    assert [s.items for s in sim.steps] == [s.items for s in real.steps]
    assert [s.shape for s in sim.steps] == [s.shape for s in real.steps]
    assert [len(r.chunk_times) for r in sim.records] == workload.output_lens


def test_step_shape_counts_attention_pairs_of_a_later_chunk():
    run = simulate(FixedStepCost(1.0), [10], [1], policy="chunked", max_num_seqs=1, max_num_batched_tokens=6)
    first, second = run.steps[0].shape, run.steps[1].shape
    assert first.prefill_attention_pairs == 6 * 7 // 2  # a square causal chunk from position 0
    assert second.prefill_attention_pairs == 4 * 6 + 4 * 5 // 2  # 4 queries after 6 cached keys
    assert second.sampled_rows == 1 and first.sampled_rows == 0


def test_decode_keys_are_counted_summed_and_as_the_rectangle_the_batched_attention_computes():
    run = simulate(FixedStepCost(1.0), [3, 5], [3, 3], policy="chunked", max_num_seqs=2, max_num_batched_tokens=64)
    shape = run.steps[1].shape
    assert shape.decode_seqs == 2
    assert shape.decode_kv_tokens == (3 + 1) + (5 + 1)  # each attends to prompt + its new token
    assert shape.decode_padded_kv_tokens == 2 * (5 + 1), "two decodes, each padded to the longest's 6 keys"


def test_fit_recovers_known_costs():
    rng = random.Random(0)
    truth = LinearStepCost(
        {
            "steps": 2.0,
            "prefill_steps": 0.8,
            "prefill_tokens": 0.05,
            "prefill_ends": 0.4,
            "decode_seqs": 0.3,
            "decode_padded_kv_tokens": 2e-4,
            "prefill_attention_pairs": 1e-5,
        }
    )
    shapes = []
    for _ in range(200):
        p, d = rng.choice([0, rng.randint(1, 2000)]), rng.randint(0, 32)
        ends = rng.randint(0, 3) if p else 0
        context = rng.randint(10, 500)
        shapes.append(StepShape(p, d, d * context, p * p // 2, d + ends, d * (context + rng.randint(0, 200))))
    times = [truth.step_ms(s) for s in shapes]
    fitted = LinearStepCost.fit(shapes, times)
    for name in FEATURES:
        assert fitted.ms_per_unit[name] == pytest.approx(truth.ms_per_unit[name], rel=1e-6, abs=1e-9)
    assert np.max(np.abs(fitted.relative_errors(shapes, times))) < 1e-6


def decode_shape(batch: int, rng: random.Random) -> StepShape:
    """A decode-only step of `batch` sequences of 300 keys, the longest of them 300-500."""
    return StepShape(0, batch, batch * 300, 0, batch, batch * rng.randint(300, 500))


def test_steps_with_prompt_tokens_weigh_as_much_as_the_decode_steps():
    """Decode steps outnumber the steps that run prompt tokens, which decide TTFT: each group
    weighs the same in the fit whatever its count, so tripling the decode steps changes nothing."""
    rng = random.Random(1)
    decode = [decode_shape(d, rng) for d in (rng.randint(1, 32) for _ in range(60))]
    prompt = [
        StepShape(p, d, d * 300, p * p // 2, d + ends, d * rng.randint(300, 500))
        for p, d, ends in ((rng.randint(8, 512), rng.randint(0, 8), rng.randint(0, 2)) for _ in range(20))
    ]
    noisy = lambda shape: (5 + 0.4 * shape.decode_seqs + 0.1 * shape.prefill_tokens) * rng.uniform(0.8, 1.2)  # noqa: E731
    decode_ms, prompt_ms = [noisy(s) for s in decode], [noisy(s) for s in prompt]
    once = LinearStepCost.fit(decode + prompt, decode_ms + prompt_ms)
    thrice = LinearStepCost.fit(decode * 3 + prompt, decode_ms * 3 + prompt_ms)
    for name in FEATURES:
        assert thrice.ms_per_unit[name] == pytest.approx(once.ms_per_unit[name], rel=1e-6, abs=1e-9)


def test_noisy_step_times_do_not_bias_the_summed_time_low():
    """Half the steps ran at a third of the speed (a busy machine): relative errors taken against
    the measured times would favour the fast half and make every simulated sum short; taken
    against the modelled times, the fit's summed time is the measured one."""
    rng = random.Random(2)
    shapes = [decode_shape(d, rng) for d in (rng.randint(1, 32) for _ in range(400))]
    times = [(5 + 0.5 * s.decode_seqs) * rng.choice([1.0, 3.0]) for s in shapes]
    fitted = LinearStepCost.fit(shapes, times)
    predicted = sum(fitted.step_ms(s) for s in shapes)
    assert predicted / sum(times) == pytest.approx(1.0, abs=0.03)


def test_fit_never_returns_a_negative_cost():
    shapes = [StepShape(p, 0, 0, 0, 0, 0) for p in range(1, 30)]
    times = [10.0 - 0.1 * p for p in range(1, 30)]  # prefill tokens that "save" time: not physical
    fitted = LinearStepCost.fit(shapes, times)
    assert all(v >= 0 for v in fitted.ms_per_unit.values())


def test_fit_refuses_too_few_steps():
    with pytest.raises(ValueError, match=f"need at least {len(FEATURES)} measured steps"):
        LinearStepCost.fit([StepShape(1, 0, 0, 1, 1, 0)], [1.0])


def test_the_spread_is_the_measured_over_modelled_ratios_with_a_mean_of_one():
    rng = random.Random(3)
    shapes = [decode_shape(d, rng) for d in (rng.randint(1, 32) for _ in range(400))]
    times = [(5 + 0.5 * s.decode_seqs) * rng.choice([0.8, 1.0, 1.5]) for s in shapes]
    model = LinearStepCost({name: 0.0 for name in FEATURES} | {"steps": 5.0, "decode_seqs": 0.5})
    ratios = model.spread(shapes, times, quantiles=50)
    assert len(ratios) == 50 and list(ratios) == sorted(ratios)
    assert np.mean(ratios) == pytest.approx(1.0)
    # three speeds in the proportions 0.8 : 1.0 : 1.5, scaled to a mean of 1
    assert len(set(np.round(ratios, 9))) == 3 and ratios[-1] / ratios[0] == pytest.approx(1.5 / 0.8)


def test_a_spread_cost_draws_ratios_around_the_model_repeatably():
    model = LinearStepCost({name: 0.0 for name in FEATURES} | {"steps": 10.0})
    shape = StepShape(0, 1, 10, 0, 1, 10)
    draws = [SpreadStepCost(model, (0.5, 1.5), seed=7).step_ms(shape) for _ in range(2)]
    assert draws[0] == draws[1], "one seed, one sequence of draws: a simulation must repeat"
    spread = SpreadStepCost(model, (0.5, 1.5), seed=7)
    times = [spread.step_ms(shape) for _ in range(2000)]
    assert set(times) == {5.0, 15.0} and np.mean(times) == pytest.approx(10.0, rel=0.05)
    with pytest.raises(ValueError, match="positive"):
        SpreadStepCost(model, ())


def test_a_spread_smooths_the_jumps_a_fixed_cost_puts_into_ttft():
    """Requests sent one at a time, each served in one step: a fixed cost gives them all one TTFT;
    with a spread they differ, and their throughput stays where the fixed cost put it."""
    model = LinearStepCost({name: 0.0 for name in FEATURES} | {"steps": 10.0})
    prompts, outputs = [4] * 200, [1] * 200
    fixed = calculate_metrics(simulate(model, prompts, outputs, max_concurrency=1).records)
    spread = calculate_metrics(simulate(SpreadStepCost(model, (0.8, 1.2)), prompts, outputs, max_concurrency=1).records)
    assert fixed["std_ttft_ms"] == pytest.approx(0.0, abs=1e-9) and spread["std_ttft_ms"] > 1.0
    assert spread["output_throughput"] == pytest.approx(fixed["output_throughput"], rel=0.05)


def test_roofline_decode_is_bandwidth_bound_and_long_prefill_compute_bound():
    cost = RooflineStepCost.for_model(
        MODEL_SPECS["qwen2.5-1.5b"].config(), 2, device="test", peak_flops=1e15, bandwidth=3e12, overhead_ms=0.0
    )
    weight_ms = (cost.layer_parameters + cost.head_parameters) * 2 / 3e12 * 1e3
    decode = cost.step_ms(StepShape(0, 1, 100, 0, 1, 100))
    assert decode == pytest.approx(weight_ms, rel=0.01)  # one token: streaming the weights is all
    prefill = StepShape(8192, 0, 0, 8192 * 8193 // 2, 1, 0)
    flops_ms = (
        (
            2 * cost.layer_parameters * 8192
            + 2 * cost.head_parameters
            + cost.attention_flops_per_pair * prefill.prefill_attention_pairs
        )
        / 1e15
        * 1e3
    )
    assert cost.step_ms(prefill) == pytest.approx(flops_ms, rel=1e-9)
    assert flops_ms > weight_ms


def test_simulated_records_feed_vllms_metrics():
    run = simulate(FixedStepCost(5.0), [16] * 4, [8] * 4, policy="chunked", max_num_batched_tokens=32)
    metrics = calculate_metrics(run.records)
    assert metrics["completed"] == 4 and metrics["total_output_tokens"] == 32
    assert metrics["median_tpot_ms"] == pytest.approx(5.0)


def test_bad_workloads_are_refused():
    with pytest.raises(ValueError, match="3 prompt lengths and 2 output lengths"):
        simulate(FixedStepCost(1.0), [1, 2, 3], [1, 1])
    with pytest.raises(ValueError, match="maximum context length is 128"):
        simulate(FixedStepCost(1.0), [100], [50], max_model_len=128)
    with pytest.raises(ValueError, match="prefills a whole prompt in one step"):
        simulate(FixedStepCost(1.0), [100], [5], policy="continuous", max_num_batched_tokens=64)


def test_a_slot_store_without_a_cache_hands_out_and_takes_back_slots():
    from infer.engine.kv_store import SlotKVStore
    from infer.engine.sequence import SamplingParams, Sequence

    store = SlotKVStore(2, 16)  # the simulator's: bookkeeping only, no tensors
    seqs = [Sequence(str(i), [1, 2], SamplingParams(), 0.0) for i in range(3)]
    store.allocate(seqs[0], 2)
    store.allocate(seqs[1], 2)
    assert not store.can_allocate(seqs[2], 2) and store.usage == 1.0
    store.free(seqs[0])
    assert store.can_allocate(seqs[2], 2) and store.usage == 0.5


def test_a_small_block_pool_preempts_a_large_one_does_not_and_every_request_finishes():
    requests = dict(prompt_lens=[48] * 6, output_lens=[32] * 6)  # 80 tokens each: 5 blocks of 16
    limits = dict(policy="chunked", max_num_seqs=6, max_num_batched_tokens=512, max_model_len=80)
    small = simulate(FixedStepCost(1.0), **requests, **limits, kv_store="paged", num_kv_blocks=12)
    large = simulate(FixedStepCost(1.0), **requests, **limits, kv_store="paged", num_kv_blocks=30)
    slots = simulate(FixedStepCost(1.0), **requests, **limits)
    assert small.num_preemptions > 0, "six requests that grow to 5 blocks each, in a pool of 12, must preempt"
    assert large.num_preemptions == 0, "30 blocks hold all six requests whole"
    assert slots.num_preemptions == 0, "a slot reserves max_model_len up front: it never runs out"
    for run in (small, large, slots):
        assert [r.num_output_tokens for r in run.records] == [32] * 6


def test_the_simulated_paged_schedule_with_preemptions_is_the_engines(model):
    """Preemption depends on lengths and the pool, never on token values: the simulator's schedule
    is the engine's step for step, preemptions and recomputes included."""
    from infer.engine import Engine
    from infer.engine.replay import replay
    from infer.engine.sequence import benchmark_params

    workload = mixed_workload("pressure", model.arch.vocab_size, 6, (20, 48), (8, 24), seed=3)
    settings = dict(max_num_seqs=6, max_num_batched_tokens=64, max_model_len=80, num_kv_blocks=10, block_size=8)
    engine = Engine(model, "chunked", kv_store="paged", log_steps=True, **settings)
    replay(engine, workload.prompts, [benchmark_params(n) for n in workload.output_lens])
    sim = simulate(
        FixedStepCost(1.0), workload.prompt_lens, workload.output_lens, policy="chunked", kv_store="paged", **settings
    )
    assert engine.num_preemptions > 0, "the workload is meant to preempt: up to 72 tokens each, a pool of 80"
    assert sim.num_preemptions == engine.num_preemptions
    assert [s.items for s in sim.steps] == [s.items for s in engine.step_log]


def test_an_unknown_store_is_refused():
    with pytest.raises(ValueError, match="unknown kv_store 'pages'"):
        simulate(FixedStepCost(1.0), [4], [2], kv_store="pages")
