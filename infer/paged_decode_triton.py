"""Decode attention that reads a block (paged) KV cache in place, as one Triton kernel (week 09).

Each sequence in a decode step brings one new query token and attends to its own keys, which lie
in blocks scattered across the cache: position p of sequence b is in block `block_tables[b, p //
block_size]`, at offset `p % block_size`. The eager path (`PagedKV._decode_attention` without a
kernel) first copies every sequence's blocks into one [batch, kv_heads, longest, head_dim] tensor
and calls scaled_dot_product_attention with a mask for the shorter sequences. This kernel does no
copy and needs no mask: each program reads only its own sequence's blocks, only up to its length,
straight from the cache, so each key and value crosses HBM once.

One program per (sequence, KV head). It loads the query heads that share that KV head (grouped-
query attention: query head h reads KV head h // group) as one small [group, head_dim] tile, then
streams the sequence's keys and values BLOCK_N positions at a time, looking up each position's
block in the table, and keeps week 04's online softmax in registers: the running max, the running
sum of exponentials and the unnormalised output. Every K/V tile is used by the whole group. A tile
is BLOCK_N positions rather than one block, so any block size works: 16-key blocks (several to a
tile) as well as the slot store's one block of max_model_len keys (many tiles to a block).

It is the GPU counterpart of the compiled CPU kernel in `infer/csrc/paged_decode_attention.cpp`,
with the same arguments and result, and it can be captured in a CUDA graph: the grid depends only
on the batch size and the KV head count, and the lengths and block tables are read on the device,
so a replay may change them in place.

What the caller guarantees, since checking would mean reading tensor values on the host:
every length is at least 1 (a sequence of length 0 has no keys and would come out NaN, 0 / 0),
and at most `max_blocks * block_size` (the kernel does not read a table past its row's length).

Needs CUDA and the `triton` package, as week 04's kernel (`infer.attention_triton`) does;
`TRITON_INTERPRET=1` runs it in Triton's CPU interpreter instead (slowly)."""

import torch

from infer.attention_triton import available as dense_kernel_available
from infer.attention_triton import launch_config
from infer.availability import Availability

try:
    import triton
    import triton.language as tl
except ImportError:  # no triton: everything below stays undefined, and available() explains
    triton = None

TL_DOT_MIN_ROWS = 16  # tl.dot needs at least 16 rows: a group of fewer query heads is padded


def available(device: str, dtype: torch.dtype, head_dim: int) -> Availability:
    """The same needs as week 04's kernel: triton, a CUDA GPU (or the interpreter), fp16, bf16 or
    fp32, and a head_dim that tl.arange and tl.dot take (a power of two, 16 to 128)."""
    return dense_kernel_available(device, dtype, head_dim)


if triton is not None:
    from infer.attention_triton import online_softmax_step  # defined only where triton is

    @triton.jit
    def _paged_decode_attention(
        Q,  # [batch, heads, HEAD_DIM], contiguous
        K_cache,  # [num_blocks, kv_heads, block_size, HEAD_DIM], contiguous (V_cache alike)
        V_cache,
        O,  # noqa: E741 - like Q: [batch, heads, HEAD_DIM]
        block_tables,  # [batch, max_blocks] block ids
        lengths,  # [batch]
        scale,
        kv_heads,
        block_size,
        max_blocks,
        GROUP: tl.constexpr,  # query heads per KV head
        GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two >= 16, for tl.arange and tl.dot
        HEAD_DIM: tl.constexpr,
        BLOCK_N: tl.constexpr,  # key positions per K/V tile
        EXACT_FP32: tl.constexpr,
    ):
        seq = tl.program_id(0).to(tl.int64)  # int64 offsets: a large cache has more than 2**31 elements
        kv_head = tl.program_id(1).to(tl.int64)
        length = tl.load(lengths + seq)  # read here, not on the host: a CUDA graph replays with new lengths
        table = block_tables + seq * max_blocks

        # The group's query heads are consecutive: heads kv_head*GROUP .. kv_head*GROUP + GROUP-1.
        group_rows = tl.arange(0, GROUP_PAD)
        dims = tl.arange(0, HEAD_DIM)
        query_heads = (seq * kv_heads + kv_head) * GROUP + group_rows  # rows of Q seen as [batch * heads, HEAD_DIM]
        in_group = group_rows[:, None] < GROUP
        q = tl.load(Q + query_heads[:, None] * HEAD_DIM + dims[None, :], mask=in_group, other=0.0)

        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)  # running max
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)  # running sum of exp(s - m_i)
        acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)  # running sum of exp(s - m_i) * v

        for start in range(0, length, BLOCK_N):  # stops at the length: no tile past it is read
            positions = start + tl.arange(0, BLOCK_N)
            valid = positions < length
            # Where each position lies: its block from the table, its offset within the block.
            blocks = tl.load(table + positions // block_size, mask=valid, other=0).to(tl.int64)
            cache_rows = (blocks * kv_heads + kv_head) * block_size + positions % block_size
            kv_offsets = cache_rows[:, None] * HEAD_DIM + dims[None, :]
            # Masked loads: a position past the length may hold anything (NaN too), and 0 * NaN is NaN.
            k = tl.load(K_cache + kv_offsets, mask=valid[:, None], other=0.0)
            v = tl.load(V_cache + kv_offsets, mask=valid[:, None], other=0.0)
            if EXACT_FP32:  # without it, fp32 dots use TF32 (10-bit mantissa)
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            s = tl.where(valid[None, :], s, float("-inf"))  # a zero key would still get weight exp(0 - m)
            # week 04's online softmax; the first tile holds position 0 (length >= 1), so the max is finite
            m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, EXACT_FP32)

        out = acc / l_i[:, None]
        tl.store(O + query_heads[:, None] * HEAD_DIM + dims[None, :], out.to(O.dtype.element_ty), mask=in_group)


def triton_paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    lengths: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence, q [batch, heads, head_dim], against its own keys in k_cache and
    v_cache [num_blocks, kv_heads, block_size, head_dim] through block_tables [batch, max_blocks]
    up to lengths [batch]: [batch, heads, head_dim] in q's dtype. Checks shapes only, never values,
    so it can run inside a CUDA graph."""
    batch, heads, head_dim = q.shape
    _, kv_heads, block_size, cache_head_dim = k_cache.shape
    verdict = available(q.device.type, q.dtype, head_dim)
    if not verdict:
        raise RuntimeError(f"triton_paged_decode_attention cannot run: {verdict.reason}")
    if heads % kv_heads or cache_head_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)}, {tuple(v_cache.shape)}")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q is {q.dtype} but the caches are {k_cache.dtype}, {v_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the caches must be contiguous (a copy of the whole cache is what this kernel avoids)")
    group = heads // kv_heads
    q, block_tables, lengths = q.contiguous(), block_tables.contiguous(), lengths.contiguous()  # no copy if already
    out = torch.empty_like(q)
    config = launch_config(q.dtype, head_dim)  # week 04's K/V tile size and pipelining, sized for shared memory
    _paged_decode_attention[(batch, kv_heads)](
        q,
        k_cache,
        v_cache,
        out,
        block_tables,
        lengths,
        scale,
        kv_heads,
        block_size,
        block_tables.shape[1],
        GROUP=group,
        GROUP_PAD=max(TL_DOT_MIN_ROWS, triton.next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_N=config.block_n,
        EXACT_FP32=q.dtype == torch.float32,
        num_stages=config.num_stages,
    )
    return out
