"""The Triton paged decode kernel (infer/paged_decode_triton.py) against a plain reference: each
sequence's keys gathered through its block table, then PyTorch's attention in float64.

Without a GPU the kernel runs in Triton's CPU interpreter (TRITON_INTERPRET=1, read when triton is
imported), so those tests start a fresh Python. The checks themselves are functions of this module
that return their failures, so the interpreter and the GPU run the same ones."""

import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from infer.paged_decode_triton import available, triton_paged_decode_attention
from tests.triton_interpreter import run_in_interpreter, triton_importable

needs_triton = pytest.mark.skipif(
    not triton_importable(), reason="the triton package is not installed (CPU-only PyTorch)"
)
needs_cuda = pytest.mark.skipif(
    not (torch.cuda.is_available() and triton_importable()), reason="no CUDA GPU with triton here"
)

# Against a float64 reference of the same inputs, |got - want| <= atol + rtol * |want|. fp32: the
# kernel rounds each score, weight and sum to 24 bits, in tiles, in another order; the interpreter's
# worst error here is 5e-7 on outputs up to 3.6, and a GPU's exp is a little coarser, so 1e-5 (as
# tests/test_cpu_kernels.py allows the C++ kernel) leaves room and still catches TF32 (1e-3).
# fp16 and bf16: the weights enter the second dot in the cache's dtype (11 and 8 bits) and the
# result is rounded to it: fp16's worst here is 7e-4.
TOLERANCES = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 2e-3, "atol": 2e-3},
    torch.bfloat16: {"rtol": 1e-2, "atol": 1e-2},
}


@dataclass(frozen=True)
class Case:
    name: str
    heads: int
    kv_heads: int
    block_size: int
    lengths: tuple[int, ...]  # one sequence each, in one batch
    head_dim: int = 16


CASES = [
    Case("one query head per KV head, lengths around a block", 2, 2, 16, (1, 15, 16, 17, 50)),
    Case("groups of 2, several blocks", 4, 2, 16, (33, 5, 64), head_dim=32),
    Case("a group of 7 (7 heads, 1 KV head)", 7, 1, 16, (20, 1, 48)),
    Case("one long block a sequence (the slot store)", 4, 2, 40, (40, 1, 23)),
]
GPU_CASES = [*CASES, Case("a model's shapes", 32, 8, 16, (1, 100, 1000, 17, 513), head_dim=128)]


