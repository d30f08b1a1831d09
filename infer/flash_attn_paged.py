"""Attention over the course's block KV cache through flash-attn 2's paged kernels (week 09's GPU section).

The engine writes each step's new keys and values into the cache first; attention then only reads.
Two calls of flash-attn cover a step, in every layer:

- `flash_decode_attention`: one new token per sequence, `flash_attn_with_kvcache` with a
  `block_table` and `cache_seqlens` (no `k`/`v` to append: the cache already holds them). Same
  signature as the course's own decode kernels (infer/cpu_kernels.py).
- `flash_prefill_attention`: every prefill chunk of the step in one `flash_attn_varlen_func` call
  with a `block_table` (flash-attn 2.5.7 and later). The chunks' query rows lie one after another
  and `cu_seqlens_q` says where each begins, so chunks of different lengths need no padding and no
  Python loop: one launch for all of them, instead of one gather and one attention call per chunk.

What paged flash-attn takes (flash-attn 2.8.3, csrc/flash_attn/flash_api.cpp and
flash_attn/flash_attn_interface.py):

- The cache as [num_blocks, page_block_size, nheads_k, headdim]: a block, then its positions, then
  the heads. The course keeps [num_blocks, kv_heads, block_size, head_dim]. `k_cache.transpose(1, 2)`
  is that shape as a view, no copy: flash-attn asks only that the last dimension be contiguous
  (`stride(-1) == 1`) and reads the rest through the tensor's strides (block, row and head strides
  are `stride(0)`, `stride(-3)` and `stride(-2)`), so the course's layout serves as it is.
- `block_table`, `cache_seqlens`, `cu_seqlens_q` and `cu_seqlens_k` in int32. The engine builds its
  tables in int64; converting costs a small kernel per tensor, per call. Convert once per step
  (`as_int32`) and pass the int32 tensors to every layer: these functions pass int32 through as is.
- Blocks of a multiple of 256 positions (`page_block_size % 256 == 0`). The paged path always runs
  the split-KV kernel, which reads keys in tiles of up to 256 rows, each tile addressed from one
  block's start; a tile must not straddle two blocks. The course's blocks hold 16 positions (small
  blocks waste little memory, week 08), so flash-attn 2 cannot read them and the engine falls back
  to its own path; `flash_attn_unavailable_reason` says so in one line.
- fp16 or bf16, an Ampere or newer GPU, a head size of at most 256 and a multiple of 8 (otherwise
  flash-attn pads it, which here would copy the whole cache on every call).

Causal masks with fewer queries than keys are aligned to the bottom right (flash-attn 2.1 and
later): query i of a chunk of n queries over `end` keys sees keys 0..i + end - n. A chunk at
positions start..start+n-1 passes end = start + n, so query i sees keys 0..start + i, the chunk's
own prefix and everything before it.
"""

import importlib
import importlib.util
import inspect

import torch

PAGE_BLOCK_MULTIPLE = 256  # flash_api.cpp: page_block_size % 256 == 0
MAX_HEAD_DIM = 256
HEAD_DIM_MULTIPLE = 8
DTYPES = (torch.float16, torch.bfloat16)


def _flash_attn():
    """flash_attn, imported on first use, so that importing this module never needs it."""
    return importlib.import_module("flash_attn")


def as_int32(indices: torch.Tensor) -> torch.Tensor:
    """`indices` as flash-attn takes them: int32, contiguous. The same tensor when it already is;
    call it once per step and hand the result to every layer."""
    return indices.to(torch.int32).contiguous()


def cumulative_lengths(lengths: torch.Tensor) -> torch.Tensor:
    """[0, l0, l0 + l1, ...] in int32: flash-attn's `cu_seqlens` from per-sequence lengths."""
    zero = torch.zeros(1, dtype=torch.int32, device=lengths.device)
    return torch.cat([zero, lengths.cumsum(0, dtype=torch.int32)])


