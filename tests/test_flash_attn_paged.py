"""The adapter to flash-attn's paged kernels (infer/flash_attn_paged.py), checked against a contract.

flash-attn needs a CUDA GPU, so on the CPU these tests install `FakeFlashAttn` in its place. The
stand-in is NOT flash-attn: it is a small PyTorch model of what flash-attn 2.8.3 documents and
checks for its paged calls (flash_attn/flash_attn_interface.py docstrings, csrc/flash_attn/
flash_api.cpp `mha_fwd_kvcache` and `mha_varlen_fwd`):

- the cache as [num_blocks, page_block_size, nheads_k, headdim], last dimension contiguous, read
  through its strides; page_block_size a multiple of 256;
- block_table, cache_seqlens, cu_seqlens_q and cu_seqlens_k in int32 (contiguous);
- fp16/bf16 only (the tests admit float32 explicitly, only to compare tightly);
- grouped-query attention: query head h reads KV head h // (nheads / nheads_k);
- causal masks aligned to the bottom right when seqlen_q != seqlen_k (flash-attn 2.1+): query i of
  n sees keys 0..i + seqlen_k - seqlen_q; a row with no key left gives zeros.

The adapter's answers are compared with a plain reference that knows nothing of flash-attn: each
sequence's keys gathered from the course's [num_blocks, kv_heads, block_size, head_dim] blocks by
its block table, and scaled_dot_product_attention with an explicit position mask, in float32.
The last test runs the real flash-attn, when a GPU and flash-attn are here.
"""

import importlib.machinery
import importlib.util
import inspect
import math
import random
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from infer import flash_attn_paged
from infer.flash_attn_paged import (
    flash_attn_unavailable_reason,
    flash_decode_attention,
    flash_prefill_attention,
)

TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # float32 both sides, sums in another order
BF16_TOLERANCE = {"rtol": 2e-2, "atol": 2e-2}
PAGE = 256  # the smallest block flash-attn 2 pages with


