"""Which attention kernels an engine step runs, chosen from what this machine has.

A step's attention has two parts: the decodes (one new token per sequence, all in one call) and
the prefill chunks. Each can run on:
- "flash-attn": flash-attn's paged kernels read the blocks where they lie, decodes through
  `flash_attn_with_kvcache` and every prefill chunk of the step in one `flash_attn_varlen_func`
  (infer.flash_attn_paged). CUDA, fp16/bf16, and blocks of a size its kernels take.
- "triton": the course's Triton kernel for the decodes (infer.paged_decode_triton), any block
  size, on CUDA; prefill chunks stay on PyTorch's attention.
- "in_place": the course's compiled CPU kernel for the decodes (infer.cpu_kernels), float32.
- "sdpa": every sequence's blocks gathered into a batch, then PyTorch's
  `scaled_dot_product_attention`: runs anywhere.

"auto" takes the first of flash-attn, triton that can run here on a GPU, and sdpa on a CPU
(where week 09 measured the in-place kernel slower than the gather). A kernel asked for by
name that cannot run here is an error that says why; the engine's startup line names the
kernels chosen and why the faster ones were passed over.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from infer.cpu_kernels import KernelUnavailable, in_place_decode_attention

DECODE_ATTENTION = ("auto", "sdpa", "in_place", "triton", "flash-attn")


@dataclass(frozen=True)
class AttentionChoice:
    decode: str  # the decodes' kernel, by name
    prefill: str  # the prefill chunks' kernel, by name
    decode_kernel: Callable | None = None  # (q, k_cache, v_cache, block_tables, lengths, scale) -> out; None: sdpa
    prefill_kernel: Callable | None = None  # all chunks in one call (infer.flash_attn_paged); None: sdpa per chunk
    passed_over: tuple[str, ...] = ()  # the faster kernels "auto" could not use, each with why

    @property
    def line(self) -> str:
        line = f"attention: decode {self.decode}, prefill {self.prefill}"
        return line + (f" ({'; '.join(self.passed_over)})" if self.passed_over else "")


def flash_attn_reason(model, block_size: int) -> str | None:
    from infer.flash_attn_paged import flash_attn_unavailable_reason

    weight = model.embed.weight
    return flash_attn_unavailable_reason(block_size, weight.dtype, weight.device, model.arch.head_dim)


def triton_reason(model, block_size: int) -> str | None:
    from infer.paged_decode_triton import available

    weight = model.embed.weight
    availability = available(weight.device.type, weight.dtype, model.arch.head_dim)
    return None if availability else availability.reason


def choose_attention(decode_attention, model, block_size: int) -> AttentionChoice:
    """The kernels for `decode_attention` (a name of DECODE_ATTENTION, or a decode function of
    your own with the kernels' signature, lab 09) on `model`'s device and dtype."""
    if callable(decode_attention):
        return AttentionChoice("your function", "sdpa", decode_kernel=decode_attention)
    if decode_attention not in DECODE_ATTENTION:
        raise ValueError(
            f"unknown decode_attention {decode_attention!r}; valid: {', '.join(map(repr, DECODE_ATTENTION))}"
        )
    device = model.embed.weight.device
    if decode_attention == "auto":
        passed_over = []
        if device.type == "cuda":
            for name, reason_of in (("flash-attn", flash_attn_reason), ("triton", triton_reason)):
                reason = reason_of(model, block_size)
                if reason is None:
                    return _kernels(name, model, tuple(passed_over))
                passed_over.append(f"{name}: {reason}")
        return AttentionChoice("sdpa", "sdpa", passed_over=tuple(passed_over))
    reason_of = {"flash-attn": flash_attn_reason, "triton": triton_reason}.get(decode_attention)
    reason = reason_of(model, block_size) if reason_of else None
    if reason is not None:
        raise ValueError(f"decode_attention={decode_attention!r} cannot run here: {reason}")
    return _kernels(decode_attention, model)


def _kernels(name: str, model, passed_over: tuple[str, ...] = ()) -> AttentionChoice:
    if name == "flash-attn":
        from infer.flash_attn_paged import flash_decode_attention, flash_prefill_attention

        return AttentionChoice(name, name, flash_decode_attention, flash_prefill_attention, passed_over)
    if name == "triton":
        from infer.paged_decode_triton import triton_paged_decode_attention

        return AttentionChoice(name, "sdpa", triton_paged_decode_attention, passed_over=passed_over)
    if name == "in_place":
        weight = model.embed.weight
        if weight.dtype != torch.float32:
            raise ValueError(f"decode_attention='in_place' is a float32 kernel; this model is {weight.dtype}")
        try:
            return AttentionChoice(name, "sdpa", in_place_decode_attention(weight.device))
        except KernelUnavailable as error:
            raise ValueError(f"decode_attention='in_place' cannot run here: {error}") from error
    return AttentionChoice("sdpa", "sdpa", passed_over=passed_over)
