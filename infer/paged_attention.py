"""Attention over a KV cache kept in blocks, for one engine step: where each new token's keys and
values go (the slot mapping), and where each sequence's are (its block table).

The storage is week 02's `KVCache`, read as blocks: its buffers [num_blocks, kv_heads,
block_size, head_dim] hold `num_blocks` blocks of `block_size` positions. Position p of a
sequence lives in block `block_table[p // block_size]`, at offset `p % block_size`. The slot
store (weeks 05-07) is the case of one block of `max_model_len` positions per sequence; the paged
store (week 08) hands out blocks of 16 positions as a sequence grows.

`PagedKV.for_runs` builds every index tensor of a step once, on the host, and moves each to the
device once; each layer then costs one indexed write for all new tokens, one gather and one
attention call for all decodes together, and one gather and one attention call per prefill
chunk (a chunk's queries differ in length, so they keep a per-sequence path).
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from infer.kv_cache import KVCache


@dataclass(frozen=True)
class SeqRun:
    """The tokens of one sequence in a flat batch: rows [row, row + n) hold its positions [start, start + n)."""

    seq_id: int
    row: int
    start: int
    n: int

    @property
    def rows(self) -> slice:
        return slice(self.row, self.row + self.n)

    @property
    def end(self) -> int:
        return self.start + self.n


def plan_runs(positions: torch.Tensor, seq_ids: torch.Tensor | None) -> list[SeqRun]:
    """Group a flat batch into per-sequence runs, once per forward, on the host.

    Each sequence's tokens must be one contiguous run of consecutive positions (a prompt, a
    prefill chunk, or one decode token): that is what a serving step contains. Keep `positions`
    and `seq_ids` on the CPU and this costs no device synchronization."""
    pos = positions.tolist()
    ids = [0] * len(pos) if seq_ids is None else seq_ids.tolist()
    if len(ids) != len(pos):
        raise ValueError(f"seq_ids has {len(ids)} entries but positions has {len(pos)}: one per token")
    runs: list[SeqRun] = []
    for row, (seq, p) in enumerate(zip(ids, pos)):
        last = runs[-1] if runs else None
        if last is not None and last.seq_id == seq:
            if p != last.end:
                raise ValueError(
                    f"sequence {seq}: positions must be consecutive within a step, "
                    f"got {p} after {last.end - 1} (row {row})"
                )
            runs[-1] = SeqRun(seq, last.row, last.start, last.n + 1)
        else:
            if any(r.seq_id == seq for r in runs):
                raise ValueError(f"sequence {seq} appears in two separate runs of the batch; keep its tokens together")
            runs.append(SeqRun(seq, row, p, 1))
    return runs


@dataclass(frozen=True)
class PrefillRun:
    rows: slice  # this chunk's rows in the flat batch
    start: int  # the chunk's first position
    end: int  # one past its last
    block_table: torch.Tensor  # [blocks covering 0..end-1], on the device


@dataclass(frozen=True)
class PrefillBatch:
    """Every prefill chunk of a step, laid out for one varlen attention call: chunk i's queries
    are rows query_starts[i]..query_starts[i+1]-1 of `rows`, and it sees keys 0..key_lengths[i]-1
    through block_tables[i] (int32, as flash-attn takes them)."""

    num_chunks: int
    rows: torch.Tensor  # [T] the chunks' rows in the flat batch, chunk after chunk
    query_starts: torch.Tensor  # [P + 1] int32: cumulative query counts, from 0
    key_lengths: torch.Tensor  # [P] int32: each chunk's end position
    key_starts: torch.Tensor  # [P + 1] int32: cumulative key counts, from 0 (built once a step, not per layer)
    block_tables: torch.Tensor  # [P, widest] int32
    max_query: int
    max_key: int

    @classmethod
    def of(cls, runs: list[SeqRun], block_tables: list[list[int]], block_size: int, on_device) -> "PrefillBatch":
        chunks = [(run, table) for run, table in zip(runs, block_tables) if run.n > 1]
        widest = max((-(-run.end // block_size) for run, _ in chunks), default=0)
        starts, key_starts = [0], [0]
        for run, _ in chunks:
            starts.append(starts[-1] + run.n)
            key_starts.append(key_starts[-1] + run.end)
        tables = [table[:widest] + [0] * (widest - len(table[:widest])) for _, table in chunks]
        return cls(
            len(chunks),
            on_device([row for run, _ in chunks for row in range(run.row, run.row + run.n)]),
            on_device(starts).int(),
            on_device([run.end for run, _ in chunks]).int(),
            on_device(key_starts).int(),
            on_device(tables).reshape(len(chunks), widest).int(),
            max((run.n for run, _ in chunks), default=0),
            max((run.end for run, _ in chunks), default=0),
        )


class PagedKV:
    """One step's view of a block KV cache: what attention reads and writes, in every layer."""

    def __init__(
        self,
        cache: KVCache,
        block_ids: torch.Tensor,
        offsets: torch.Tensor,
        decode_rows: torch.Tensor,
        decode_tables: torch.Tensor,
        decode_lengths: torch.Tensor,
        prefills: list[PrefillRun],
        first_decode_block: int | None = None,
        longest_decode: int | None = None,
        decode_kernel=None,
        prefill_kernel=None,
        prefill_batch: "PrefillBatch | None" = None,
    ):
        """`longest_decode`: the longest decode's length, as the host knows it (for_runs passes it);
        when None it is read from `decode_lengths`, which waits for the device when they live on one.
        `decode_kernel`: a kernel that reads the blocks in place (infer.cpu_kernels,
        infer.paged_decode_triton, infer.flash_attn_paged), or None for the gather and PyTorch's
        attention. `prefill_kernel`: one that takes every prefill chunk of the step in one call,
        laid out as `prefill_batch` (infer.flash_attn_paged), or None for a call per chunk."""
        self.cache = cache
        self.block_ids, self.offsets = block_ids, offsets  # [N]: where each new token's K/V go
        self.decode_rows, self.decode_tables, self.decode_lengths = decode_rows, decode_tables, decode_lengths
        self.first_decode_block = first_decode_block  # set when the decodes' blocks are one compact range
        if longest_decode is None:
            longest_decode = int(decode_lengths.max()) if len(decode_lengths) else 0
        self.longest_decode = longest_decode
        self.prefills = prefills
        self.decode_kernel, self.prefill_kernel, self.prefill_batch = decode_kernel, prefill_kernel, prefill_batch

    @classmethod
    def for_runs(
        cls,
        cache: KVCache,
        runs: list[SeqRun],
        block_tables: list[list[int]],
        decode_kernel=None,
        prefill_kernel=None,
    ) -> "PagedKV":
        """`runs` in flat-batch order, each with its sequence's block table (same order)."""
        block_size, device = cache.max_len, cache.k[0].device if cache.k else "cpu"
        block_ids, offsets = [], []
        for run, table in zip(runs, block_tables, strict=True):
            if run.end > len(table) * block_size:
                raise ValueError(
                    f"sequence {run.seq_id} needs position {run.end - 1}, but its {len(table)} blocks of "
                    f"{block_size} hold positions 0..{len(table) * block_size - 1}: the KV store gave it too "
                    f"little room"
                )
            for position in range(run.start, run.end):
                block_ids.append(table[position // block_size])
                offsets.append(position % block_size)
        decodes = [(run, table) for run, table in zip(runs, block_tables) if run.n == 1]
        widest = max((-(-run.end // block_size) for run, _ in decodes), default=0)
        first_decode_block = None
        if widest == 1 and len({table[0] for _, table in decodes}) == len(decodes):
            blocks = sorted(table[0] for _, table in decodes)
            if blocks[-1] - blocks[0] + 1 == len(blocks):  # the slot store's usual case: read them in place
                decodes.sort(key=lambda decode: decode[1][0])
                first_decode_block = blocks[0]
        tables = [table[:widest] + [0] * (widest - len(table[:widest])) for _, table in decodes]  # 0: masked anyway

        def on_device(values) -> torch.Tensor:  # built on the host, moved once
            return torch.tensor(values, dtype=torch.long, device="cpu").to(device, non_blocking=True)

        prefills = [  # with a prefill kernel, the chunks go to it together (PrefillBatch) instead
            PrefillRun(run.rows, run.start, run.end, on_device(table[: -(-run.end // block_size)]))
            for run, table in zip(runs, block_tables)
            if run.n > 1 and prefill_kernel is None
        ]
        return cls(
            cache,
            on_device(block_ids),
            on_device(offsets),
            on_device([run.row for run, _ in decodes]),
            on_device(tables).reshape(len(decodes), widest),
            on_device([run.end for run, _ in decodes]),
            prefills,
            first_decode_block,
            longest_decode=max((run.end for run, _ in decodes), default=0),  # from the host: no device read
            decode_kernel=decode_kernel,
            prefill_kernel=prefill_kernel,
            prefill_batch=PrefillBatch.of(runs, block_tables, block_size, on_device) if prefill_kernel else None,
        )

    @classmethod
    def for_slots(cls, cache: KVCache, positions: torch.Tensor, seq_ids: torch.Tensor) -> "PagedKV":
        """A flat batch addressed by slots, as the slot store lays it out: slot s is block s."""
        runs = plan_runs(positions, seq_ids)
        return cls.for_runs(cache, runs, [[run.seq_id] for run in runs])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store the step's new k, v [N, kv_heads, d] and return each query's attention output
        [N, heads, d] over its own sequence's keys up to its own position."""
        keys, values = self.cache.k[layer], self.cache.v[layer]
        keys[self.block_ids, :, self.offsets] = k
        values[self.block_ids, :, self.offsets] = v
        out = torch.empty_like(q)
        if len(self.decode_rows):
            out[self.decode_rows] = self._decode_attention(layer, q[self.decode_rows])
        if self.prefill_batch is not None and self.prefill_batch.num_chunks:
            batch, scale = self.prefill_batch, q.shape[-1] ** -0.5
            out[batch.rows] = self.prefill_kernel(
                q[batch.rows], keys, values, batch.block_tables, batch.query_starts, batch.key_lengths,
                batch.max_query, batch.max_key, scale, key_starts=batch.key_starts,
            )  # fmt: skip
            return out
        for run in self.prefills:  # a chunk's queries differ in length: a gather and a call each
            k_run = gather_blocks(keys, run.block_table[None], run.end)[0]
            v_run = gather_blocks(values, run.block_table[None], run.end)[0]
            out[run.rows] = causal_attention(q[run.rows], k_run, v_run, run.start)
        return out

    def _decode_attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """B one-token queries [B, heads, d], each against its own sequence's keys, in one call.

        Every sequence's blocks are gathered into [B, kv_heads, longest, d] (or, when each holds one
        block and the blocks lie side by side, read in place); a sequence shorter
        than the longest is masked past its length, and a masked key gets weight exactly 0
        (exp(-inf)), so each row equals that sequence's attention over its own keys.

        With a `decode_kernel`, each sequence's keys are read where they lie instead: no gather, no
        mask, no key read for a position past the sequence's length."""
        if self.decode_kernel is not None:
            keys, values = self.cache.k[layer], self.cache.v[layer]
            scale = q.shape[-1] ** -0.5  # scaled_dot_product_attention's default
            with torch.profiler.record_function("in_place_decode_attention"):  # not an aten op: name it for profiles
                return self.decode_kernel(q, keys, values, self.decode_tables, self.decode_lengths, scale)
        if self.first_decode_block is None:
            keys = gather_blocks(self.cache.k[layer], self.decode_tables, self.longest_decode)
            values = gather_blocks(self.cache.v[layer], self.decode_tables, self.longest_decode)
        else:  # one block each, side by side: a view of the cache is the batch, no copy
            blocks = slice(self.first_decode_block, self.first_decode_block + len(self.decode_rows))
            keys = self.cache.k[layer][blocks, :, : self.longest_decode]
            values = self.cache.v[layer][blocks, :, : self.longest_decode]
        mask = torch.arange(self.longest_decode, device=q.device)[None, :] < self.decode_lengths[:, None]
        batch, kv_heads = keys.shape[:2]
        # query head h reads KV head h // group: [B, kv_heads, group, d] needs no copies of K and V
        queries = q.view(batch, kv_heads, q.shape[1] // kv_heads, q.shape[-1])
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask[:, None, None, :])
        return out.reshape(q.shape)


def gather_blocks(buffer: torch.Tensor, block_tables: torch.Tensor, length: int) -> torch.Tensor:
    """Positions 0..length-1 of each sequence, from `buffer` [num_blocks, kv_heads, block_size, d]
    through `block_tables` [B, blocks]: [B, kv_heads, length, d].

    Positions past `length` are cut before the gather, so one long block (the slot store's) is
    copied only as far as it is used."""
    used = buffer[:, :, : min(buffer.shape[2], length)]
    batch, num_blocks = block_tables.shape
    _, kv_heads, per_block, head_dim = used.shape
    # index_select copies whole rows; advanced indexing (used[block_tables]) is several times slower on a view
    blocks = used.index_select(0, block_tables.reshape(-1)).view(batch, num_blocks, kv_heads, per_block, head_dim)
    return blocks.transpose(1, 2).reshape(batch, kv_heads, num_blocks * per_block, head_dim)[:, :, :length]


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """q [n, heads, d] at positions start..start+n-1 against keys/values [kv_heads, start+n, d].

    Query i may see keys 0..start+i. One decode token sees everything (no mask); a prefill from
    position 0 is the usual square causal mask; a later chunk needs the shifted one.

    Without a mask, `enable_gqa` lets each query head read its KV head. With one, it would not: on
    CUDA only the flash kernel implements `enable_gqa`, and flash takes no mask, so PyTorch falls
    back to its slow math kernel (fp32 scores [heads, n, start+n]). So a shifted chunk stacks each KV
    head's group of query heads into one head of group*n queries, as the decodes do: equal head
    counts, no copy of K and V, and the memory-efficient kernel takes the mask."""
    n, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    if n == 1 or start == 0:
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys[None], values[None], is_causal=n > 1, enable_gqa=True
        )
        return out[0].transpose(0, 1)  # [n, heads, d]
    group = heads // kv_heads
    # query head h reads KV head h // group: row g*n + i of KV head j is query i of head j*group + g
    queries = q.transpose(0, 1).reshape(1, kv_heads, group * n, head_dim)
    mask = torch.ones(n, start + n, dtype=torch.bool, device=q.device).tril(diagonal=start).repeat(group, 1)
    out = F.scaled_dot_product_attention(queries, keys[None], values[None], attn_mask=mask)
    return out.reshape(heads, n, head_dim).transpose(0, 1)  # [n, heads, d]
