"""The GPU memory bill of serving: weights once, plus a KV cache that grows with every token.

    KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element
    weight bytes       = parameters x bytes per element
    tokens that fit    = (card - weights - activation reserve) / KV bytes per token
    concurrent seqs    = tokens that fit // tokens per sequence

The reserve covers what is neither weights nor cache: one forward pass's activations (the
logits of a long prefill alone can take hundreds of MB), the CUDA context and allocator slack.
vLLM measures it by profiling a forward pass; here it is a number you choose.

GB means 10^9 bytes throughout, as on a GPU's spec sheet. Configs are `transformers` configs,
e.g. `infer.models.MODEL_SPECS["qwen2.5-1.5b"].config()`.
"""

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from infer.model import Arch

GB = 1e9
DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp16": torch.float16, "float16": torch.float16, "fp8": torch.float8_e4m3fn}


def bytes_per_element(dtype: torch.dtype | str) -> int:
    """2 for bf16, 4 for fp32, ...; also accepts the names "bf16", "fp16", "fp32", "fp8"."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype name {dtype!r}; known: {', '.join(DTYPE_NAMES)}")
        dtype = DTYPE_NAMES[dtype]
    return dtype.itemsize


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype | str) -> int:
    """Bytes of K and V that one token leaves in the cache, over all layers."""
    arch = Arch.from_config(config)
    return 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * bytes_per_element(dtype)


def num_parameters(config: PretrainedConfig) -> int:
    """Parameters of the model, counted from its config (the same count as the built model's)."""
    a = Arch.from_config(config)
    q_out, kv_out = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    attention = a.hidden_size * (q_out + 2 * kv_out) + q_out * a.hidden_size
    attention += (q_out + 2 * kv_out) * a.qkv_bias + a.hidden_size * a.o_bias
    mlp = 3 * a.hidden_size * a.intermediate_size + (2 * a.intermediate_size + a.hidden_size) * a.mlp_bias
    per_layer = attention + mlp + 2 * a.hidden_size  # two RMSNorm weights
    embeddings = a.vocab_size * a.hidden_size * (1 if a.tie_word_embeddings else 2)  # a tied lm_head is free
    return embeddings + a.num_layers * per_layer + a.hidden_size  # + the final norm


def weight_bytes(config: PretrainedConfig, dtype: torch.dtype | str) -> int:
    return num_parameters(config) * bytes_per_element(dtype)


def kv_tokens_that_fit(config: PretrainedConfig, dtype: torch.dtype | str, gpu_gb: float, reserve_gb: float) -> int:
    """How many tokens' K and V fit beside the weights and the reserve (0 if the weights do not fit)."""
    free = gpu_gb * GB - weight_bytes(config, dtype) - reserve_gb * GB
    return max(0, int(free // kv_bytes_per_token(config, dtype)))


def max_concurrent_sequences(config: PretrainedConfig, dtype: torch.dtype | str, gpu_gb: float, seq_len: int,
                             reserve_gb: float) -> int:
    """How many sequences of `seq_len` tokens (prompt + output) can hold their whole cache at once."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return kv_tokens_that_fit(config, dtype, gpu_gb, reserve_gb) // seq_len


@dataclass(frozen=True)
class MemoryPlan:
    """One model on one card: the whole bill, for a table row."""

    model: str
    dtype: str
    gpu_gb: float
    reserve_gb: float
    weight_gb: float
    kv_bytes_per_token: int
    kv_tokens: int
    seq_len: int
    sequences: int


def memory_plan(name: str, config: PretrainedConfig, dtype: torch.dtype | str, gpu_gb: float, seq_len: int,
                reserve_gb: float) -> MemoryPlan:
    return MemoryPlan(model=name, dtype=dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch."),
                      gpu_gb=gpu_gb, reserve_gb=reserve_gb, weight_gb=weight_bytes(config, dtype) / GB,
                      kv_bytes_per_token=kv_bytes_per_token(config, dtype),
                      kv_tokens=kv_tokens_that_fit(config, dtype, gpu_gb, reserve_gb), seq_len=seq_len,
                      sequences=max_concurrent_sequences(config, dtype, gpu_gb, seq_len, reserve_gb))


def format_plans(plans: list[MemoryPlan]) -> str:
    """The plans as a plain-text table."""
    lines = [f"{'model':<14} {'dtype':<6} {'card GB':>7} {'weights GB':>10} {'KV B/token':>10} "
             f"{'tokens that fit':>15} {'seqs of ' + str(plans[0].seq_len) if plans else 'seqs':>13}"]
    for p in plans:
        lines.append(f"{p.model:<14} {p.dtype:<6} {p.gpu_gb:>7.0f} {p.weight_gb:>10.2f} {p.kv_bytes_per_token:>10,} "
                     f"{p.kv_tokens:>15,} {p.sequences:>13,}")
    return "\n".join(lines)
