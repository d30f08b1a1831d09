"""The hand-written caches: in-place writes, reads of exactly what was written, a clear error at
capacity, and byte counts that match the memory calculator."""

import pytest
import torch

from infer.kv_cache import ConcatKVCache, KVCache, KVCacheFull
from infer.memory import kv_bytes_per_token
from infer.model import Transformer
from infer.models import MODEL_SPECS

LAYERS, SEQS, MAX_LEN, KV_HEADS, HEAD_DIM = 2, 3, 16, 2, 4


def entries(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return (
        torch.randn(KV_HEADS, n, HEAD_DIM, generator=generator),
        torch.randn(KV_HEADS, n, HEAD_DIM, generator=generator),
    )


@pytest.mark.parametrize(
    "make",
    [lambda: KVCache(LAYERS, SEQS, MAX_LEN, KV_HEADS, HEAD_DIM), lambda: ConcatKVCache(LAYERS)],
    ids=["preallocated", "growing"],
)
def test_read_returns_exactly_what_was_written_per_layer_and_sequence(make):
    cache = make()
    k0, v0 = entries(5, 0)  # sequence 0: a 5-token prompt...
    k1, v1 = entries(1, 1)  # ...then one decode token at position 5
    k2, v2 = entries(3, 2)  # sequence 2, layer 1 only
    cache.write(0, 0, 0, k0, v0)
    cache.write(0, 0, 5, k1, v1)
    cache.write(1, 2, 0, k2, v2)
    keys, values = cache.read(0, 0, 6)
    assert keys.shape == (KV_HEADS, 6, HEAD_DIM), (
        f"read(layer, seq, end=6) must give [kv_heads, 6, head_dim], got {tuple(keys.shape)}"
    )
    assert torch.equal(keys, torch.cat([k0, k1], dim=1)) and torch.equal(values, torch.cat([v0, v1], dim=1))
    assert torch.equal(cache.read(1, 2, 3)[0], k2), "layers and sequences must not share storage"
    assert torch.equal(cache.read(0, 0, 3)[1], v0[:, :3]), "read(end=3) returns positions 0..2 only"


def test_preallocated_writes_in_place_and_never_reallocates():
    cache = KVCache(LAYERS, SEQS, MAX_LEN, KV_HEADS, HEAD_DIM)
    pointers = [t.data_ptr() for t in cache.k + cache.v]
    for position in range(MAX_LEN):
        cache.write(0, 1, position, *entries(1, position))
    assert [t.data_ptr() for t in cache.k + cache.v] == pointers, "writes must copy into the buffers, not replace them"


def test_writing_past_capacity_raises_a_clear_error_and_overwrites_nothing():
    cache = KVCache(LAYERS, SEQS, MAX_LEN, KV_HEADS, HEAD_DIM)
    cache.write(0, 1, 0, *entries(MAX_LEN - 2, 0))
    before = cache.k[0].clone()
    with pytest.raises(KVCacheFull) as error:
        cache.write(0, 1, MAX_LEN - 2, *entries(3, 1))  # positions 14, 15, 16: one too many
    message = str(error.value)
    for part in ("sequence 1", f"position {MAX_LEN}", f"max_len={MAX_LEN}"):
        assert part in message, f"the capacity error must name {part!r}; it says: {message}"
    assert torch.equal(cache.k[0], before), "a refused write must leave the cache untouched"
    with pytest.raises(KVCacheFull, match="no slot"):
        cache.write(0, SEQS, 0, *entries(1, 2))


def test_a_gap_in_the_positions_is_refused():
    for cache in (KVCache(LAYERS, SEQS, MAX_LEN, KV_HEADS, HEAD_DIM), ConcatKVCache(LAYERS)):
        cache.write(0, 0, 0, *entries(4, 0))
        with pytest.raises(ValueError, match="without gaps"):
            cache.write(0, 0, 6, *entries(1, 1))


def test_generation_past_capacity_raises_mid_generation():
    from infer.generate import cached_greedy_generate

    config = MODEL_SPECS["tiny"].config()
    model = Transformer(config).eval()
    cache = KVCache.for_model(model, max_seqs=1, max_len=20)
    with pytest.raises(KVCacheFull, match="position 20"):
        cached_greedy_generate(model, torch.arange(10), 12, cache)  # needs positions 0..20


def test_bytes_held_match_the_calculator():
    config = MODEL_SPECS["tiny"].config()
    model = Transformer(config)
    per_token = kv_bytes_per_token(config, torch.float32)
    preallocated = KVCache.for_model(model, max_seqs=3, max_len=100)
    assert preallocated.nbytes == 3 * 100 * per_token, "a preallocated cache holds its whole capacity"
    growing = ConcatKVCache.for_model(model)
    assert growing.nbytes == 0
    arch = model.arch
    for layer in range(arch.num_layers):
        k = torch.zeros(arch.num_kv_heads, 7, arch.head_dim)
        growing.write(layer, 0, 0, k, k)
    assert growing.nbytes == 7 * per_token, "a growing cache holds exactly the tokens written so far"
