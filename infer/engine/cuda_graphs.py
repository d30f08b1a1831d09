"""Decode steps replayed from CUDA graphs (week 09's GPU section).

An eager decode step launches a few hundred small kernels, one after another, each costing the
host several microseconds to launch: at a small batch the GPU finishes each kernel before the
host has launched the next, and the step takes as long as its launches. A CUDA graph records a
whole step's launches once; a replay hands them all to the GPU in one call.

A graph replays exactly what it recorded: the same kernels, on the same tensors, at the same
shapes. So:
- Every input a step needs lives in one persistent buffer, and a step copies its values in
  before the replay (one host-to-device copy, from pinned memory on a GPU). The captured step
  reads only those buffers: its block tables, lengths and slot mapping are tensors, never
  Python numbers, and nothing in it reads a tensor's value back to the host.
- One graph per batch size on a ladder (1, 2, 4, 8, then steps of 16, as vLLM does); a batch is
  padded up to the next rung. A padding row decodes token 0 at position 0 of a spare block that
  the KV store never hands out, so its writes land where no sequence reads.
- Attention covers up to `max_model_len` keys in every replay. It is the step's kernel that
  stops at each sequence's own length (flash-attn's or the course's Triton kernel read the
  lengths tensor); with PyTorch's attention the graph gathers the whole table and masks.
- Only pure decode steps replay (one token per sequence, no guesses); a step with a prefill
  chunk, or more sequences than the largest rung, runs eagerly.

`CudaGraph` records and replays on the GPU. On a CPU there is nothing to record: `EagerReplay`
runs the captured step again on the same buffers, which is how the tests check what a replay
reads (a buffer the step forgot to refill gives other tokens) without a GPU.
"""

from dataclasses import dataclass

import torch

from infer.engine.scheduler import Work
from infer.kv_cache import KVCache
from infer.paged_attention import PagedKV


def batch_ladder(max_num_seqs: int) -> list[int]:
    """The batch sizes that get a graph: 1, 2, 4, 8, then every 16 up to `max_num_seqs` (and it)."""
    sizes = {size for size in (1, 2, 4, 8) if size <= max_num_seqs}
    sizes |= set(range(16, max_num_seqs + 1, 16)) | {max_num_seqs}
    return sorted(sizes)


class CudaGraph:
    """One CUDA graph: `capture(step)` records it (after a warm-up run) and returns its output
    tensor; `replay()` runs the recording again, refreshing that tensor. Graphs captured with the
    same `pool` share their memory, largest first."""

    def __init__(self, pool=None):
        self.graph, self.pool = torch.cuda.CUDAGraph(), pool

    def capture(self, step) -> torch.Tensor:
        # the warm-up compiles kernels and sets up cuBLAS's workspaces, outside the recording;
        # PyTorch's docs warm up on a side stream
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        with torch.cuda.graph(self.graph, pool=self.pool):
            output = step()
        torch.cuda.synchronize()
        return output

    def replay(self) -> None:
        self.graph.replay()

    def memory_pool(self):
        return self.graph.pool()


class EagerReplay:
    """The CPU stand-in for `CudaGraph`: a replay runs the captured step again and copies its
    result into the tensor the capture returned. No speed-up; the same buffers read and written."""

    def __init__(self, pool=None):
        self.step = self.output = None

    def capture(self, step) -> torch.Tensor:
        self.step, self.output = step, step()
        return self.output

    def replay(self) -> None:
        self.output.copy_(self.step())

    def memory_pool(self):
        return None


@dataclass(frozen=True)
class GraphPlan:
    """What the engine asks for: graphs up to `max_num_seqs` sequences of up to `max_model_len`
    positions, recorded by `graph_type` (CudaGraph; EagerReplay to test on a CPU)."""

    max_num_seqs: int
    max_model_len: int
    graph_type: type = CudaGraph

    @property
    def line(self) -> str:
        sizes = batch_ladder(self.max_num_seqs)
        kind = "CUDA graphs" if self.graph_type is CudaGraph else f"graphs by {self.graph_type.__name__}"
        return f"{kind} for decode steps at batch sizes {', '.join(map(str, sizes))}"


def graph_plan(cuda_graphs, model, max_num_seqs: int, max_model_len: int) -> GraphPlan | None:
    """The engine's `cuda_graphs` argument as a plan: False (none), True (CUDA graphs, on a CUDA
    device only) or a graph class of your own."""
    if cuda_graphs is False:
        return None
    if cuda_graphs is True:
        device = model.embed.weight.device
        if device.type != "cuda":
            raise ValueError(
                f"cuda_graphs=True needs the model on a CUDA device, and it is on {device}; a CPU has no graphs "
                "to replay (EagerReplay runs the same replay logic on a CPU, for tests)"
            )
        return GraphPlan(max_num_seqs, max_model_len)
    if isinstance(cuda_graphs, type):
        return GraphPlan(max_num_seqs, max_model_len, cuda_graphs)
    raise ValueError(f"cuda_graphs must be True, False or a graph class, got {cuda_graphs!r}")


