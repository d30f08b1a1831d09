"""The GPU memory bill of serving: weights once, plus a KV cache that grows with every token.

    KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per element
    weight bytes       = parameters x bytes per element
    KV budget          = gpu_memory_utilization x card - weights - activations     (vLLM's rule, modelled)
    tokens that fit    = KV budget // KV bytes per token
    concurrent seqs    = tokens that fit // tokens per sequence

The budget follows vLLM: it claims a fraction `gpu_memory_utilization` of the card's total
memory as the driver reports it (0.9 here; vLLM's own default is 0.92 in vLLM 0.32), loads the
weights, profiles one forward pass of the largest batch it will schedule to learn its peak
activation memory, and gives what is left of its share to the KV cache. Whatever else vLLM
allocates by then (memory outside PyTorch's allocator, such as buffers that NCCL and some
attention backends allocate themselves, and an estimate of its CUDA graphs) comes out of its
share too. Here `activations` is one number you
choose for all of that (vLLM measures it), so the result is a model of vLLM's budget, not a
reading of it.

Units: card and budget sizes are in GiB (2^30 bytes). An "80 GB" H100 or A100 carries 80 GiB of
memory, of which the driver reports a little less (about 79 GiB) as the total that vLLM takes
its share of; the card sizes here are the nominal ones. 1 GB = 10^9 bytes is used only where it
is written "GB". Configs are `transformers` configs, e.g.
`infer.models.MODEL_SPECS["qwen2.5-1.5b"].config()`.
"""

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from infer.model import Arch
from infer.profiles import dtype_name

GB = 1e9
GIB = 2**30
VLLM_GPU_MEMORY_UTILIZATION = 0.9  # the course's share of the card: vLLM's long-time default (0.92 in 0.32)
DTYPE_NAMES = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
}