class FakeFlashAttn(types.ModuleType):
    """A stand-in for the `flash_attn` module: its two paged entry points, as documented (see the
    module docstring). Every call is recorded in `calls`, with the tensors as received."""

    def __init__(self, dtypes=(torch.float16, torch.bfloat16), top_left=False):
        super().__init__("flash_attn")
        self.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)  # so find_spec finds it
        self.__version__ = "2.8.3-contract"
        self.dtypes, self.top_left, self.calls = dtypes, top_left, []

    def causal_mask(self, n: int, length: int) -> torch.Tensor:
        """[n, length], True = keep: bottom-right aligned (top_left=True: the pre-2.1 rule, for contrast)."""
        i, j = torch.arange(n)[:, None], torch.arange(length)[None]
        return j <= i if self.top_left else j <= i + (length - n)

    def _check_paged(self, q, k_cache, v_cache, block_table, batch):
        assert q.dtype in self.dtypes, f"flash-attn takes fp16/bf16, got {q.dtype}"
        assert k_cache.dtype == v_cache.dtype == q.dtype, "query and cache dtypes must match"
        for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
            assert t.stride(-1) == 1, f"{name} must have contiguous last dimension"
        assert k_cache.dim() == 4 and k_cache.shape == v_cache.shape, "paged cache: [num_blocks, page, nheads_k, d]"
        num_blocks, page, kv_heads, head_dim = k_cache.shape
        assert page % 256 == 0, f"Paged KV cache block size must be divisible by 256 (got {page})"
        assert head_dim == q.shape[-1] and head_dim <= 256, "cache head_dim must be q's, at most 256"
        assert q.shape[-2] % kv_heads == 0, "Number of heads in key/value must divide number of heads in query"
        assert block_table.dtype == torch.int32, f"block_table must have dtype torch.int32, got {block_table.dtype}"
        assert block_table.stride(-1) == 1, "block_table must have contiguous last dimension"
        assert block_table.dim() == 2 and block_table.shape[0] == batch, "block_table: [batch, max_blocks]"
        return num_blocks, page

    @staticmethod
    def _check_int32(name, t, shape):
        assert isinstance(t, torch.Tensor) and t.dtype == torch.int32, f"{name} must have dtype int32"
        assert t.is_contiguous() and tuple(t.shape) == shape, f"{name}: contiguous, shape {shape}"

    @staticmethod
    def _keys(cache, table_row, length, num_blocks, page):
        """Positions 0..length-1 of one sequence, [length, nheads_k, d], found through its table."""
        used = table_row[: -(-length // page)].long()
        assert len(used) * page >= length, "block_table too short for the sequence length"
        assert bool(((used >= 0) & (used < num_blocks)).all()), "block index out of range"
        return cache[used].reshape(-1, *cache.shape[2:])[:length]

    def _attend(self, q, keys, values, scale, causal):
        """q [n, nheads, d] against keys/values [L, nheads_k, d], in float32; returns [n, nheads, d]."""
        group = q.shape[1] // keys.shape[1]
        keys, values = (t.float().repeat_interleave(group, dim=1) for t in (keys, values))  # head h -> h // group
        scores = torch.einsum("nhd,lhd->hnl", q.float(), keys) * scale
        if causal:
            scores = scores.masked_fill(~self.causal_mask(q.shape[0], keys.shape[0]), -math.inf)
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no key: zeros
        return torch.einsum("hnl,lhd->nhd", weights, values)

    def flash_attn_with_kvcache(
        self,
        q,
        k_cache,
        v_cache,
        k=None,
        v=None,
        rotary_cos=None,
        rotary_sin=None,
        cache_seqlens=None,
        cache_batch_idx=None,
        cache_leftpad=None,
        block_table=None,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        rotary_interleaved=True,
        alibi_slopes=None,
        num_splits=0,
        return_softmax_lse=False,
    ):
        self.calls.append(
            {"name": "kvcache", "k_cache": k_cache, "cache_seqlens": cache_seqlens, "block_table": block_table}
        )
        assert k is None and v is None and rotary_cos is None, "stand-in: reading the cache only, no append"
        assert block_table is not None and cache_batch_idx is None and cache_leftpad is None, "stand-in: paged only"
        assert q.dim() == 4, "q: [batch, seqlen_q, nheads, d]"
        batch, seqlen_q = q.shape[:2]
        num_blocks, page = self._check_paged(q, k_cache, v_cache, block_table, batch)
        self._check_int32("cache_seqlens", cache_seqlens, (batch,))
        assert int(cache_seqlens.max()) <= block_table.shape[1] * page, "max(seqlens_k) exceeds the block_table"
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.empty(q.shape, dtype=torch.float32)
        for b in range(batch):
            length = int(cache_seqlens[b])
            keys = self._keys(k_cache, block_table[b], length, num_blocks, page)
            values = self._keys(v_cache, block_table[b], length, num_blocks, page)
            out[b] = self._attend(q[b], keys, values, scale, causal and seqlen_q > 1)
        return out.to(q.dtype)

    def flash_attn_varlen_func(
        self,
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        dropout_p=0.0,
        softmax_scale=None,
        causal=False,
        window_size=(-1, -1),
        softcap=0.0,
        alibi_slopes=None,
        deterministic=False,
        return_attn_probs=False,
        block_table=None,
    ):
        self.calls.append({"name": "varlen", "k": k, "cu_seqlens_k": cu_seqlens_k, "block_table": block_table})
        assert block_table is not None, "stand-in: the paged form only"
        assert dropout_p == 0.0 and window_size == (-1, -1), "stand-in: no dropout, no window"
        assert q.dim() == 3, "q: [total_q, nheads, d]"
        batch = cu_seqlens_q.numel() - 1
        num_blocks, page = self._check_paged(q, k, v, block_table, batch)
        self._check_int32("cu_seqlens_q", cu_seqlens_q, (batch + 1,))
        self._check_int32("cu_seqlens_k", cu_seqlens_k, (batch + 1,))
        assert int(cu_seqlens_q[0]) == 0 and int(cu_seqlens_q[-1]) == q.shape[0], "cu_seqlens_q must cover q"
        assert isinstance(max_seqlen_q, int) and isinstance(max_seqlen_k, int), "max_seqlen_*: Python ints"
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        out = torch.zeros(q.shape, dtype=torch.float32)
        for b in range(batch):
            rows = slice(int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]))
            length = int(cu_seqlens_k[b + 1] - cu_seqlens_k[b])
            assert rows.stop - rows.start <= max_seqlen_q, "a sequence longer than max_seqlen_q is cut short"
            assert length <= max_seqlen_k, "a sequence longer than max_seqlen_k"
            keys = self._keys(k, block_table[b], length, num_blocks, page)
            values = self._keys(v, block_table[b], length, num_blocks, page)
            out[rows] = self._attend(q[rows], keys, values, scale, causal and max_seqlen_q > 1)
        return out.to(q.dtype)


