"""Where running sequences keep their keys and values, behind the interface the scheduler asks
every step: can this sequence start (or go on) with its next n tokens, then give it the room;
take the room back when it ends or is preempted.

A store hands out *blocks* and keeps each sequence's `block_table` (its blocks, in position
order); the model reads and writes through those tables (infer.paged_attention). Allocation
reports how many of the prompt's tokens are already cached (prefix caching, week 08), so that a
prefill can skip them without the policies knowing.

`SlotKVStore` is the course's week 02 cache (`infer.kv_cache.KVCache`) seen as blocks of
`max_model_len` positions: one block, a slot, per running sequence, the lowest free one first.
Room for a whole sequence is reserved up front, so an append never runs out, and a rollback
(speculative decoding's rejected guesses) gives nothing back: their entries are overwritten at
their positions by the next step, like the reference's (infer.speculative). Simple, and wasteful
of memory. Week 08's paged store hands out small blocks as sequences grow, and may run
out, which makes the scheduler preempt.
"""

import heapq
from typing import Protocol

from infer.engine.sequence import Sequence
from infer.kv_cache import KVCache


class KVStore(Protocol):
    cache: KVCache | None  # the buffers the model reads and writes (None: bookkeeping only, for the simulator)
    block_size: int  # positions per block

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        """Room for a waiting sequence to compute its next `num_tokens` (after any cached prefix)?"""

    def allocate(self, seq: Sequence, num_tokens: int) -> int:
        """Give `seq` its blocks; return how many of its first tokens are already cached (0: none)."""

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Room for a running sequence to compute `num_tokens` more?"""

    def append(self, seq: Sequence, num_tokens: int) -> None: ...

    def roll_back(self, seq: Sequence) -> None:
        """`seq.num_computed_tokens` went back (speculative guesses rejected): let go of the room past it."""

    def free(self, seq: Sequence) -> None: ...

    def fits(self, num_tokens: int) -> bool:
        """Could a sequence of `num_tokens` ever fit, with the store to itself? (Checked at add_request.)"""

    @property
    def usage(self) -> float: ...  # fraction of the store in use, 0..1 (a server's KV-usage gauge)


class SlotKVStore:
    """One slot of `max_model_len` positions per running sequence, from a free list kept as a min-heap."""

    def __init__(self, max_num_seqs: int, max_model_len: int, cache: KVCache | None = None):
        if cache is not None and (cache.max_seqs < max_num_seqs or cache.max_len != max_model_len):
            raise ValueError(
                f"the cache holds {cache.max_seqs} slots of {cache.max_len} positions, "
                f"not {max_num_seqs} of {max_model_len}"
            )  # slots past max_num_seqs are never handed out (CUDA graphs pad their batches into one)
        self.cache, self.block_size, self.num_slots = cache, max_model_len, max_num_seqs
        self.free_slots = list(range(max_num_seqs))  # a heap: heappop hands out the lowest slot
        self.owner: dict[int, str] = {}  # slot -> request id, to catch a double free

    @classmethod
    def for_model(cls, model, max_num_seqs: int, max_model_len: int, spare_blocks: int = 0) -> "SlotKVStore":
        """`spare_blocks`: slots in the cache that the store never hands out (infer.engine.cuda_graphs)."""
        cache = KVCache.for_model(model, max_num_seqs + spare_blocks, max_model_len)
        return cls(max_num_seqs, max_model_len, cache)

    @property
    def num_blocks(self) -> int:
        return self.num_slots

    def can_allocate(self, seq: Sequence, num_tokens: int) -> bool:
        return bool(self.free_slots) and seq.num_tokens <= self.block_size

    def allocate(self, seq: Sequence, num_tokens: int) -> int:
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id!r} already holds slot {seq.block_table[0]}")
        if not self.free_slots:
            raise RuntimeError(f"no free KV slot for request {seq.request_id!r}: all {self.num_slots} are in use")
        slot = heapq.heappop(self.free_slots)
        seq.block_table = [slot]
        self.owner[slot] = seq.request_id
        return 0

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        return seq.num_computed_tokens + num_tokens <= self.block_size  # the slot was reserved whole

    def append(self, seq: Sequence, num_tokens: int) -> None:
        pass

    def roll_back(self, seq: Sequence) -> None:
        pass

    def free(self, seq: Sequence) -> None:
        slot = seq.slot
        if slot is None or self.owner.get(slot) != seq.request_id:
            raise RuntimeError(f"request {seq.request_id!r} does not hold slot {slot}")
        del self.owner[slot]
        heapq.heappush(self.free_slots, slot)
        seq.block_table = []

    def fits(self, num_tokens: int) -> bool:
        return num_tokens <= self.block_size

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    @property
    def usage(self) -> float:
        return 1 - len(self.free_slots) / self.num_slots
