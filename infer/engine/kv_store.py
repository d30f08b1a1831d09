"""Where running sequences keep their keys and values, behind the small interface the scheduler
uses: is there room for this sequence, give it room, take the room back.

`SlotKVStore` is the course's week 02 cache (`infer.kv_cache.KVCache`): `max_num_seqs` slots of
`max_model_len` positions each, one slot per running sequence, the lowest free one first (so
the slots in use stay a compact range, which the model's batched decode reads in place). Room
for a whole sequence is reserved up front, which is simple and wastes memory: week 08's paged
store implements the same interface with blocks instead of slots.
"""

import heapq
from typing import Protocol

from infer.engine.sequence import Sequence
from infer.kv_cache import KVCache


class KVStore(Protocol):
    cache: object  # what the model's forward reads and writes (KVCache.write / read / write_tokens / read_slots)

    def can_allocate(self, seq: Sequence) -> bool: ...

    def allocate(self, seq: Sequence) -> None: ...

    def free(self, seq: Sequence) -> None: ...

    @property
    def usage(self) -> float: ...  # fraction of the store in use, 0..1 (a server's KV-usage gauge)


class SlotKVStore:
    """One preallocated cache slot per running sequence, from a free list kept as a min-heap."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.free_slots = list(range(cache.max_seqs))  # a heap: heappop hands out the lowest slot
        self.owner: dict[int, str] = {}  # slot -> request id, to catch a double free

    @classmethod
    def for_model(cls, model, max_num_seqs: int, max_model_len: int) -> "SlotKVStore":
        return cls(KVCache.for_model(model, max_num_seqs, max_model_len))

    def can_allocate(self, seq: Sequence) -> bool:
        return bool(self.free_slots) and seq.num_tokens <= self.cache.max_len

    def allocate(self, seq: Sequence) -> None:
        if seq.slot is not None:
            raise RuntimeError(f"request {seq.request_id!r} already holds slot {seq.slot}")
        if not self.free_slots:
            raise RuntimeError(f"no free KV slot for request {seq.request_id!r}: all {self.cache.max_seqs} are in use")
        seq.slot = heapq.heappop(self.free_slots)
        self.owner[seq.slot] = seq.request_id
        self.cache.lengths[seq.slot] = 0  # the new sequence starts writing at position 0

    def free(self, seq: Sequence) -> None:
        if seq.slot is None or self.owner.get(seq.slot) != seq.request_id:
            raise RuntimeError(f"request {seq.request_id!r} does not hold slot {seq.slot}")
        del self.owner[seq.slot]
        heapq.heappush(self.free_slots, seq.slot)
        seq.slot = None

    @property
    def num_free(self) -> int:
        return len(self.free_slots)

    @property
    def usage(self) -> float:
        return 1 - len(self.free_slots) / self.cache.max_seqs
