"""The course's own decoder for the Llama / Qwen2 family, in plain PyTorch.

One file, five small pieces: `RMSNorm`, rotary embeddings (`Rotary`, applied at explicit
positions), grouped-query `Attention` that reads and writes a KV cache, the SwiGLU `MLP`, and
the `Transformer` that stacks them. `Transformer.from_hf` copies the weights of the matching
`transformers` model, and its logits match that model's (tests/test_model.py).

The forward pass is built for a serving engine, not for one padded batch: it takes a *flat*
list of N tokens, each with its own position and the id of the sequence (cache slot) it belongs
to. A prompt's prefill, a chunk of a longer prompt and single decode tokens of other sequences
can all share one call (week 05):

    logits = model(token_ids, positions, cache, seq_ids)   # [N] each -> [N, vocab]

Attention reaches the cache through one of two objects with the same `attend` method:
`PerSequenceKV` for a cache written and read at positions (week 02's, used one sequence at a
time), or the engine's `PagedKV` (infer.paged_attention), which writes every new token through a
slot mapping and batches the decodes through block tables.

Supported configs: `model_type` "llama" and "qwen2"; rope_type "default" and "llama3" (the
frequency rescaling of Llama 3.1/3.2); no sliding window. Anything else is rejected by
`Arch.from_config` with the reason, never approximated.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig

from infer.paged_attention import PagedKV, SeqRun, causal_attention, plan_runs


@dataclass(frozen=True)
class Arch:
    """Everything the model (and the memory calculator) needs from a `transformers` config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # the "llama3" parameters, or None for plain RoPE
    qkv_bias: bool  # Qwen2: biases on q, k and v
    o_bias: bool  # Llama's attention_bias puts one on o as well; Qwen2 never does
    mlp_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> "Arch":
        kind = config.model_type
        if kind not in ("llama", "qwen2"):
            raise ValueError(f"model_type {kind!r} is not supported; this decoder covers 'llama' and 'qwen2'")
        if getattr(config, "use_sliding_window", False):
            raise ValueError("sliding-window attention (use_sliding_window=True) is not supported")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not supported; the SwiGLU MLP uses 'silu'")
        rope = _rope_parameters(config)
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ("default", "llama3"):
            raise ValueError(f"rope_type {rope_type!r} is not supported; only 'default' and 'llama3'")
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise ValueError(f"{heads} query heads cannot be shared evenly by {kv_heads} KV heads")
        attention_bias = bool(getattr(config, "attention_bias", False))
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_norm_eps=config.rms_norm_eps,
            rope_theta=float(rope["rope_theta"]),
            rope_scaling=dict(rope) if rope_type == "llama3" else None,
            qkv_bias=kind == "qwen2" or attention_bias,
            o_bias=kind == "llama" and attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            tie_word_embeddings=bool(config.tie_word_embeddings),
        )


def _rope_parameters(config: PretrainedConfig) -> dict:
    # transformers 5 gathers rope_theta and rope_scaling into `rope_parameters`; 4.x kept them apart.
    rope = getattr(config, "rope_parameters", None)
    if rope:
        return dict(rope)
    return {"rope_theta": getattr(config, "rope_theta", 10000.0), **(getattr(config, "rope_scaling", None) or {})}


# ---------------------------------------------------------------- the building blocks


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 like the reference, then cast back."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Rotary(nn.Module):
    """Rotary position embedding: rotate each (i, i + d/2) pair of a head by position * frequency_i.

    Positions are explicit, one per token, so tokens of different sequences at different
    positions can sit in one flat batch."""

    def __init__(self, head_dim: int, theta: float, scaling: dict | None = None):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        if scaling is not None:
            inv_freq = llama3_scaled_frequencies(inv_freq, scaling)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin, [N, head_dim] each, for N positions (computed in float32)."""
        angles = positions.float()[:, None] * self.inv_freq.float()[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [N, heads, head_dim] by the angles of its tokens' positions (cos, sin: [N, head_dim])."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def llama3_scaled_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3.1's long-context RoPE: slow (long-wavelength) frequencies are divided by `factor`,
    fast ones kept, and the band in between interpolated smoothly."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    smooth = ((old_context / wavelength - low) / (high - low)).clamp(0, 1)
    scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(
        wavelength > old_context / low,
        inv_freq / factor,
        torch.where(wavelength < old_context / high, inv_freq, scaled),
    )


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.gate = nn.Linear(arch.hidden_size, arch.intermediate_size, bias=arch.mlp_bias)
        self.up = nn.Linear(arch.hidden_size, arch.intermediate_size, bias=arch.mlp_bias)
        self.down = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=arch.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class PerSequenceKV:
    """A cache written and read at positions (week 02's `KVCache`, `ConcatKVCache`, or a
    student's own with just `write` and `read`), used one sequence at a time: simple and exact.
    The engine passes a `PagedKV` instead, which batches the decodes."""

    def __init__(self, cache, runs: list[SeqRun]):
        self.cache, self.runs = cache, runs

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(q)
        for run in self.runs:
            self.cache.write(layer, run.seq_id, run.start, k[run.rows].transpose(0, 1), v[run.rows].transpose(0, 1))
            keys, values = self.cache.read(layer, run.seq_id, run.end)  # [kv_heads, end, head_dim]
            out[run.rows] = causal_attention(q[run.rows], keys, values, run.start)
        return out


class Attention(nn.Module):
    """Grouped-query attention: `num_heads` query heads share `num_kv_heads` K/V heads.

    For each sequence in the batch: store its new K and V in the cache at its positions, then
    let each query attend to that sequence's keys up to (and including) its own position."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = arch.num_heads, arch.num_kv_heads, arch.head_dim
        self.q = nn.Linear(arch.hidden_size, arch.num_heads * arch.head_dim, bias=arch.qkv_bias)
        self.k = nn.Linear(arch.hidden_size, arch.num_kv_heads * arch.head_dim, bias=arch.qkv_bias)
        self.v = nn.Linear(arch.hidden_size, arch.num_kv_heads * arch.head_dim, bias=arch.qkv_bias)
        self.o = nn.Linear(arch.num_heads * arch.head_dim, arch.hidden_size, bias=arch.o_bias)

    def forward(self, x, cos, sin, kv, layer: int) -> torch.Tensor:
        n = x.shape[0]
        q = apply_rotary(self.q(x).view(n, self.num_heads, self.head_dim), cos, sin)
        k = apply_rotary(self.k(x).view(n, self.num_kv_heads, self.head_dim), cos, sin)
        v = self.v(x).view(n, self.num_kv_heads, self.head_dim)
        out = kv.attend(layer, q, k, v)  # stores k, v in the cache, attends over each sequence's keys
        return self.o(out.view(n, self.num_heads * self.head_dim))


class Block(nn.Module):
    """One decoder layer: pre-norm attention and pre-norm MLP, each with a residual connection."""

    def __init__(self, arch: Arch):
        super().__init__()
        self.attn_norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.attn = Attention(arch)
        self.mlp_norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.mlp = MLP(arch)

    def forward(self, x, cos, sin, kv, layer: int) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, kv, layer)
        return x + self.mlp(self.mlp_norm(x))


