"""Speculative decoding in the engine (week 10): the reference loop of infer.speculative, for every
running sequence at once, inside the engine's step.

    propose(proposer, running, k)   # before scheduling: guesses for each sequence that decodes
    work = scheduler.schedule()     # such a sequence's item has 1 + len(guesses) rows: the budget counts them
    logits = runner.forward(work)   # the same one flat forward, with logits for the newest token and each guess
    kept = verify(...)              # per item: the guesses the target keeps, then one token of its own
    scheduler.update(work, kept)    # append them (up to EOS or max_tokens), roll back past the rejected ones

A sequence is never given more guesses than its max_tokens leaves room for after the target's own
token, so its guesses always fit the KV room it was admitted with.

Two proposers, vLLM's methods of the same names:
- "ngram" (`PromptLookup`): the reference's `NgramProposer` on each sequence's tokens; no model, no state.
- "draft_model" (`DraftModel`): a small Transformer (week 10's tiny-draft) guesses for all speculating
  sequences in k batched forwards, with a KV cache of its own: one slot per speculating sequence,
  which catches up on the tokens it has not seen (the prompt, then what the target kept) and is
  given back when the sequence stops running (finished, aborted or preempted).

Both guess deterministically (the draft greedily: vLLM's default draft_sample_method), so the
proposal distribution q is a point mass on each guess, as `accept_sampled` assumes: a sampled
request's tokens are distributed as the target's. A greedy request's are exactly those the engine
gives without speculation (`accept_greedy`).
"""

import heapq
from dataclasses import dataclass
from typing import Protocol

import torch

from infer.engine.sampler import Sampler, sampling_probs
from infer.engine.scheduler import Work
from infer.engine.sequence import Sequence
from infer.kv_cache import KVCache
from infer.model import Transformer
from infer.paged_attention import PagedKV, SeqRun
from infer.speculative import NgramProposer, accept_greedy, accept_sampled

METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """The fields of vLLM's speculative config that this engine has, under vLLM's names but one:
    vLLM's `model` names a draft checkpoint; `draft_model` is the model itself."""

    method: str  # "ngram" (prompt lookup) or "draft_model"
    num_speculative_tokens: int  # k: guesses per sequence and step, at most
    draft_model: Transformer | None = None  # "draft_model": a model with the target's vocabulary
    prompt_lookup_max: int = 3  # "ngram": the longest n-gram looked up, then shorter ones down to
    prompt_lookup_min: int = 1

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"unknown speculative method {self.method!r}; valid: {', '.join(map(repr, METHODS))}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be a positive integer, got {self.num_speculative_tokens!r}")
        if (self.method == "draft_model") != (self.draft_model is not None):
            raise ValueError("method 'draft_model' needs a draft_model, and only it takes one")


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], num_guesses: list[int]) -> list[list[int]]:
        """At most num_guesses[i] guesses at the tokens after seqs[i]'s newest one (fewer, or none, is fine)."""

    def free(self, seq: Sequence) -> None:
        """Forget `seq`: it stopped running (finished, aborted or preempted)."""


class PromptLookup:
    def __init__(self, prompt_lookup_max: int, prompt_lookup_min: int):
        self.ngram = NgramProposer(prompt_lookup_max, prompt_lookup_min)

    def propose(self, seqs: list[Sequence], num_guesses: list[int]) -> list[list[int]]:
        return [self.ngram.propose(seq.token_ids(0, seq.num_tokens), n) for seq, n in zip(seqs, num_guesses)]

    def free(self, seq: Sequence) -> None:
        pass


