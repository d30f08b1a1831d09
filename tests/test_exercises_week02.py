import torch

from infer.course.exercises.week02 import _write_past_capacity
from infer.kv_cache import KVCache


class CacheWithoutCapacityCheck:
    """A student cache that relies on torch's shape mismatch instead of checking max_len."""

    def __init__(self, num_layers, max_seqs, max_len, kv_heads, head_dim):
        self.k = [torch.zeros(max_seqs, kv_heads, max_len, head_dim) for _ in range(num_layers)]
        self.v = [torch.zeros(max_seqs, kv_heads, max_len, head_dim) for _ in range(num_layers)]

    def write(self, layer, seq_id, start, k, v):
        end = start + k.shape[1]
        self.k[layer][seq_id, :, start:end] = k
        self.v[layer][seq_id, :, start:end] = v


def test_capacity_check_wants_an_error_that_names_the_capacity():
    verdict = _write_past_capacity(CacheWithoutCapacityCheck, "02.lab.kv_cache")
    assert verdict is not None and "does not name the capacity" in verdict.reason
    assert _write_past_capacity(KVCache, "02.lab.kv_cache") is None, "the library's KVCache must pass its own check"