# ---------------------------------------------------------------- the model


class Transformer(nn.Module):
    """A Llama / Qwen2 decoder whose forward takes a flat batch of tokens and a KV cache."""

    def __init__(self, config: PretrainedConfig):
        super().__init__()
        self.config = config
        self.arch = arch = Arch.from_config(config)
        self.embed = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.rotary = Rotary(arch.head_dim, arch.rope_theta, arch.rope_scaling)
        self.layers = nn.ModuleList(Block(arch) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        cache,
        seq_ids: torch.Tensor | None = None,
        logits_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [N, vocab] for a flat batch of N tokens (or only for `logits_rows`, e.g. each
        sequence's last token, which saves a [N, vocab] matmul during prefill).

        token_ids, positions: [N]; `cache`: a positional cache (write/read) with seq_ids [N] its
        slots (None: all slot 0), or the engine's `PagedKV` for this step (seq_ids unused)."""
        if token_ids.dim() != 1 or positions.shape != token_ids.shape:
            raise ValueError(
                f"token_ids and positions must both be flat [N] tensors, got "
                f"{tuple(token_ids.shape)} and {tuple(positions.shape)}"
            )
        kv = cache if isinstance(cache, PagedKV) else PerSequenceKV(cache, plan_runs(positions, seq_ids))
        x = self.embed(token_ids)
        cos, sin = self.rotary(positions.to(x.device, non_blocking=True), x.dtype)
        for index, layer in enumerate(self.layers):
            x = layer(x, cos, sin, kv, index)
        if logits_rows is not None:
            x = x[logits_rows]
        return self.lm_head(self.norm(x))

    # -------------------------------------------------------- loading transformers weights

    @classmethod
    @torch.no_grad()
    def from_hf(cls, hf_model: nn.Module) -> "Transformer":
        """The same network as `hf_model` (a LlamaForCausalLM or Qwen2ForCausalLM), on its device
        and in its dtype, with its weights copied."""
        reference = next(hf_model.parameters())
        with torch.device(reference.device):
            model = cls(hf_model.config)
            model.to(reference.dtype)
            # Rebuilt after the cast: the rotary frequencies stay float32, as in the reference model.
            model.rotary = Rotary(model.arch.head_dim, model.arch.rope_theta, model.arch.rope_scaling)
        theirs = hf_model.state_dict()
        for name, param in model.named_parameters():  # a tied lm_head is listed once, as embed.weight
            source = hf_name(name)
            if source not in theirs:
                raise KeyError(f"{type(hf_model).__name__} has no weight {source!r} for our {name!r}")
            if theirs[source].shape != param.shape:
                raise ValueError(
                    f"{source}: shape {tuple(theirs[source].shape)} does not fit our {name} {tuple(param.shape)}"
                )
            param.copy_(theirs[source])
        return model.eval()


# Our module names -> the transformers ones: the one place where the two naming schemes meet.
HF_TOP_LEVEL = {"embed": "model.embed_tokens", "norm": "model.norm", "lm_head": "lm_head"}
HF_IN_LAYER = {
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
    "attn.q": "self_attn.q_proj",
    "attn.k": "self_attn.k_proj",
    "attn.v": "self_attn.v_proj",
    "attn.o": "self_attn.o_proj",
    "mlp.gate": "mlp.gate_proj",
    "mlp.up": "mlp.up_proj",
    "mlp.down": "mlp.down_proj",
}


def hf_name(name: str) -> str:
    """`layers.3.attn.q.weight` -> `model.layers.3.self_attn.q_proj.weight`, and so on."""
    module, leaf = name.rsplit(".", 1)
    if module.startswith("layers."):
        _, index, inner = module.split(".", 2)
        return f"model.layers.{index}.{HF_IN_LAYER[inner]}.{leaf}"
    return f"{HF_TOP_LEVEL[module]}.{leaf}"
