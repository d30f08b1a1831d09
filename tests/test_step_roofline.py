"""Week 09's roofline of one engine step (infer/experiments/step_roofline.py): the step's cost reads
the weights once for the whole batch and the KV once per sequence, its floor is set by the slower
roof, and a measured step is reported as the fraction of that floor it reaches."""

import pytest

from infer.experiments.step_roofline import decode_step_cost, floor_ms, step_against_roofline
from infer.roofline import ROOFLINE_PROBES, MeasuredRoofline, forward_cost


def test_a_batch_reads_the_weights_once_and_each_sequences_kv(tiny):
    one = forward_cost(tiny.config, 1, 100, 4)
    batch = decode_step_cost(tiny.config, 8, 100, 4)
    assert batch.weight_bytes == one.weight_bytes, "the weights are read once per step, whatever the batch"
    assert batch.kv_bytes == 8 * one.kv_bytes and batch.flops == 8 * one.flops
    assert decode_step_cost(tiny.config, 1, 100, 4) == one


def test_the_floor_is_set_by_the_slower_roof(tiny):
    cost = decode_step_cost(tiny.config, 32, 288, 4)
    slow_memory = MeasuredRoofline(peak_flops=1e15, bandwidth=1e9, probe=ROOFLINE_PROBES["cpu"])
    slow_compute = MeasuredRoofline(peak_flops=1e9, bandwidth=1e15, probe=ROOFLINE_PROBES["cpu"])
    assert floor_ms(cost, slow_memory) == (pytest.approx(cost.bytes / 1e9 * 1e3), "memory")
    assert floor_ms(cost, slow_compute) == (pytest.approx(cost.flops / 1e9 * 1e3), "compute")


def test_a_measured_step_is_a_fraction_of_its_floor(tiny):
    # a roof far above any CPU's (1 PFLOP/s, 10 TB/s), so that every real step lands below it
    roofline = MeasuredRoofline(peak_flops=1e15, bandwidth=1e13, probe=ROOFLINE_PROBES["cpu"])
    row = step_against_roofline(tiny, roofline, batch=4, context=32, steps=2, rounds=1)
    assert set(row["stores"]) == {"slots", "paged"}
    for store in row["stores"].values():
        assert store["fraction_of_roofline"] == pytest.approx(row["floor_ms"] / store["step_ms"]["median"])
        assert 0 < store["fraction_of_roofline"] < 1, "a step faster than a roof no CPU reaches: the cost is miscounted"
