"""Week 09's grouped profile of an engine step (infer/experiments/step_profile.py): operators land in
the group a reader expects, and the groups with the host's share add up to the profiled step."""

from functools import partial

import pytest

from infer.engine import Engine
from infer.engine.sequence import benchmark_params
from infer.experiments.step_profile import GROUP_NAMES, HOST, OTHER, op_group, profile_steps
from infer.model import Transformer


@pytest.mark.parametrize(
    "name, group",
    [
        ("aten::mm", "GEMM"),
        ("aten::addmm", "GEMM"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::_index_put_impl_", "cache writes"),
        ("aten::index_put_", "cache writes"),
        ("aten::index_select", "KV gather"),
        ("aten::index", "KV gather"),
        ("aten::argmax", "sampling"),
        ("aten::copy_", "copies and layout"),
        ("aten::silu", "norms and activations"),
        ("aten::rsqrt", "norms and activations"),
        ("aten::tril", OTHER),  # a mask, not a layout change: no group claims it by a prefix
        ("aten::something_new", OTHER),
    ],
)
def test_each_operator_lands_in_its_group(name, group):
    assert op_group(name) == group


def small_engine(model):
    engine = Engine(model, "chunked", max_num_seqs=4, max_num_batched_tokens=256, max_model_len=128, kv_store="paged")
    for _ in range(4):
        engine.add_request([5] * 32, benchmark_params(8))
    engine.step()
    return engine


def test_the_groups_and_the_host_add_up_to_the_profiled_step(tiny):
    model = Transformer.from_hf(tiny.model)
    result = profile_steps(partial(small_engine, model), steps=3)
    groups = result["groups_ms"]
    assert set(groups) == set(GROUP_NAMES)
    assert groups["GEMM"] > 0 and groups["attention"] > 0 and groups["KV gather"] > 0, groups
    assert sum(groups.values()) == pytest.approx(result["profiled_step_ms"]) or groups[HOST] == 0
    assert result["step_ms"] > 0
