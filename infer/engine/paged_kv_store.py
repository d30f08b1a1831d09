"""A paged KV store (week 08): the cache cut into small fixed-size blocks, handed out as sequences
grow, shared between sequences that start with the same tokens.

- A sequence's `block_table` lists its blocks in position order; position p lives in block
  `block_table[p // block_size]` (infer.paged_attention reads and writes through it). Only the
  last block of a sequence is ever partly empty: at most block_size - 1 positions are wasted per
  sequence, instead of everything past its length in a slot of max_model_len.
- Blocks are counted by reference: a block shared by k sequences has ref_count k and goes back
  to the free list when the last of them lets go.
- Prefix caching: every full block is named by a hash of its tokens and of the block before it
  (so a name stands for the whole prefix up to that block). A new sequence looks up its blocks
  by name and reuses the longest run it finds; those tokens are not computed again. A freed
  block keeps its name and contents until it is handed out again: the free list hands out the
  least recently freed block first (LRU eviction), so recently used prefixes stay findable.
- When there are no free blocks left, `can_append` says no and the scheduler preempts.
- Speculative decoding (infer.engine.speculation) computes guesses past a sequence's newest token.
  Only blocks full of its real tokens are ever named, so a block holding a guess is never shared;
  after verification, `roll_back` frees the blocks that held nothing but rejected guesses, and the
  rejected entries left in its last block are overwritten by the next step.
"""

from collections import deque
from dataclasses import dataclass

from infer.engine.sequence import Sequence
from infer.kv_cache import KVCache


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    prefix_hash: int | None = None  # the name of the prefix ending with this block, once it is full


def blocks_like_slots(max_num_seqs: int, max_model_len: int, block_size: int) -> int:
    """The blocks that hold as much KV memory as `max_num_seqs` slots of `max_model_len` positions."""
    return max_num_seqs * -(-max_model_len // block_size)


class PagedKVStore:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        cache: KVCache | None = None,
        *,
        enable_prefix_caching: bool = False,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks} and {block_size}")
        # a cache with more blocks is fine: those past num_blocks are never handed out (CUDA graphs' spare)
        if cache is not None and (cache.max_seqs < num_blocks or cache.max_len != block_size):
            raise ValueError(
                f"the cache holds {cache.max_seqs} blocks of {cache.max_len} positions, "
                f"not {num_blocks} of {block_size}"
            )
        self.cache, self.block_size, self.enable_prefix_caching = cache, block_size, enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_blocks: deque[int] = deque(range(num_blocks))  # the head is handed out (and evicted) first
        self.cached: dict[int, int] = {}  # prefix hash -> block holding that prefix's last block
        self.named: dict[str, int] = {}  # request id -> how many of its first blocks are named
        self.queried_tokens = self.hit_tokens = 0  # prefix-cache lookups, for the hit rate

    @classmethod
    def for_model(cls, model, num_blocks: int, block_size: int = 16, spare_blocks: int = 0, **kwargs) -> "PagedKVStore":
        """`spare_blocks`: blocks in the cache that the store never hands out (infer.engine.cuda_graphs)."""
        return cls(num_blocks, block_size, KVCache.for_model(model, num_blocks + spare_blocks, block_size), **kwargs)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    # ------------------------------------------------------------ the seam the scheduler asks

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        hits = self._cached_prefix(seq)
        reused_from_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        end = min(seq.num_tokens, len(hits) * self.block_size + num_tokens)
        return self._blocks_for(end) - len(hits) <= len(self.free_blocks) - reused_from_free

    def allocate(self, seq: Sequence, num_tokens: int) -> int:
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id!r} already holds {len(seq.block_table)} blocks")
        hits = self._cached_prefix(seq)
        self.queried_tokens += seq.num_prompt_tokens
        self.hit_tokens += len(hits) * self.block_size
        for block_id in hits:
            if self.blocks[block_id].ref_count == 0:
                self.free_blocks.remove(block_id)
            self.blocks[block_id].ref_count += 1
        seq.block_table = list(hits)
        cached = len(hits) * self.block_size
        self._grow(seq, min(seq.num_tokens, cached + num_tokens))
        return cached

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return self._blocks_for(seq.num_computed_tokens + num_tokens) - len(seq.block_table) <= len(self.free_blocks)

    def append(self, seq: Sequence, num_tokens: int) -> None:
        self._grow(seq, seq.num_computed_tokens + num_tokens)

    def roll_back(self, seq: Sequence) -> None:
        while len(seq.block_table) > self._blocks_for(seq.num_computed_tokens):
            block_id = seq.block_table.pop()  # never named: it held guesses, past the sequence's tokens
            self.blocks[block_id].ref_count = 0
            self.free_blocks.append(block_id)

    def free(self, seq: Sequence) -> None:
        # last blocks first: a prefix's tail is evicted before its head, which more sequences share
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            if block.ref_count < 1:
                raise RuntimeError(f"request {seq.request_id!r} frees block {block_id}, which nobody holds")
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks.append(block_id)
        seq.block_table = []
        self.named.pop(seq.request_id, None)

    def fits(self, num_tokens: int) -> bool:
        return self._blocks_for(num_tokens) <= len(self.blocks)

    @property
    def usage(self) -> float:
        return 1 - len(self.free_blocks) / len(self.blocks)

    @property
    def hit_rate(self) -> float:
        """Prompt tokens found in the prefix cache, over prompt tokens looked up (0 before any)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    # ------------------------------------------------------------ blocks

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _grow(self, seq: Sequence, num_tokens: int) -> None:
        """Give `seq` blocks for its first `num_tokens` positions, and name the blocks its own tokens
        fill (not its guesses: those may be rejected)."""
        while len(seq.block_table) < self._blocks_for(num_tokens):
            seq.block_table.append(self._take_free_block())
        if self.enable_prefix_caching:
            self._name_full_blocks(seq, min(num_tokens, seq.num_tokens))

    def _take_free_block(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("no free KV block: the scheduler must ask can_allocate / can_append first")
        block = self.blocks[self.free_blocks.popleft()]
        if block.prefix_hash is not None:  # evicted: its contents are about to be overwritten
            if self.cached.get(block.prefix_hash) == block.block_id:
                del self.cached[block.prefix_hash]
            block.prefix_hash = None
        block.ref_count = 1
        return block.block_id

    def _name_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Name every block that the first `num_tokens` positions fill, so later sequences find it
        (it is filled in this step's forward, before any of them can read it)."""
        start = self.named.get(seq.request_id, 0)
        parent = self.blocks[seq.block_table[start - 1]].prefix_hash if start else None
        for index in range(start, num_tokens // self.block_size):
            block = self.blocks[seq.block_table[index]]
            if block.prefix_hash is None:
                block.prefix_hash = self._prefix_hash(parent, seq, index)
                self.cached.setdefault(block.prefix_hash, block.block_id)
            parent = block.prefix_hash
            self.named[seq.request_id] = index + 1

    def _prefix_hash(self, parent: int | None, seq: Sequence, index: int) -> int:
        tokens = tuple(seq.token_ids(index * self.block_size, (index + 1) * self.block_size))
        return hash((parent, tokens))

    def _cached_prefix(self, seq: Sequence) -> list[int]:
        """The blocks holding the longest cached run of `seq`'s first full blocks; at least one
        token is always left to compute, since the step that computes it gives the next token."""
        if not self.enable_prefix_caching:
            return []
        hits, parent = [], None
        for index in range((seq.num_tokens - 1) // self.block_size):
            parent = self._prefix_hash(parent, seq, index)
            block_id = self.cached.get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        return hits
