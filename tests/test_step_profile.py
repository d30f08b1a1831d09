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
        ("in_place_decode_attention", "attention"),  # the compiled kernel's record_function
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


def test_operator_calls_counts_what_each_layer_dispatches(tiny):
    from infer.experiments.decode_steps import decode_engine
    from infer.experiments.step_profile import operator_calls
    from infer.models import load_model

    counts = {}
    for name, loaded in (("tiny", tiny), ("tiny-draft", load_model("tiny-draft", weights="random", quiet=True))):
        engine = decode_engine(Transformer.from_hf(loaded.model), "slots", steps=4)
        engine.step()  # the prefills
        counts[name] = (operator_calls(engine), operator_calls(engine), loaded.config.num_hidden_layers)
    (tiny_a, tiny_b, tiny_layers), (draft_a, _, draft_layers) = counts["tiny"], counts["tiny-draft"]
    assert tiny_a == tiny_b > 0, f"two alike decode steps should dispatch alike operators, got {tiny_a} and {tiny_b}"
    per_layer = (tiny_a - draft_a) / (tiny_layers - draft_layers)
    assert 20 <= per_layer <= 200, f"{per_layer:.0f} operators per layer: the count misses or double-counts layers"