@pytest.fixture
def fake(monkeypatch) -> FakeFlashAttn:
    """The stand-in, installed as `flash_attn`, admitting float32 for tight comparisons."""
    module = FakeFlashAttn(dtypes=(torch.float16, torch.bfloat16, torch.float32))
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    return module


# --- the plain reference, in the course's layout ---------------------------------------------


def course_cache(num_blocks, kv_heads, head_dim, dtype=torch.float32, seed=0, device="cpu"):
    """k, v in the course's layout [num_blocks, kv_heads, block_size, head_dim], random."""
    generator = torch.Generator().manual_seed(seed)
    shape = (num_blocks, kv_heads, PAGE, head_dim)
    return [torch.randn(shape, generator=generator).to(device=device, dtype=dtype) for _ in range(2)]


def scattered_tables(lengths, num_blocks, width, seed):
    """One row per sequence: its blocks drawn from a shuffled free list, padded with 0 to `width`."""
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)
    tables = []
    for length in lengths:
        own = [free.pop() for _ in range(-(-length // PAGE))]
        tables.append(own + [0] * (width - len(own)))
    return torch.tensor(tables, dtype=torch.long)


def gathered(cache, table_row, end):
    """[kv_heads, end, d]: positions 0..end-1, position p from block table_row[p // PAGE], offset p % PAGE."""
    positions = torch.arange(end)
    blocks = table_row.cpu()[positions // PAGE].to(cache.device)
    return cache[blocks, :, (positions % PAGE).to(cache.device)].transpose(0, 1).float()


def reference(q, k_cache, v_cache, tables, starts, ends, scale):
    """Rows of q, run by run: run b has queries at positions starts[b]..ends[b]-1 and sees key j
    from query position p when j <= p. Returns [rows, heads, d] in float32."""
    out, row = [], 0
    for b, (start, end) in enumerate(zip(starts, ends)):
        n = end - start
        queries = q[row : row + n].float().transpose(0, 1)  # [heads, n, d]
        keep = torch.arange(end, device=q.device)[None] <= torch.arange(start, end, device=q.device)[:, None]
        attended = F.scaled_dot_product_attention(
            queries,
            gathered(k_cache, tables[b], end),
            gathered(v_cache, tables[b], end),
            attn_mask=keep,
            scale=scale,
            enable_gqa=True,
        )
        out.append(attended.transpose(0, 1))
        row += n
    return torch.cat(out)


def decode_case(heads, kv_heads, head_dim=16, dtype=torch.float32, seed=0, device="cpu"):
    lengths = [1, 255, 256, 257, 700, 40]  # one token, and either side of a block boundary
    k_cache, v_cache = course_cache(14, kv_heads, head_dim, dtype, seed, device)
    tables = scattered_tables(lengths, 14, width=3, seed=seed).to(device)
    q = torch.randn(len(lengths), heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    return q.to(device=device, dtype=dtype), k_cache, v_cache, tables, torch.tensor(lengths, device=device)


# chunks of one step: (start, n). From 0, and later chunks of earlier-prefilled prompts, crossing blocks.
CHUNKS = [(0, 5), (256, 3), (0, 300), (500, 20), (100, 1), (700, 12)]


def prefill_case(heads, kv_heads, head_dim=16, dtype=torch.float32, seed=0, device="cpu"):
    ends = [start + n for start, n in CHUNKS]
    k_cache, v_cache = course_cache(20, kv_heads, head_dim, dtype, seed, device)
    tables = scattered_tables(ends, 20, width=3, seed=seed).to(device)
    total = sum(n for _, n in CHUNKS)
    q = torch.randn(total, heads, head_dim, generator=torch.Generator().manual_seed(seed + 1))
    query_starts = torch.tensor([0] + [sum(n for _, n in CHUNKS[: i + 1]) for i in range(len(CHUNKS))])
    return (
        q.to(device=device, dtype=dtype),
        k_cache,
        v_cache,
        tables,
        query_starts.to(device),
        torch.tensor(ends, device=device),
    )


def run_prefill(q, k_cache, v_cache, tables, query_starts, key_lengths, scale):
    return flash_prefill_attention(
        q,
        k_cache,
        v_cache,
        tables,
        query_starts,
        key_lengths,
        max_query=max(n for _, n in CHUNKS),
        max_key=max(start + n for start, n in CHUNKS),
        scale=scale,
    )


# --- the stand-in itself keeps the contract ----------------------------------------------------


def test_the_stand_in_masks_as_the_flash_attn_readme_draws_it():
    """README, "2.1: Change behavior of causal flag": seqlen_q=2, seqlen_k=5 and seqlen_q=5, seqlen_k=2."""
    mask = FakeFlashAttn().causal_mask
    assert mask(2, 5).int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert mask(5, 2).int().tolist() == [[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]]


def test_the_stand_in_refuses_what_flash_attn_refuses():
    """The course's own layout (a 16-or-2-row 'page'), int64 tables, float32, a non-contiguous last dim."""
    fake = FakeFlashAttn()
    q, k_cache, v_cache, tables, lengths = decode_case(4, 2, dtype=torch.bfloat16)
    q4, good_k, good_v = q[:, None], k_cache.transpose(1, 2), v_cache.transpose(1, 2)
    lengths32, tables32 = lengths.int(), tables.int()
    with pytest.raises(AssertionError, match="divisible by 256"):  # course layout: dim 1 is kv_heads
        fake.flash_attn_with_kvcache(q4, k_cache, v_cache, cache_seqlens=lengths32, block_table=tables32)
    with pytest.raises(AssertionError, match="block_table must have dtype torch.int32"):
        fake.flash_attn_with_kvcache(q4, good_k, good_v, cache_seqlens=lengths32, block_table=tables)
    with pytest.raises(AssertionError, match="cache_seqlens must have dtype int32"):
        fake.flash_attn_with_kvcache(q4, good_k, good_v, cache_seqlens=lengths, block_table=tables32)
    with pytest.raises(AssertionError, match="fp16/bf16"):
        fake.flash_attn_with_kvcache(
            q4.float(), good_k.float(), good_v.float(), cache_seqlens=lengths32, block_table=tables32
        )
    with pytest.raises(AssertionError, match="contiguous last dimension"):
        strided = good_k.transpose(-1, -2).contiguous().transpose(-1, -2)  # the right shape, head_dim strided
        fake.flash_attn_with_kvcache(q4, strided, good_v, cache_seqlens=lengths32, block_table=tables32)


# --- the adapter against the reference, through the stand-in ------------------------------------


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
def test_decode_matches_the_reference_on_scattered_blocks(fake, heads, kv_heads):
    q, k_cache, v_cache, tables, lengths = decode_case(heads, kv_heads, seed=heads)
    scale = 0.3
    out = flash_decode_attention(q, k_cache, v_cache, tables, lengths, scale)
    assert out.shape == q.shape
    expected = reference(q, k_cache, v_cache, tables, [n - 1 for n in lengths.tolist()], lengths.tolist(), scale)
    torch.testing.assert_close(
        out,
        expected,
        **TOLERANCE,
        msg=lambda m: f"decode through flash-attn's contract disagrees with gather + attention: {m}",
    )


def test_decode_reads_the_cache_in_place_and_passes_int32_tables_through(fake):
    """The cache goes as a view (same storage, flash-attn's shape), and int32 tables as they are:
    converting once per step then costs nothing in each layer."""
    q, k_cache, v_cache, tables, lengths = decode_case(8, 2)
    tables32, lengths32 = tables.int(), lengths.int()
    flash_decode_attention(q, k_cache, v_cache, tables32, lengths32, 0.25)
    call = fake.calls[-1]
    assert call["k_cache"].data_ptr() == k_cache.data_ptr(), "the cache was copied, not viewed"
    assert tuple(call["k_cache"].shape) == (k_cache.shape[0], PAGE, 2, k_cache.shape[-1])
    assert call["block_table"] is tables32 and call["cache_seqlens"] is lengths32


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (6, 1)])
def test_prefill_runs_every_chunk_in_one_call(fake, heads, kv_heads):
    """Chunks from position 0 and from later positions, of different lengths, in one varlen call:
    query i of a chunk starting at `start` sees keys 0..start+i, and no later one."""
    q, k_cache, v_cache, tables, query_starts, ends = prefill_case(heads, kv_heads, seed=heads)
    scale = 0.25
    out = run_prefill(q, k_cache, v_cache, tables, query_starts, ends, scale)
    assert [call["name"] for call in fake.calls] == ["varlen"]
    assert fake.calls[0]["k"].data_ptr() == k_cache.data_ptr(), "the cache was copied, not viewed"
    assert fake.calls[0]["cu_seqlens_k"].tolist() == [0] + torch.cumsum(ends, 0).tolist()
    expected = reference(q, k_cache, v_cache, tables, [s for s, _ in CHUNKS], ends.tolist(), scale)
    torch.testing.assert_close(
        out,
        expected,
        **TOLERANCE,
        msg=lambda m: f"prefill through flash-attn's contract disagrees with gather + causal attention: {m}",
    )


def test_top_left_alignment_would_be_caught(monkeypatch):
    """Under the pre-2.1 rule (mask aligned to the top left) the same call gives other answers for
    chunks that start past 0: the comparison above tells the two rules apart."""
    monkeypatch.setitem(sys.modules, "flash_attn", FakeFlashAttn(dtypes=(torch.float32,), top_left=True))
    q, k_cache, v_cache, tables, query_starts, ends = prefill_case(4, 2)
    out = run_prefill(q, k_cache, v_cache, tables, query_starts, ends, 0.25)
    expected = reference(q, k_cache, v_cache, tables, [s for s, _ in CHUNKS], ends.tolist(), 0.25)
    first = CHUNKS[0][1]  # the first chunk starts at 0: both rules agree there
    torch.testing.assert_close(out[:first], expected[:first], **TOLERANCE)
    assert not torch.allclose(out[first:], expected[first:], **TOLERANCE)


def test_bf16_through_the_strict_stand_in(monkeypatch):
    """In the dtype flash-attn takes, with the stand-in refusing float32."""
    monkeypatch.setitem(sys.modules, "flash_attn", FakeFlashAttn())
    q, k_cache, v_cache, tables, lengths = decode_case(8, 2, dtype=torch.bfloat16)
    out = flash_decode_attention(q, k_cache, v_cache, tables, lengths, 0.25)
    expected = reference(q, k_cache, v_cache, tables, [n - 1 for n in lengths.tolist()], lengths.tolist(), 0.25)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, **BF16_TOLERANCE)
    q, k_cache, v_cache, tables, query_starts, ends = prefill_case(8, 2, dtype=torch.bfloat16)
    out = run_prefill(q, k_cache, v_cache, tables, query_starts, ends, 0.25)
    expected = reference(q, k_cache, v_cache, tables, [s for s, _ in CHUNKS], ends.tolist(), 0.25)
    torch.testing.assert_close(out.float(), expected, **BF16_TOLERANCE)


def test_an_empty_batch_calls_nothing(fake):
    q, k_cache, v_cache, tables, lengths = decode_case(8, 2)
    assert flash_decode_attention(q[:0], k_cache, v_cache, tables[:0], lengths[:0], 0.25).shape == (0, 8, 16)
    empty = flash_prefill_attention(
        q[:0], k_cache, v_cache, tables[:0], torch.zeros(1, dtype=torch.long), lengths[:0], 0, 0, 0.25
    )
    assert empty.shape == (0, 8, 16) and fake.calls == []


# --- flash_attn_unavailable_reason --------------------------------------------------------------


def test_reason_without_flash_attn(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flash_attn" else find_spec(name, *a)
    )
    assert "not installed" in flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda")


@pytest.mark.parametrize(
    "block_size,dtype,device,head_dim,words",
    [
        (PAGE, torch.bfloat16, "cpu", None, ["CUDA", "cpu"]),
        (PAGE, torch.float32, "cuda", None, ["float16 or bfloat16", "float32"]),
        (16, torch.bfloat16, "cuda", None, ["multiple of 256", "16"]),
        (PAGE, torch.float16, "cuda", 12, ["multiple of 8", "12"]),
        (PAGE, torch.float16, "cuda", 512, ["at most 256", "512"]),
    ],
)
def test_reasons_about_this_cache(fake, block_size, dtype, device, head_dim, words):
    reason = flash_attn_unavailable_reason(block_size, dtype, device, head_dim=head_dim)
    assert reason is not None and "\n" not in reason
    assert all(word in reason for word in words), reason


def test_reasons_about_this_machine(fake, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "CUDA is not available" in flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda", head_dim=64)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "Ampere" in flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda", head_dim=64)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda", head_dim=64) is None
    assert flash_attn_unavailable_reason(2 * PAGE, torch.float16, "cuda:0") is None

    def broken():
        raise ImportError("flash_attn_2_cuda.so: undefined symbol")

    monkeypatch.setattr(flash_attn_paged, "_flash_attn", broken)
    assert "does not import" in flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda")


def test_reason_for_a_flash_attn_without_paged_varlen(fake, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))

    def varlen_2_5_6(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale=None, causal=False):
        raise AssertionError("not called")

    monkeypatch.setattr(fake, "flash_attn_varlen_func", varlen_2_5_6)
    assert "block_table" not in inspect.signature(varlen_2_5_6).parameters
    assert "predates block_table" in flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda")


def test_importing_the_adapter_needs_no_flash_attn():
    assert "flash_attn" not in vars(flash_attn_paged)


# --- the real kernels, when they are here ---------------------------------------------------------


def _real_flash_attn_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return flash_attn_unavailable_reason(PAGE, torch.bfloat16, "cuda", head_dim=64)


@pytest.mark.skipif(_real_flash_attn_reason() is not None, reason=f"real flash-attn: {_real_flash_attn_reason()}")
def test_real_flash_attn_matches_the_reference_in_bf16():
    for heads, kv_heads in [(8, 2), (4, 4)]:
        q, k_cache, v_cache, tables, lengths = decode_case(heads, kv_heads, 64, torch.bfloat16, device="cuda")
        out = flash_decode_attention(q, k_cache, v_cache, tables.int(), lengths.int(), 0.125)
        expected = reference(q, k_cache, v_cache, tables, [n - 1 for n in lengths.tolist()], lengths.tolist(), 0.125)
        torch.testing.assert_close(out.float(), expected, **BF16_TOLERANCE)
        q, k_cache, v_cache, tables, query_starts, ends = prefill_case(
            heads, kv_heads, 64, torch.bfloat16, device="cuda"
        )
        out = run_prefill(q, k_cache, v_cache, tables, query_starts, ends, 0.125)
        expected = reference(q, k_cache, v_cache, tables, [s for s, _ in CHUNKS], ends.tolist(), 0.125)
        torch.testing.assert_close(out.float(), expected, **BF16_TOLERANCE)
