"""The KV cache, written by hand: keep every layer's keys and values so that a decode step
computes them for its one new token only, instead of recomputing the whole prefix.

- `KVCache`: preallocated buffers, one K and one V per layer, shaped
  [max_seqs, kv_heads, max_len, head_dim]. A write copies new entries into a sequence's slot at
  their positions, in place; nothing is allocated while generating. Writing past `max_len`
  raises `KVCacheFull`: nothing is ever silently overwritten or dropped.
- `ConcatKVCache`: the growing version, for contrast. Same interface, but every write
  `torch.cat`s the old tensor with the new entries, so each step copies the whole past again.

Both serve the model through `write(layer, seq_id, start, k, v)` and `read(layer, seq_id, end)`,
with k and v shaped [kv_heads, n, head_dim], and report the bytes they hold (`nbytes`). The
serving engine (weeks 05-08) keeps its keys and values in a `KVCache` too, read as blocks
(infer.paged_attention): a slot is one block of `max_len` positions.
"""

import torch


class KVCacheFull(IndexError):
    """A write would go past the cache's capacity (positions per sequence, or sequence slots)."""


class KVCache:
    """Preallocated per-layer K and V buffers [max_seqs, kv_heads, max_len, head_dim], written in place."""

    def __init__(
        self,
        num_layers: int,
        max_seqs: int,
        max_len: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ):
        shape = (max_seqs, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_seqs, self.max_len = max_seqs, max_len
        self.lengths = [0] * max_seqs  # positions filled in each slot: guards against reading unwritten ones

    def write(self, layer: int, seq_id: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store k, v [kv_heads, n, head_dim] as positions start..start+n-1 of sequence `seq_id`."""
        end = start + k.shape[1]
        _check_write(seq_id, start, end, self.max_seqs, self.max_len, self.lengths)
        self.k[layer][seq_id, :, start:end] = k
        self.v[layer][seq_id, :, start:end] = v
        self.lengths[seq_id] = end

    def read(self, layer: int, seq_id: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of positions 0..end-1 of sequence `seq_id`: views, no copy."""
        return self.k[layer][seq_id, :, :end], self.v[layer][seq_id, :, :end]

    @classmethod
    def for_model(cls, model, max_seqs: int, max_len: int) -> "KVCache":
        """A cache shaped for `model` (an infer.model.Transformer), on its device and in its dtype."""
        weight = model.embed.weight
        return cls(
            model.arch.num_layers,
            max_seqs,
            max_len,
            model.arch.num_kv_heads,
            model.arch.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )

    @property
    def nbytes(self) -> int:
        """Bytes allocated: the whole capacity, used or not."""
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class ConcatKVCache:
    """The growing cache: one K and one V tensor per (layer, sequence), extended by torch.cat."""

    def __init__(self, num_layers: int):
        self.k: list[dict[int, torch.Tensor]] = [{} for _ in range(num_layers)]
        self.v: list[dict[int, torch.Tensor]] = [{} for _ in range(num_layers)]

    def write(self, layer: int, seq_id: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        held = self.k[layer].get(seq_id)
        length = 0 if held is None else held.shape[1]
        if start > length:
            raise ValueError(
                f"sequence {seq_id}: cannot write position {start}, only positions 0..{length - 1} "
                f"are filled; a cache is written without gaps"
            )
        if held is None or start == 0:
            self.k[layer][seq_id], self.v[layer][seq_id] = k.clone(), v.clone()
        else:  # the copy of everything so far, at every step: the cost this version exists to show
            self.k[layer][seq_id] = torch.cat([held[:, :start], k], dim=1)
            self.v[layer][seq_id] = torch.cat([self.v[layer][seq_id][:, :start], v], dim=1)

    def read(self, layer: int, seq_id: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer][seq_id][:, :end], self.v[layer][seq_id][:, :end]

    @classmethod
    def for_model(cls, model) -> "ConcatKVCache":
        return cls(model.arch.num_layers)

    @property
    def nbytes(self) -> int:
        """Bytes held right now: grows with every token."""
        return sum(t.numel() * t.element_size() for layer in self.k + self.v for t in layer.values())


def _check_write(seq_id: int, start: int, end: int, max_seqs: int, max_len: int, lengths: list[int]) -> None:
    if not 0 <= seq_id < max_seqs:
        raise KVCacheFull(
            f"sequence {seq_id} has no slot: this cache has max_seqs={max_seqs} (slots 0..{max_seqs - 1})"
        )
    if end > max_len:
        raise KVCacheFull(
            f"KV cache full: sequence {seq_id} needs position {end - 1}, but each slot holds "
            f"max_len={max_len} positions (0..{max_len - 1}); allocate a larger cache or stop earlier"
        )
    if start > lengths[seq_id]:
        raise ValueError(
            f"sequence {seq_id}: cannot write position {start}, only positions 0..{lengths[seq_id] - 1} "
            f"are filled; a cache is written without gaps"
        )
