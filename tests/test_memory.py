"""The memory calculator against numbers worked out by hand (and parameter counts against the
real model built on the meta device)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from infer import memory
from infer.models import MODEL_SPECS


@pytest.mark.parametrize(
    "name, dtype, expected",
    [
        ("qwen2.5-1.5b", torch.bfloat16, 2 * 28 * 2 * 128 * 2),  # 28,672
        ("qwen2.5-0.5b", torch.bfloat16, 2 * 24 * 2 * 64 * 2),  # 12,288
        ("llama-3.2-1b", torch.bfloat16, 2 * 16 * 8 * 64 * 2),  # 32,768
        ("tiny", torch.float32, 2 * 4 * 2 * 32 * 4),  # 2,048
        ("qwen2.5-1.5b", "fp32", 2 * 28 * 2 * 128 * 4),
        ("qwen2.5-1.5b", "fp8", 2 * 28 * 2 * 128 * 1),
    ],
)
def test_kv_bytes_per_token_by_hand(name, dtype, expected):
    got = memory.kv_bytes_per_token(MODEL_SPECS[name].config(), dtype)
    assert got == expected, f"{name} {dtype}: expected 2 x layers x KV heads x head dim x bytes = {expected}, got {got}"


@pytest.mark.parametrize("name", list(MODEL_SPECS))
def test_parameter_count_matches_the_built_model(name):
    config = MODEL_SPECS[name].config()
    with torch.device("meta"):
        built = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    assert memory.num_parameters(config) == built


def test_published_parameter_counts_and_weight_bytes():
    assert memory.num_parameters(MODEL_SPECS["qwen2.5-1.5b"].config()) == 1_543_714_304
    assert memory.num_parameters(MODEL_SPECS["qwen2.5-0.5b"].config()) == 494_032_768
    assert memory.num_parameters(MODEL_SPECS["llama-3.2-1b"].config()) == 1_235_814_400
    assert memory.weight_bytes(MODEL_SPECS["qwen2.5-1.5b"].config(), "bf16") == 3_087_428_608


def test_tokens_and_sequences_that_fit_by_hand():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    # vLLM's budget on an 80 GiB card: 0.9 x 80 x 2^30 - 3,087,428,608 (weights) - 2 x 2^30 (activations)
    # = 72,074,499,072 bytes; / 28,672 bytes per token = 2,513,759.04 -> 2,513,759 tokens.
    assert memory.kv_budget_bytes(config, "bf16", 80, 2) == pytest.approx(72_074_499_072)
    assert memory.kv_tokens_that_fit(config, "bf16", 80, 2) == 2_513_759
    assert memory.max_concurrent_sequences(config, "bf16", 80, 4096, 2) == 613  # 2,513,759 // 4096
    # 24 GiB: (0.9 x 24 x 2^30 - 3,087,428,608 - 2 x 2^30) / 28,672 = 626,322.2 tokens; // 2048 = 305 sequences.
    assert memory.max_concurrent_sequences(config, "bf16", 24, 2048, 2) == 305
    # The whole card (gpu_memory_utilization=1.0): the 8 GiB that vLLM leaves alone by default join the cache.
    whole = memory.kv_tokens_that_fit(config, "bf16", 80, 2, gpu_memory_utilization=1.0)
    assert whole == (80 * 2**30 - 3_087_428_608 - 2 * 2**30) // 28_672 == 2_813_352


def test_nothing_fits_when_the_weights_do_not():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    assert memory.kv_tokens_that_fit(config, "fp32", 8, 2) == 0  # 0.9 x 8 GiB < 6.2 GB of fp32 weights + 2 GiB
    with pytest.raises(ValueError):
        memory.max_concurrent_sequences(config, "bf16", 80, 0, 2)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        memory.kv_tokens_that_fit(config, "bf16", 80, 2, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="unknown dtype"):
        memory.bytes_per_element("int3")


def test_plans_table_has_one_row_per_plan_in_gib():
    config = MODEL_SPECS["llama-3.2-1b"].config()
    plans = [memory.memory_plan("llama-3.2-1b", config, "bf16", gib, 4096, 2) for gib in (24, 80, 141)]
    assert [p.sequences for p in plans] == sorted(p.sequences for p in plans)
    assert plans[0].weight_gib == pytest.approx(1_235_814_400 * 2 / 2**30)
    table = memory.format_plans(plans)
    assert len(table.splitlines()) == 4 and "GiB" in table.splitlines()[0] and "util" in table.splitlines()[0]
