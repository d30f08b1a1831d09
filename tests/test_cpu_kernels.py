"""The compiled decode kernel (infer/csrc/paged_decode_attention.cpp) against the eager path it
replaces: PagedKV's gather and PyTorch's attention, on block tables and on slots."""

import random

import pytest
import torch

from infer.cpu_kernels import KernelUnavailable, in_place_decode_attention
from infer.kv_cache import KVCache
from infer.paged_attention import PagedKV, SeqRun

# float32 sums over a few hundred keys, in another order than PyTorch's kernel
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(scope="module")
def kernel():
    try:
        return in_place_decode_attention()
    except KernelUnavailable as why:
        pytest.skip(f"the in-place decode kernel cannot be built here: {why}")


def filled_cache(num_blocks: int, kv_heads: int, block_size: int, head_dim: int, seed: int) -> KVCache:
    cache = KVCache(1, num_blocks, block_size, kv_heads, head_dim)
    generator = torch.Generator().manual_seed(seed)
    for buffer in (cache.k[0], cache.v[0]):
        buffer.copy_(torch.randn(buffer.shape, generator=generator))
    return cache


def decode_step(cache: KVCache, lengths: list[int], tables: list[list[int]], heads: int, seed: int, kernel=None):
    """Attention output of one decode token per sequence (its last position), through PagedKV."""
    runs = [SeqRun(index, index, length - 1, 1) for index, length in enumerate(lengths)]
    kv = PagedKV.for_runs(cache, runs, tables, decode_kernel=kernel)
    q = torch.randn(len(lengths), heads, cache.k[0].shape[-1], generator=torch.Generator().manual_seed(seed))
    return kv._decode_attention(0, q[kv.decode_rows])


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4), (14, 2)])
def test_the_kernel_matches_the_gather_on_scattered_blocks(kernel, heads, kv_heads):
    block_size, head_dim = 16, 32
    rng = random.Random(heads)
    lengths = [1, 15, 16, 17, 31, 200, 288, 5]  # one token, and lengths either side of a block boundary
    cache = filled_cache(200, kv_heads, block_size, head_dim, seed=heads)
    free = list(range(1, 200))
    rng.shuffle(free)  # blocks in no order: a table's blocks are scattered across the cache
    tables = [[free.pop() for _ in range(-(-length // block_size))] for length in lengths]
    eager = decode_step(cache, lengths, tables, heads, seed=1)
    fast = decode_step(cache, lengths, tables, heads, seed=1, kernel=kernel)
    torch.testing.assert_close(
        fast,
        eager,
        **TOLERANCE,
        msg=lambda m: (
            f"the kernel disagrees with gather + scaled_dot_product_attention on block tables: {m}. "
            "Check the block and offset of each position, and that each query head reads KV head h // group"
        ),
    )


def test_the_kernel_matches_the_in_place_view_on_slots(kernel):
    max_len = 300
    cache = filled_cache(6, 2, max_len, 32, seed=7)  # the slot store: one block of max_model_len a sequence
    lengths, slots = [300, 1, 120, 77], [[4], [0], [5], [2]]
    eager = decode_step(cache, lengths, slots, 8, seed=3)
    fast = decode_step(cache, lengths, slots, 8, seed=3, kernel=kernel)
    torch.testing.assert_close(
        fast, eager, **TOLERANCE, msg=lambda m: f"on slots, the kernel should read a slot up to its length: {m}"
    )


def test_the_kernel_reads_nothing_past_a_sequence_length(kernel):
    cache = filled_cache(4, 2, 16, 32, seed=2)
    q = torch.randn(1, 8, 32)
    table, length = torch.tensor([[3, 1]]), torch.tensor([20])
    before = kernel(q, cache.k[0], cache.v[0], table, length, 32**-0.5)
    cache.k[0][1, :, 4:] = float("nan")  # positions 20..31 of the sequence: past its length
    cache.v[0][1, :, 4:] = float("nan")
    after = kernel(q, cache.k[0], cache.v[0], table, length, 32**-0.5)
    assert torch.equal(before, after), "a key or value past the sequence's length changed the output"


def test_the_kernel_refuses_what_it_cannot_compute(kernel):
    cache = filled_cache(2, 2, 16, 32, seed=0)
    table, length = torch.tensor([[0]]), torch.tensor([4])
    with pytest.raises(RuntimeError, match="float32"):
        kernel(torch.randn(1, 8, 32, dtype=torch.bfloat16), cache.k[0], cache.v[0], table, length, 1.0)
    with pytest.raises(RuntimeError, match="does not fit its block table"):
        kernel(torch.randn(1, 8, 32), cache.k[0], cache.v[0], table, torch.tensor([17]), 1.0)


def test_a_gpu_device_is_told_the_kernel_is_for_the_cpu():
    with pytest.raises(KernelUnavailable, match="CPU kernel"):
        in_place_decode_attention("cuda")


@pytest.mark.parametrize("kv_store", ["slots", "paged"])
def test_the_engine_with_the_kernel_generates_the_same_greedy_tokens(kernel, tiny, kv_store):
    from infer.engine import Engine
    from infer.engine.sequence import SamplingParams
    from infer.model import Transformer

    model = Transformer.from_hf(tiny.model)
    rng = random.Random(5)
    prompts = [[rng.randrange(3, 250) for _ in range(rng.randrange(2, 90))] for _ in range(10)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    outputs = {}
    for attention in ("sdpa", "in_place"):
        # a small budget: prompts in chunks beside running decodes, so steps mix both paths
        engine = Engine(model, "chunked", 6, 48, 160, kv_store=kv_store, decode_attention=attention)
        outputs[attention] = [out.token_ids for out in engine.generate(prompts, params, progress=False)]
    assert outputs["in_place"] == outputs["sdpa"], (
        f"{kv_store}: the engine with decode_attention='in_place' generated other greedy tokens than with 'sdpa'"
    )


def test_the_engine_names_a_decode_attention_it_does_not_have(tiny):
    from infer.engine import Engine
    from infer.model import Transformer

    with pytest.raises(ValueError, match="'sdpa', 'in_place'"):
        Engine(Transformer.from_hf(tiny.model), decode_attention="flash")
