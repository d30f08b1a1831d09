"""The tiled online-softmax attention (`infer.attention.tiled_attention`) as one Triton kernel.

Same algorithm, now really on chip: one program instance owns BLOCK_M query rows of one
(batch, head); it loads its Q tile once, then streams K/V tiles of BLOCK_N keys from HBM,
keeping the running max `m_i`, running sum `l_i` and the unnormalized output `acc` in registers.
The [N, N] score matrix never exists anywhere; HBM sees Q, K, V read and O written.

Needs CUDA and the `triton` package (it ships with PyTorch's CUDA wheels). Without them,
`available()` says why and nothing here runs. `TRITON_INTERPRET=1` runs the kernel in Triton's
CPU interpreter (slowly), which is how it can be checked without a GPU."""

import importlib.util
import math
import os
from dataclasses import dataclass

import torch

from infer.availability import YES, Availability

try:
    import triton
    import triton.language as tl
except ImportError:  # no triton: everything below stays undefined, and available() explains
    triton = None

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)  # tl.arange needs a power of two; tl.dot needs >= 16
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Shared memory per program for the Q tile and the pipelined K and V tiles. A GPU allows about
# 99 KiB per block (L4), 163 KiB (A100) or 227 KiB (H100); 80 KiB fits all three with room for
# Triton's own scratch. Past the limit, the launch fails with OutOfResources.
SHARED_MEMORY_BUDGET = 80 * 1024


@dataclass(frozen=True)
class LaunchConfig:
    block_m: int  # query rows per program
    block_n: int  # keys per K/V tile
    num_stages: int  # K/V tiles in flight at once (Triton's software pipelining)

    def tile_bytes(self, dtype: torch.dtype, head_dim: int) -> int:
        """Shared memory of the Q tile and `num_stages` K and V tiles."""
        return dtype.itemsize * head_dim * (self.block_m + 2 * self.block_n * self.num_stages)


def launch_config(dtype: torch.dtype, head_dim: int) -> LaunchConfig:
    """The deepest pipelining (3, 2 or 1 stages) whose tiles fit SHARED_MEMORY_BUDGET. float32 tiles
    are twice as wide, so they take half the keys: at head_dim 128, Triton's default 3 stages of
    64-key float32 tiles would need 224 KiB, more than an A100 or L4 has per block."""
    block_n = 32 if dtype == torch.float32 else 64
    for num_stages in (3, 2, 1):
        config = LaunchConfig(block_m=64, block_n=block_n, num_stages=num_stages)
        if config.tile_bytes(dtype, head_dim) <= SHARED_MEMORY_BUDGET:
            return config
    raise ValueError(f"no launch config fits {SHARED_MEMORY_BUDGET} bytes for {dtype} at head_dim {head_dim}")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: str, dtype: torch.dtype, head_dim: int) -> Availability:
    if triton is None:
        reason = "not installed" if importlib.util.find_spec("triton") is None else "failed to import"
        return Availability(False, f"the triton package is {reason} (it comes with PyTorch's CUDA builds)")
    if device != "cuda" and not interpreting():
        return Availability(
            False,
            f"Triton kernels need a CUDA GPU (device here: {device}; "
            "TRITON_INTERPRET=1 would run it in the slow CPU interpreter)",
        )
    if dtype not in SUPPORTED_DTYPES:
        return Availability(False, f"this kernel supports fp16, bf16 and fp32, not {dtype}")
    if head_dim not in SUPPORTED_HEAD_DIMS:
        return Availability(False, f"this kernel supports head_dim in {SUPPORTED_HEAD_DIMS}, not {head_dim}")
    return YES


if triton is not None:

    @triton.jit
    def online_softmax_step(s, v, m_i, l_i, acc, EXACT_FP32: tl.constexpr):
        """Fold one tile of scores s [rows, keys] and its values v [keys, HEAD_DIM] into the running
        max m_i, running sum l_i and unnormalized output acc; masked scores must be -inf, and each
        row must have seen one finite score, so that the new max is finite."""
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)  # rescales what was accumulated under the old max
        if EXACT_FP32:  # without it, fp32 dots use TF32 (10-bit mantissa)
            pv = tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        return m_new, l_i * alpha + tl.sum(p, 1), acc * alpha[:, None] + pv

    @triton.jit
    def _attention_forward(
        Q,
        K,
        V,
        O,  # noqa: E741 - Q, K, V, O: the names of the attention paper's matrices
        seq_len,
        scale,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        CAUSAL: tl.constexpr,
        EXACT_FP32: tl.constexpr,
    ):
        block = tl.program_id(0)  # which block of query rows
        head = tl.program_id(1)  # which (batch, head): tensors are contiguous [batch * heads, seq_len, HEAD_DIM]
        base = head.to(tl.int64) * seq_len * HEAD_DIM
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        dims = tl.arange(0, HEAD_DIM)
        row_ok = rows[:, None] < seq_len

        q = tl.load(Q + base + rows[:, None] * HEAD_DIM + dims[None, :], mask=row_ok, other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(s - m_i)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)  # running sum of exp(s - m_i) * v

        if CAUSAL:
            keys_end = tl.minimum((block + 1) * BLOCK_M, seq_len)  # key blocks past the diagonal are skipped
        else:
            keys_end = seq_len
        for start in range(0, keys_end, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            col_ok = cols[:, None] < seq_len
            k = tl.load(K + base + cols[:, None] * HEAD_DIM + dims[None, :], mask=col_ok, other=0.0)
            v = tl.load(V + base + cols[:, None] * HEAD_DIM + dims[None, :], mask=col_ok, other=0.0)
            if EXACT_FP32:  # without it, fp32 dots use TF32 (10-bit mantissa) and miss a 1e-5 tolerance
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            else:
                s = tl.dot(q, tl.trans(k)) * scale
            visible = cols[None, :] < seq_len
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None])
            s = tl.where(visible, s, float("-inf"))
            # every row has seen key 0 after the first tile, so its max stays finite
            m_i, l_i, acc = online_softmax_step(s, v, m_i, l_i, acc, EXACT_FP32)

        out = acc / l_i[:, None]
        tl.store(O + base + rows[:, None] * HEAD_DIM + dims[None, :], out.to(O.dtype.element_ty), mask=row_ok)


def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Attention of [batch, heads, seq_len, head_dim] tensors with the kernel above."""
    verdict = available(q.device.type, q.dtype, q.shape[-1])
    if not verdict:
        raise RuntimeError(f"triton_attention cannot run: {verdict.reason}")
    batch, heads, seq_len, head_dim = q.shape
    config = launch_config(q.dtype, head_dim)
    q, k, v = (t.contiguous() for t in (q, k, v))
    out = torch.empty_like(q)
    grid = (triton.cdiv(seq_len, config.block_m), batch * heads)
    _attention_forward[grid](
        q,
        k,
        v,
        out,
        seq_len,
        1.0 / math.sqrt(head_dim),
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        HEAD_DIM=head_dim,
        CAUSAL=causal,
        EXACT_FP32=q.dtype == torch.float32,
        num_stages=config.num_stages,
    )
    return out
