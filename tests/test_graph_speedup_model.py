"""The model of week 09's GPU section (infer.experiments.graph_speedup_model): its arithmetic, by hand."""

import pytest

from infer.experiments.graph_speedup_model import DEVICE_GAP_US, REPLAY_US, operators_for, predict
from infer.experiments.step_roofline import decode_step_cost
from infer.models import MODEL_SPECS


def test_operators_split_into_a_fixed_part_and_one_per_layer():
    assert operators_for(4, {1: 99, 4: 312}) == 312
    assert operators_for(28, {4: 312, 1: 99}) == 99 + 71 * 27


@pytest.fixture(scope="module")
def config():
    return MODEL_SPECS["qwen2.5-1.5b"].config()


def test_eager_waits_for_the_host_and_a_replay_does_not(config):
    step = predict(config, 2, batch=1, context=1024, operators=2000, host_us_per_operator=10.0, attention="paged")
    assert step.host_ms == pytest.approx(20.0)
    assert step.eager_ms == step.host_ms, "2,000 launches at 10 us outlast the device's work: eager is host-bound"
    assert step.graph_ms == pytest.approx(step.device_ms + REPLAY_US / 1e3)
    assert step.device_ms == pytest.approx(step.floor_ms + 2000 * DEVICE_GAP_US / 1e3)
    cost = decode_step_cost(config, 1, 1024, 2)
    assert step.floor_ms == pytest.approx(1e3 * cost.bytes / 3.35e12), "batch 1 decode is bound by memory"


def test_the_gather_reads_the_kv_three_times(config):
    paged, gather = (predict(config, 2, 64, 1024, 2000, 10.0, attention) for attention in ("paged", "gather"))
    kv_ms = 1e3 * decode_step_cost(config, 64, 1024, 2).kv_bytes / 3.35e12
    assert gather.device_ms - paged.device_ms == pytest.approx(2 * kv_ms)


def test_the_graph_speedup_shrinks_as_the_batch_grows(config):
    speedups = [predict(config, 2, b, 1024, 2000, 10.0, "paged").graph_speedup for b in (1, 8, 32, 256)]
    assert speedups == sorted(speedups, reverse=True) and speedups[-1] > 1