def bytes_per_element(dtype: torch.dtype | str) -> int:
    """2 for bf16, 4 for fp32, ...; also accepts the names "bf16", "fp16", "fp32", "fp8"."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype name {dtype!r}; known: {', '.join(DTYPE_NAMES)}")
        dtype = DTYPE_NAMES[dtype]
    return dtype.itemsize


def kv_token_bytes(num_layers: int, num_kv_heads: int, head_dim: int, element_bytes: int) -> int:
    """The formula: one K and one V vector per KV head per layer, for each token."""
    return 2 * num_layers * num_kv_heads * head_dim * element_bytes


def sequences_that_fit(
    gpu_bytes: float, weight_bytes: float, reserve_bytes: float, kv_bytes_per_token: int, seq_len: int
) -> int:
    """The formula: whole sequences of `seq_len` tokens whose K and V fit beside weights and reserve."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    free = gpu_bytes - weight_bytes - reserve_bytes
    return max(0, int(free // kv_bytes_per_token)) // seq_len


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype | str) -> int:
    """Bytes of K and V that one token leaves in the cache, over all layers."""
    arch = Arch.from_config(config)
    return kv_token_bytes(arch.num_layers, arch.num_kv_heads, arch.head_dim, bytes_per_element(dtype))


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


def kv_budget_bytes(
    config: PretrainedConfig,
    dtype: torch.dtype | str,
    gpu_gib: float,
    activation_gib: float,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> float:
    """vLLM's KV-cache budget, modelled: its share of the card, minus the weights, minus the peak
    activations of a profiled forward pass (can be negative: then nothing fits)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    return gpu_memory_utilization * gpu_gib * GIB - weight_bytes(config, dtype) - activation_gib * GIB


def kv_tokens_that_fit(
    config: PretrainedConfig,
    dtype: torch.dtype | str,
    gpu_gib: float,
    activation_gib: float,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> int:
    """How many tokens' K and V fit in the KV budget (0 if the weights do not fit)."""
    budget = kv_budget_bytes(config, dtype, gpu_gib, activation_gib, gpu_memory_utilization)
    return max(0, int(budget // kv_bytes_per_token(config, dtype)))


def max_concurrent_sequences(
    config: PretrainedConfig,
    dtype: torch.dtype | str,
    gpu_gib: float,
    seq_len: int,
    activation_gib: float,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> int:
    """How many sequences of `seq_len` tokens (prompt + output) can hold their whole cache at once."""
    if seq_len < 1:
        raise ValueError(f"seq_len must be >= 1, got {seq_len}")
    return kv_tokens_that_fit(config, dtype, gpu_gib, activation_gib, gpu_memory_utilization) // seq_len


@dataclass(frozen=True)
class MemoryPlan:
    """One model on one card: the whole bill, for a table row (sizes in GiB)."""

    model: str
    dtype: str
    gpu_gib: float
    gpu_memory_utilization: float
    activation_gib: float
    weight_gib: float
    kv_bytes_per_token: int
    kv_tokens: int
    seq_len: int
    sequences: int


def memory_plan(
    name: str,
    config: PretrainedConfig,
    dtype: torch.dtype | str,
    gpu_gib: float,
    seq_len: int,
    activation_gib: float,
    gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION,
) -> MemoryPlan:
    return MemoryPlan(
        model=name,
        dtype=dtype if isinstance(dtype, str) else dtype_name(dtype),
        gpu_gib=gpu_gib,
        gpu_memory_utilization=gpu_memory_utilization,
        activation_gib=activation_gib,
        weight_gib=weight_bytes(config, dtype) / GIB,
        kv_bytes_per_token=kv_bytes_per_token(config, dtype),
        kv_tokens=kv_tokens_that_fit(config, dtype, gpu_gib, activation_gib, gpu_memory_utilization),
        seq_len=seq_len,
        sequences=max_concurrent_sequences(config, dtype, gpu_gib, seq_len, activation_gib, gpu_memory_utilization),
    )


def format_plans(plans: list[MemoryPlan]) -> str:
    """The plans as a plain-text table (GiB = 2^30 bytes)."""
    seqs_header = f"seqs of {plans[0].seq_len}" if plans else "sequences"
    lines = [
        f"{'model':<14} {'dtype':<6} {'card GiB':>8} {'x util':>6} {'weights GiB':>11} {'activ. GiB':>10} "
        f"{'KV B/token':>10} {'tokens that fit':>15} {seqs_header:>13}"
    ]
    for p in plans:
        lines.append(
            f"{p.model:<14} {p.dtype:<6} {p.gpu_gib:>8g} {p.gpu_memory_utilization:>6.2f} {p.weight_gib:>11.2f} "
            f"{p.activation_gib:>10g} {p.kv_bytes_per_token:>10,} {p.kv_tokens:>15,} {p.sequences:>13,}"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- checked against the allocator


@dataclass(frozen=True)
class MeasuredMemory:
    """What CUDA's allocator saw during one real generation, next to the calculator's numbers."""

    weight_bytes_allocated: int  # the model's parameters as they sit on the device
    weight_bytes_predicted: int
    cache_bytes_allocated: int  # memory_allocated() growth when the cache was created
    cache_bytes_predicted: int  # KV bytes per token x capacity
    peak_above_cache: int  # max_memory_allocated() during generation, above weights + cache: activations

    def __str__(self) -> str:
        mib = 2**20
        return (
            f"weights: allocated {self.weight_bytes_allocated / mib:,.1f} MiB, "
            f"predicted {self.weight_bytes_predicted / mib:,.1f} MiB\n"
            f"KV cache: allocated {self.cache_bytes_allocated / mib:,.1f} MiB, "
            f"predicted {self.cache_bytes_predicted / mib:,.1f} MiB\n"
            f"activation peak during generation (above weights + cache): {self.peak_above_cache / mib:,.1f} MiB"
        )


def measure_cuda_generation_memory(hf_model, prompt_ids: torch.Tensor, max_new_tokens: int) -> MeasuredMemory:
    """Build the course model from `hf_model` (on CUDA), allocate a KVCache for one sequence,
    generate with it, and read torch.cuda's allocator counters at each stage."""
    from infer.generate import cached_greedy_generate
    from infer.kv_cache import KVCache
    from infer.model import Transformer

    device = next(hf_model.parameters()).device
    if device.type != "cuda":
        raise RuntimeError(f"the model is on {device}; this measurement needs CUDA")
    dtype = next(hf_model.parameters()).dtype
    capacity = prompt_ids.shape[-1] + max_new_tokens

    def allocated() -> int:
        torch.cuda.synchronize(device)
        return torch.cuda.memory_allocated(device)

    start = allocated()
    model = Transformer.from_hf(hf_model)
    with_weights = allocated()
    cache = KVCache.for_model(model, max_seqs=1, max_len=capacity)
    with_cache = allocated()
    torch.cuda.reset_peak_memory_stats(device)
    cached_greedy_generate(model, prompt_ids, max_new_tokens, cache)
    peak = torch.cuda.max_memory_allocated(device)
    result = MeasuredMemory(
        weight_bytes_allocated=with_weights - start,
        weight_bytes_predicted=weight_bytes(hf_model.config, dtype),
        cache_bytes_allocated=with_cache - with_weights,
        cache_bytes_predicted=kv_bytes_per_token(hf_model.config, dtype) * capacity,
        peak_above_cache=peak - with_cache,
    )
    del model, cache
    torch.cuda.empty_cache()
    return result