@dataclass
class Inputs:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    lengths: torch.Tensor
    scale: float

    def run(self) -> torch.Tensor:
        return triton_paged_decode_attention(
            self.q, self.k_cache, self.v_cache, self.block_tables, self.lengths, self.scale
        )

    def poison(self):
        """NaN in every cache slot that holds none of the batch's keys: positions past each length,
        and the blocks no sequence uses (which the tables' unused entries point to)."""
        block_size = self.k_cache.shape[2]
        used = torch.zeros(self.k_cache.shape[0], block_size, dtype=torch.bool, device=self.k_cache.device)
        for table, length in zip(self.block_tables.tolist(), self.lengths.tolist(), strict=True):
            for position in range(length):
                used[table[position // block_size], position % block_size] = True
        for cache in (self.k_cache, self.v_cache):
            cache.transpose(1, 2)[~used] = float("nan")  # the view's [num_blocks, block_size] slots


def make_inputs(case: Case, dtype: torch.dtype, device: str, seed: int, num_blocks=None, max_blocks=None) -> Inputs:
    """Random queries and caches, each sequence's blocks shuffled across the cache. The tables'
    entries past a sequence's blocks point to a block no sequence uses."""
    blocks_needed = [-(-length // case.block_size) for length in case.lengths]
    num_blocks = num_blocks or sum(blocks_needed) + 2
    max_blocks = max_blocks or max(blocks_needed) + 1
    free = list(range(num_blocks))
    random.Random(seed).shuffle(free)  # blocks in no order, and not consecutive
    unused = free.pop()
    tables = [[free.pop() for _ in range(n)] + [unused] * (max_blocks - n) for n in blocks_needed]
    generator = torch.Generator().manual_seed(seed)
    cache_shape = (num_blocks, case.kv_heads, case.block_size, case.head_dim)

    def randn(*shape):
        return torch.randn(shape, generator=generator).to(device, dtype)

    return Inputs(
        q=randn(len(case.lengths), case.heads, case.head_dim),
        k_cache=randn(*cache_shape),
        v_cache=randn(*cache_shape),
        block_tables=torch.tensor(tables, dtype=torch.long, device=device),
        lengths=torch.tensor(case.lengths, dtype=torch.long, device=device),
        scale=case.head_dim**-0.5,
    )


def reference(inputs: Inputs) -> torch.Tensor:
    """Each sequence on its own: its keys 0..length-1 picked out of the blocks its table names,
    then scaled_dot_product_attention in float64 (query head h reads KV head h // group)."""
    block_size = inputs.k_cache.shape[2]
    out = torch.empty(inputs.q.shape, dtype=torch.float64, device=inputs.q.device)
    for b, length in enumerate(inputs.lengths.tolist()):
        positions = torch.arange(length, device=inputs.q.device)
        blocks, offsets = inputs.block_tables[b, positions // block_size], positions % block_size
        keys = inputs.k_cache[blocks, :, offsets].transpose(0, 1).double()  # [kv_heads, length, d]
        values = inputs.v_cache[blocks, :, offsets].transpose(0, 1).double()
        query = inputs.q[b, :, None].double()  # [heads, 1, d]
        out[b] = F.scaled_dot_product_attention(query, keys, values, scale=inputs.scale, enable_gqa=True)[:, 0]
    return out


def _label(case: Case, dtype: torch.dtype) -> str:
    return f"{case.name}, {str(dtype).removeprefix('torch.')}"


def reference_failures(device: str, dtypes, cases=CASES) -> list[str]:
    failures = []
    for dtype in dtypes:
        for seed, case in enumerate(cases):
            inputs = make_inputs(case, dtype, device, seed)
            got = inputs.run()
            try:
                assert got.dtype == dtype, f"the output is {got.dtype}"
                torch.testing.assert_close(got.double(), reference(inputs), **TOLERANCES[dtype])
            except AssertionError as error:
                failures.append(
                    f"{_label(case, dtype)}: the kernel disagrees with gather + attention: {error}. Check each "
                    "position's block and offset, and that query head h reads KV head h // group"
                )
    return failures


def garbage_failures(device: str, dtypes, cases=CASES) -> list[str]:
    """A key past a sequence's length, or in a block it does not own, must not be read: NaN planted
    there would spread to the output (even 0 * NaN is NaN)."""
    failures = []
    for dtype in dtypes:
        for seed, case in enumerate(cases):
            inputs = make_inputs(case, dtype, device, seed)
            clean = inputs.run()
            inputs.poison()
            poisoned = inputs.run()
            if not torch.equal(poisoned, clean):
                rows = sorted({int(b) for b in (poisoned != clean).nonzero()[:, 0]})
                failures.append(
                    f"{_label(case, dtype)}: NaN past the lengths changed the output of sequences {rows} "
                    f"(lengths {[case.lengths[b] for b in rows]}): the kernel reads keys it must not"
                )
    return failures


def engine_failures(device: str, dtypes) -> list[str]:
    """The kernel inside the engine (tiny model, float32): eager steps and replayed ones
    (EagerReplay on a CPU, CUDA graphs on a GPU) must give sdpa's greedy tokens, on both stores."""
    from infer.engine import Engine
    from infer.engine.cuda_graphs import CudaGraph, EagerReplay
    from infer.engine.sequence import benchmark_params
    from infer.model import Transformer
    from infer.models import load_model

    model = Transformer.from_hf(load_model("tiny", weights="random", quiet=True).model).to(device)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, model.arch.vocab_size, (n,), generator=generator).tolist() for n in (5, 17, 9, 30)]
    replay = EagerReplay if device == "cpu" else CudaGraph
    failures = []
    for store in ("slots", "paged"):
        runs = {}
        for name, options in (
            ("sdpa", {}),
            ("triton", dict(decode_attention="triton")),
            ("triton replayed", dict(decode_attention="triton", cuda_graphs=replay)),
        ):
            engine = Engine(model, max_num_seqs=4, max_model_len=64, kv_store=store, **options)
            runs[name] = [r.token_ids for r in engine.generate(prompts, benchmark_params(max_tokens=8))]
            if runs[name] != runs["sdpa"]:
                failures.append(f"{store} store, {name}: greedy tokens differ from sdpa's")
    return failures


def _in_the_interpreter(check: str):
    """Run `check('cpu', (float32, float16))` in a fresh Python with TRITON_INTERPRET=1. The
    interpreter's bf16 dot is broken, so bf16 is left to the CUDA tests."""
    code = (
        "import torch\n"
        f"from tests.test_paged_decode_triton import {check}\n"
        f"failures = {check}('cpu', (torch.float32, torch.float16))\n"
        "assert not failures, '\\n'.join(failures)\n"
    )
    run_in_interpreter(code)


@needs_triton
def test_the_kernel_matches_the_reference_in_the_cpu_interpreter():
    _in_the_interpreter("reference_failures")


@needs_triton
def test_garbage_past_the_lengths_changes_nothing_in_the_cpu_interpreter():
    _in_the_interpreter("garbage_failures")


@needs_triton
def test_the_engine_keeps_its_tokens_with_the_kernel_in_the_cpu_interpreter():
    _in_the_interpreter("engine_failures")


def test_without_a_gpu_the_kernel_says_why(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the interpreter would make the CPU do
    verdict = available("cpu", torch.float32, 16)
    assert not verdict and verdict.reason
    inputs = make_inputs(CASES[0], torch.float32, "cpu", seed=0)
    with pytest.raises(RuntimeError, match="cannot run"):
        inputs.run()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_the_kernel_on_cuda(dtype):
    failures = reference_failures("cuda", (dtype,), GPU_CASES) + garbage_failures("cuda", (dtype,), GPU_CASES)
    assert not failures, "\n".join(failures)


@needs_cuda
def test_the_kernel_replays_in_a_cuda_graph_with_new_lengths_and_tables():
    """Captured once, replayed after the lengths, tables and caches changed in place: what a
    CUDA-graph decode step does every step. The kernel must read them on the device."""
    dtype, first = torch.bfloat16, Case("captured", 8, 2, 16, (5, 40, 17, 1))
    room = {"num_blocks": 16, "max_blocks": 5}  # both batches' shapes: the graph's tensors stay
    static = make_inputs(first, dtype, "cuda", seed=0, **room)
    static.run()  # compile before capturing: a capture cannot compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = static.run()
    later = make_inputs(Case("replayed", 8, 2, 16, (60, 1, 33, 16)), dtype, "cuda", seed=1, **room)
    for name in ("q", "k_cache", "v_cache", "block_tables", "lengths"):
        getattr(static, name).copy_(getattr(later, name))
    graph.replay()
    torch.testing.assert_close(
        out.double(),
        reference(later),
        **TOLERANCES[dtype],
        msg=lambda m: f"the replayed graph did not use the new lengths and tables: {m}",
    )
