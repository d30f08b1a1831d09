"""Replay: arrival schedules like `vllm bench serve`'s, and records that week 03's metrics accept."""

from infer.engine import Engine, SamplingParams
from infer.engine.replay import replay
from infer.metrics import calculate_metrics
from infer.model import Transformer
from infer.workloads import arrival_offsets


def test_replay_records_feed_week_03_metrics(tiny):
    engine = Engine(Transformer.from_hf(tiny.model), max_num_seqs=4, max_num_batched_tokens=256, max_model_len=128)
    prompts = [[1 + i] * (8 + 4 * i) for i in range(6)]
    params = [SamplingParams(max_tokens=3 + i, temperature=0, ignore_eos=True) for i in range(6)]
    records = replay(engine, prompts, params, offsets=arrival_offsets(6, request_rate=200.0, seed=0), max_concurrency=3)
    assert [r.prompt_len for r in records] == [len(p) for p in prompts]
    assert [r.num_output_tokens for r in records] == [3 + i for i in range(6)]
    metrics = calculate_metrics(records)
    assert metrics["completed"] == 6 and metrics["failed"] == 0
    assert metrics["total_output_tokens"] == sum(3 + i for i in range(6))
    assert not engine.has_unfinished() and engine.kv_store.num_free == 4


def test_max_concurrency_caps_requests_in_flight(tiny):
    engine = Engine(Transformer.from_hf(tiny.model), max_num_seqs=8, max_model_len=64, log_steps=True)
    replay(engine, [[5, 6, 7]] * 6, SamplingParams(max_tokens=4, temperature=0, ignore_eos=True), max_concurrency=2)
    assert max(len(step.request_ids) for step in engine.step_log) == 2
