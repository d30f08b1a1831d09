"""The memory calculator against numbers worked out by hand (and parameter counts against the
real model built on the meta device)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from infer import memory
from infer.models import MODEL_SPECS


@pytest.mark.parametrize("name, dtype, expected", [
    ("qwen2.5-1.5b", torch.bfloat16, 2 * 28 * 2 * 128 * 2),  # 28,672
    ("qwen2.5-0.5b", torch.bfloat16, 2 * 24 * 2 * 64 * 2),   # 12,288
    ("llama-3.2-1b", torch.bfloat16, 2 * 16 * 8 * 64 * 2),   # 32,768
    ("tiny", torch.float32, 2 * 4 * 2 * 32 * 4),              # 2,048
    ("qwen2.5-1.5b", "fp32", 2 * 28 * 2 * 128 * 4),
    ("qwen2.5-1.5b", "fp8", 2 * 28 * 2 * 128 * 1),
])
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
    # 80 GB card, 2 GB reserve: (80e9 - 3,087,428,608 - 2e9) / 28,672 = 2,612,743.98 -> 2,612,743 tokens.
    assert memory.kv_tokens_that_fit(config, "bf16", 80, 2) == 2_612_743
    assert memory.max_concurrent_sequences(config, "bf16", 80, 4096, 2) == 637  # 2,612,743 // 4096
    # 24 GB: (24e9 - 3,087,428,608 - 2e9) / 28,672 = 659,618.8 -> 659,618 tokens; // 2048 = 322 sequences.
    assert memory.max_concurrent_sequences(config, "bf16", 24, 2048, 2) == 322


def test_nothing_fits_when_the_weights_do_not():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    assert memory.kv_tokens_that_fit(config, "fp32", 8, 2) == 0  # 6.2 GB of fp32 weights + 2 GB reserve > 8 GB
    with pytest.raises(ValueError):
        memory.max_concurrent_sequences(config, "bf16", 80, 0, 2)
    with pytest.raises(ValueError, match="unknown dtype"):
        memory.bytes_per_element("int3")


def test_plans_table_has_one_row_per_plan():
    config = MODEL_SPECS["llama-3.2-1b"].config()
    plans = [memory.memory_plan("llama-3.2-1b", config, "bf16", gb, 4096, 2) for gb in (24, 80, 141)]
    assert [p.sequences for p in plans] == sorted(p.sequences for p in plans)
    assert len(memory.format_plans(plans).splitlines()) == 4