class DraftModel:
    def __init__(self, draft, max_num_seqs: int, max_model_len: int):
        self.draft = draft
        self.cache = KVCache.for_model(draft, max_num_seqs, max_model_len)  # read as one block per slot
        self.free_slots = list(range(max_num_seqs))  # a heap, as the slot store's
        self.slots: dict[str, int] = {}  # request id -> its slot
        self.seen: dict[str, int] = {}  # request id -> how many of its first tokens the slot holds

    @torch.no_grad()
    def propose(self, seqs: list[Sequence], num_guesses: list[int]) -> list[list[int]]:
        for seq in seqs:
            if seq.request_id not in self.slots:
                self.slots[seq.request_id], self.seen[seq.request_id] = heapq.heappop(self.free_slots), 0
        # What each slot lacks, up to the newest token; at least that one, whose logits give the first guess.
        starts = [min(self.seen[seq.request_id], seq.num_tokens - 1) for seq in seqs]
        pending = [seq.token_ids(start, seq.num_tokens) for seq, start in zip(seqs, starts)]
        guesses: list[list[int]] = [[] for _ in seqs]
        for _ in range(max(num_guesses, default=0)):
            active = [i for i, n in enumerate(num_guesses) if len(guesses[i]) < n]
            slots = [self.slots[seqs[i].request_id] for i in active]
            tokens = self._next_tokens(slots, [pending[i] for i in active], [starts[i] for i in active])
            for i, token in zip(active, tokens):
                guesses[i].append(token)
                starts[i] += len(pending[i])
                pending[i] = [token]
        for seq in seqs:  # the slot's guesses past the newest token are overwritten next time
            self.seen[seq.request_id] = seq.num_tokens
        return guesses

    def _next_tokens(self, slots: list[int], pending: list[list[int]], starts: list[int]) -> list[int]:
        """One draft forward over every slot's pending tokens; the greedy token after each's last."""
        device = self.draft.embed.weight.device
        runs, row = [], 0
        for index, (tokens, start) in enumerate(zip(pending, starts)):
            runs.append(SeqRun(index, row, start, len(tokens)))
            row += len(tokens)
        kv = PagedKV.for_runs(self.cache, runs, [[slot] for slot in slots])
        token_ids = torch.tensor([t for tokens in pending for t in tokens], device=device)
        positions = torch.tensor([p for run in runs for p in range(run.start, run.end)], device="cpu")
        last_rows = torch.tensor([run.row + run.n - 1 for run in runs], device=device)
        return self.draft(token_ids, positions, kv, logits_rows=last_rows).argmax(dim=-1).tolist()

    def free(self, seq: Sequence) -> None:
        slot = self.slots.pop(seq.request_id, None)
        if slot is not None:
            heapq.heappush(self.free_slots, slot)
            del self.seen[seq.request_id]


def make_proposer(config: SpeculativeConfig, max_num_seqs: int, max_model_len: int) -> Proposer:
    if config.method == "ngram":
        return PromptLookup(config.prompt_lookup_max, config.prompt_lookup_min)
    return DraftModel(config.draft_model, max_num_seqs, max_model_len)


def propose(proposer: Proposer, running: list[Sequence], k: int) -> None:
    """Set the guesses of every running sequence that decodes (its KV is complete but for its newest
    token): at most k, and at most what its max_tokens leaves after the target's own next token."""
    decoding = [seq for seq in running if seq.num_computed_tokens == seq.num_tokens - 1]
    room = [min(k, seq.params.max_tokens - len(seq.output_token_ids) - 1) for seq in decoding]
    for seq in decoding:
        seq.spec_token_ids = []
    speculating = [(seq, n) for seq, n in zip(decoding, room) if n > 0]
    if speculating:
        guesses = proposer.propose([seq for seq, _ in speculating], [n for _, n in speculating])
        for (seq, n), seq_guesses in zip(speculating, guesses):
            seq.spec_token_ids = list(seq_guesses[:n])


def verify(items: list[Work], logits: torch.Tensor, sampler: Sampler) -> list[list[int]]:
    """The tokens each sampling item keeps, from its 1 + len(guesses) rows of `logits` (item order):
    a greedy request's by `accept_greedy`; any other's by rejection sampling against the distribution
    its own temperature, top-k and top-p make, drawn from its own generator when it has a seed."""
    choices = logits.argmax(dim=-1).tolist()  # all greedy rows at once: one device sync
    kept, row = [], 0
    for item in items:
        guesses, params = item.spec_token_ids, item.seq.params
        rows = slice(row, row + len(guesses) + 1)
        row = rows.stop
        if params.greedy:
            kept.append(accept_greedy(guesses, choices[rows]))
        else:
            probs = torch.stack([sampling_probs(row_logits, params) for row_logits in logits[rows]])
            kept.append(accept_sampled(probs, guesses, sampler.generators.get(item.seq.request_id)))
    return kept
