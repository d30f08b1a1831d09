"""One engine step = one forward pass over a flat batch, then sampling.

The scheduler's work items (sequence, tokens to compute) become the model's flat inputs: every
item's tokens in a row, each with its position and its sequence's KV slot. Logits are computed
only for the rows that sample (an item's last token when it reaches the sequence's newest token),
not for every prompt token: that is a [rows, vocab] matmul saved per prefill token.
"""

from dataclasses import dataclass

import torch

from infer.engine.sampler import Sampler
from infer.engine.scheduler import Work


@dataclass(frozen=True)
class FlatBatch:
    token_ids: torch.Tensor  # [N], on the model's device
    positions: torch.Tensor  # [N], on the CPU (the model plans its per-sequence runs on the host)
    seq_ids: torch.Tensor  # [N] KV slots, on the CPU
    logits_rows: torch.Tensor  # [S] rows that sample, in work order


def flatten(work: list[Work], device: torch.device | str) -> FlatBatch:
    """Lay the step's work items out one after another as one flat batch."""
    token_ids, positions, seq_ids, logits_rows = [], [], [], []
    for item in work:
        token_ids += item.seq.token_ids(item.start, item.start + item.num_tokens)
        positions += range(item.start, item.start + item.num_tokens)
        seq_ids += [item.seq.slot] * item.num_tokens
        if item.samples:
            logits_rows.append(len(token_ids) - 1)
    return FlatBatch(torch.tensor(token_ids, device=device), torch.tensor(positions), torch.tensor(seq_ids),
                     torch.tensor(logits_rows, dtype=torch.long))


class ModelRunner:
    def __init__(self, model, cache, sampler: Sampler):
        self.model, self.cache, self.sampler = model, cache, sampler
        self.device = model.embed.weight.device
        self.num_forwards = 0  # how many model calls so far: one per step

    @torch.no_grad()
    def run(self, work: list[Work]) -> list[int]:
        """Run the step's work in one forward; return one sampled token per item that samples."""
        batch = flatten(work, self.device)
        self.num_forwards += 1
        logits = self.model(batch.token_ids, batch.positions, self.cache, batch.seq_ids,
                            logits_rows=batch.logits_rows.to(self.device))
        sampling = [item.seq for item in work if item.samples]
        return self.sampler.sample(logits, [s.request_id for s in sampling], [s.params for s in sampling])