def flash_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence against its own keys, read from the blocks in place.

    q [B, heads, d]; k_cache, v_cache [num_blocks, kv_heads, block_size, d]; block_tables
    [B, max_blocks]; lengths [B] (keys 0..length-1, the newest already written). Returns
    [B, heads, d]. Tables and lengths in int32 go through untouched; int64 ones cost a conversion."""
    if q.shape[0] == 0:  # flash-attn refuses an empty batch
        return torch.empty_like(q)
    out = _flash_attn().flash_attn_with_kvcache(
        q.unsqueeze(1),  # [B, 1, heads, d]: one query position per sequence
        k_cache.transpose(1, 2),  # [num_blocks, block_size, kv_heads, d], a view
        v_cache.transpose(1, 2),
        cache_seqlens=as_int32(lengths),
        block_table=as_int32(block_tables),
        softmax_scale=float(scale),
        causal=True,  # one query is the newest position: it sees every key (flash-attn drops the mask itself)
    )
    return out.squeeze(1)


def flash_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_starts: torch.Tensor,
    key_lengths: torch.Tensor,
    max_query: int,
    max_key: int,
    scale: float,
    *,
    key_starts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every prefill chunk of a step, in one call.

    q [total_rows, heads, d]: the chunks' query rows one after another; query_starts [P + 1]:
    where each chunk's rows begin, then the total (flash-attn's cu_seqlens_q); key_lengths [P]:
    each chunk's end position, so its queries see keys 0..end-1, causally; block_tables
    [P, max_blocks], rows padded past a chunk's own blocks (they are never read). max_query and
    max_key: the longest chunk and the largest end, as the host knows them (no device sync).
    key_starts: `cumulative_lengths(key_lengths)` when the caller built it once for the step.
    Returns [total_rows, heads, d]."""
    if q.shape[0] == 0:
        return torch.empty_like(q)
    if key_starts is None:
        key_starts = cumulative_lengths(key_lengths)
    return _flash_attn().flash_attn_varlen_func(
        q,
        k_cache.transpose(1, 2),
        v_cache.transpose(1, 2),
        as_int32(query_starts),
        as_int32(key_starts),
        int(max_query),
        int(max_key),
        softmax_scale=float(scale),
        causal=True,  # aligned to the bottom right: query i of a chunk sees keys 0..end - n + i
        block_table=as_int32(block_tables),
    )


def flash_attn_unavailable_reason(
    block_size: int, dtype: torch.dtype, device: torch.device | str, head_dim: int | None = None
) -> str | None:
    """None when the paged flash-attn kernels can read this cache, else the reason, in one line."""
    try:
        installed = importlib.util.find_spec("flash_attn") is not None
    except (ImportError, ValueError):  # a broken or half-imported package
        installed = False
    if not installed:
        return "flash-attn is not installed (pip install flash-attn: it builds against this PyTorch and CUDA)"
    device = torch.device(device)
    if device.type != "cuda":
        return f"flash-attn runs on CUDA GPUs only; this cache is on {device}"
    if dtype not in DTYPES:
        return f"flash-attn takes float16 or bfloat16; this cache is {dtype}"
    if block_size % PAGE_BLOCK_MULTIPLE != 0:
        return (
            f"paged flash-attn needs blocks of a multiple of {PAGE_BLOCK_MULTIPLE} positions "
            f"(flash_api.cpp: page_block_size % 256 == 0); this cache's blocks hold {block_size}"
        )
    if head_dim is not None and (head_dim > MAX_HEAD_DIM or head_dim % HEAD_DIM_MULTIPLE != 0):
        return (
            f"flash-attn takes head sizes of at most {MAX_HEAD_DIM} and a multiple of {HEAD_DIM_MULTIPLE} "
            f"(others are padded, a copy of the whole cache per call); this model's is {head_dim}"
        )
    if not torch.cuda.is_available():
        return "CUDA is not available in this process"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return f"flash-attn 2 needs an Ampere or newer GPU (compute capability 8.0+); this one is {major}.{minor}"
    try:
        flash_attn = _flash_attn()
    except Exception as error:  # most often a wheel built for another PyTorch: undefined symbol
        return f"flash-attn is installed but does not import: {type(error).__name__}: {error}"
    varlen = getattr(flash_attn, "flash_attn_varlen_func", None)
    if not hasattr(flash_attn, "flash_attn_with_kvcache") or varlen is None:
        return "this flash-attn has no flash_attn_with_kvcache or flash_attn_varlen_func"
    if "block_table" not in inspect.signature(varlen).parameters:
        version = getattr(flash_attn, "__version__", "of unknown version")
        return f"flash-attn {version} predates block_table in flash_attn_varlen_func (2.5.7)"
    return None