class DecodeGraphs:
    """Graphs of the model's decode step, one per rung of `batch_ladder(max_num_seqs)`, captured
    at construction over the persistent input buffers."""

    def __init__(
        self,
        model,
        cache: KVCache,
        spare_block: int,
        max_num_seqs: int,
        max_model_len: int,
        decode_kernel=None,
        graph_type=CudaGraph,
    ):
        self.model, self.cache, self.spare_block, self.decode_kernel = model, cache, spare_block, decode_kernel
        self.blocks_per_seq = -(-max_model_len // cache.max_len)
        self.sizes = batch_ladder(max_num_seqs)
        device = model.embed.weight.device
        largest = self.sizes[-1]
        # every input of a step, one after another in one buffer: a step's values arrive in one copy
        fields = [largest] * 5 + [largest * self.blocks_per_seq]
        self.inputs = torch.zeros(sum(fields), dtype=torch.long, device=device)
        self.staging = torch.zeros(sum(fields), dtype=torch.long, device="cpu", pin_memory=device.type == "cuda")
        self.token_ids, self.positions, self.block_ids, self.offsets, self.lengths, tables = self.inputs.split(fields)
        self.tables = tables.view(largest, self.blocks_per_seq)
        self.rows = torch.arange(largest, device=device)
        self._fill([])  # every row a padding row while capturing: the captures write the spare block only
        self.graphs, self.logits, pool = {}, {}, None
        for size in reversed(self.sizes):  # largest first: the smaller ones reuse its memory
            graph = graph_type(pool)
            with torch.no_grad():
                self.logits[size] = graph.capture(lambda size=size: self._step(size))
            self.graphs[size], pool = graph, graph.memory_pool()

    def _step(self, size: int) -> torch.Tensor:
        """The decode step of the first `size` rows, reading nothing but the persistent buffers."""
        kv = PagedKV(
            self.cache,
            self.block_ids[:size],
            self.offsets[:size],
            self.rows[:size],
            self.tables[:size],
            self.lengths[:size],
            prefills=[],
            longest_decode=self.blocks_per_seq * self.cache.max_len,  # fixed: the graph never reads the lengths
            decode_kernel=self.decode_kernel,
        )
        return self.model(self.token_ids[:size], self.positions[:size], kv)

    def runs(self, work: list[Work]) -> bool:
        """Does this step replay? Only one-token decodes with no guesses, at most the largest rung."""
        return 0 < len(work) <= self.sizes[-1] and all(
            item.num_tokens == 1 and item.samples and not item.spec_token_ids for item in work
        )

    def _fill(self, work: list[Work]) -> None:
        """Each item's token, position, slot and table into its row; padding rows after them."""
        largest, block_size = self.sizes[-1], self.cache.max_len
        padding = largest - len(work)
        token_ids = [item.seq.token_ids(item.start, item.start + 1)[0] for item in work] + [0] * padding
        positions = [item.start for item in work] + [0] * padding
        block_ids = [item.seq.block_table[item.start // block_size] for item in work] + [self.spare_block] * padding
        offsets = [item.start % block_size for item in work] + [0] * padding
        lengths = [item.start + 1 for item in work] + [1] * padding
        tables = []
        for item in work:
            table = item.seq.block_table[: self.blocks_per_seq]
            tables += table + [self.spare_block] * (self.blocks_per_seq - len(table))
        tables += [self.spare_block] * (self.blocks_per_seq * padding)
        values = token_ids + positions + block_ids + offsets + lengths + tables
        self.staging.copy_(torch.tensor(values, dtype=torch.long, device="cpu"))
        # non_blocking from pinned memory: the staging buffer is written again only after the step's
        # sampled tokens reach the host, by which time this copy has long finished
        self.inputs.copy_(self.staging, non_blocking=True)

    def run(self, work: list[Work]) -> torch.Tensor:
        """The logits [len(work), vocab] of a decode step, from the smallest graph that holds it.

        A view of the graph's output: the next replay overwrites it, so sample before stepping again."""
        size = next(size for size in self.sizes if size >= len(work))
        self._fill(work)
        self.graphs[size].replay()
        return self.logits[size][: len(work)]
