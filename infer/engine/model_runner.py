"""One engine step = one forward pass over a flat batch, then sampling.

The scheduler's work items (sequence, tokens to compute) become the model's flat inputs: every
item's tokens in a row, each with its position. Logits are computed only for the rows that sample
(an item's last token when it reaches the sequence's newest token), not for every prompt token:
that is a [rows, vocab] matmul saved per prefill token. An item that carries guesses (speculative
decoding) has rows for them after its newest token, and each of those rows gets logits too: the
target's distribution after the newest token and after each guess, which verification compares.

`flatten` lays out a step for a cache addressed by slots (`seq_ids`, lab 05); the runner hands the
model the step's `PagedKV` instead, built from each sequence's block table, so that any KV store
(slots or small blocks) plugs in the same way.
"""

from dataclasses import dataclass

import torch

from infer.engine.attention_backends import choose_attention
from infer.engine.cuda_graphs import DecodeGraphs, GraphPlan
from infer.engine.kv_store import KVStore
from infer.engine.sampler import Sampler
from infer.engine.scheduler import Work
from infer.engine.speculation import verify
from infer.paged_attention import PagedKV, SeqRun


@dataclass(frozen=True)
class FlatBatch:
    token_ids: torch.Tensor  # [N], on the model's device
    positions: torch.Tensor  # [N], on the CPU (the model plans its per-sequence runs on the host)
    seq_ids: torch.Tensor  # [N] KV slots (the slot store's), on the CPU
    logits_rows: torch.Tensor  # [S] rows that sample (1 + its guesses per sampling item), in work order


def flatten(work: list[Work], device: torch.device | str, *, with_slots: bool = True) -> FlatBatch:
    """Lay the step's work items out one after another as one flat batch."""
    token_ids, positions, seq_ids, logits_rows = [], [], [], []
    for item in work:
        guesses = item.spec_token_ids
        token_ids += item.seq.token_ids(item.start, item.start + item.num_tokens) + guesses
        positions += range(item.start, item.start + item.num_tokens)
        if with_slots:
            seq_ids += [item.seq.slot] * item.num_tokens
        if item.samples:
            logits_rows += range(len(token_ids) - 1 - len(guesses), len(token_ids))
    return FlatBatch(
        torch.tensor(token_ids, device=device),
        torch.tensor(positions, device="cpu"),
        torch.tensor(seq_ids, device="cpu"),
        torch.tensor(logits_rows, dtype=torch.long, device="cpu"),
    )


def step_runs(work: list[Work]) -> list[SeqRun]:
    """Each work item's rows in the flat batch that `flatten` lays out (seq_id: its index in `work`)."""
    runs, row = [], 0
    for index, item in enumerate(work):
        runs.append(SeqRun(index, row, item.start, item.num_tokens))
        row += item.num_tokens
    return runs


class ModelRunner:
    """`decode_attention`: the kernels' name for infer.engine.attention_backends ("auto", "sdpa",
    ...) or a decode function of your own. `graphs`: decode steps replayed from CUDA graphs
    (infer.engine.cuda_graphs), or None: every step eager."""

    def __init__(
        self, model, kv_store: KVStore, sampler: Sampler, decode_attention="auto", graphs: GraphPlan | None = None
    ):
        self.model, self.kv_store, self.sampler = model, kv_store, sampler
        self.device = model.embed.weight.device
        self.attention = choose_attention(decode_attention, model, kv_store.block_size)
        self.graphs: DecodeGraphs | None = None
        if graphs is not None:
            spare = kv_store.num_blocks  # the stores hand out blocks 0..num_blocks-1; the cache has one more
            if kv_store.cache.max_seqs <= spare:
                raise ValueError(
                    "CUDA graphs need a spare KV block for their padding rows: build the store with spare_blocks=1"
                )
            self.graphs = DecodeGraphs(
                model, kv_store.cache, spare, graphs.max_num_seqs, graphs.max_model_len,
                self.attention.decode_kernel, graphs.graph_type,
            )  # fmt: skip
        self.num_forwards = 0  # how many model calls so far: one per step
        self.num_replays = 0  # how many of them replayed a CUDA graph

    @torch.no_grad()
    def forward(self, work: list[Work]) -> torch.Tensor:
        """Run the step's work in one forward; return the logits of the rows that sample."""
        self.num_forwards += 1
        if self.graphs is not None and self.graphs.runs(work):
            self.num_replays += 1
            return self.graphs.run(work)
        batch = flatten(work, self.device, with_slots=False)
        tables = [item.seq.block_table for item in work]
        kv = PagedKV.for_runs(
            self.kv_store.cache, step_runs(work), tables, self.attention.decode_kernel, self.attention.prefill_kernel
        )
        return self.model(batch.token_ids, batch.positions, kv, logits_rows=batch.logits_rows.to(self.device))

    def sample(self, work: list[Work], logits: torch.Tensor) -> list[list[int]]:
        """The tokens each item that samples adds, in work order: its one sampled token, or, when
        the step verifies guesses, what verification keeps (infer.engine.speculation)."""
        sampling = [item for item in work if item.samples]
        if any(item.spec_token_ids for item in sampling):
            return verify(sampling, logits, self.sampler)
        seqs = [item.seq for item in sampling]
        tokens = self.sampler.sample(logits, [s.request_id for s in seqs], [s.params for s in seqs])
        return [[token] for token in tokens]
