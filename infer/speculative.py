"""Speculative decoding, greedy, for one sequence: the reference that week 10 builds on.

A cheap proposer guesses the next k tokens; the target model checks all k in ONE forward pass over
them (a k+1-row "prefill" on top of its cache) and keeps the longest prefix that agrees with its own
greedy choice, plus one token of its own: the first it disagrees on, or the one after the last
guess when every guess was right. So each target pass yields between 1 and k + 1 tokens, and the
output is exactly the target's greedy output, whatever the proposer says.

Two proposers:
- `NgramProposer`: prompt lookup (vLLM's `ngram` method). Find the latest earlier place where the
  sequence's last n tokens occurred (n from `max_n` down to `min_n`) and propose what followed
  there. No model at all: it pays off where text repeats (code, quoted documents, edits).
- `DraftProposer`: a small model (week 10's one-layer `tiny-draft`) decodes k tokens greedily.

Rollback is free with the course's KV cache: entries are written at positions (week 02), and a read
stops at the sequence's length, so the keys of rejected guesses are simply overwritten by the next
pass. Both models keep one cache slot each.

The two acceptance rules live here, and the serving engine uses them too (infer.engine.speculation):
`accept_greedy` keeps the guesses the target agrees with; `accept_sampled` is rejection sampling
(Leviathan et al. 2023, Chen et al. 2023), which keeps the target's distribution at temperature > 0.
"""

from dataclasses import dataclass

import torch

from infer.kv_cache import KVCache


@dataclass
class SpeculationStats:
    target_passes: int = 0
    proposed: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0


class NgramProposer:
    def __init__(self, max_n: int = 3, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n, self.min_n = max_n, min_n

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the sequence's last n tokens."""
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == tail:
                    return tokens[start + n : start + n + k]
        return []


class DraftProposer:
    """A draft model (an infer.model.Transformer) proposing greedily, with a cache of its own."""

    def __init__(self, draft, max_len: int):
        self.draft = draft
        self.cache = KVCache.for_model(draft, 1, max_len)
        self.cached = 0  # how many of the sequence's tokens the draft's cache holds correctly

    def propose(self, tokens: list[int], k: int) -> list[int]:
        # The draft's cache is right up to where the last call began: feed it what it lacks, then its guesses.
        device = self.draft.embed.weight.device
        pending, position, guesses = tokens[self.cached :], self.cached, []
        for _ in range(k):
            last = torch.tensor([len(pending) - 1], device=device)
            positions = torch.arange(position, position + len(pending), device="cpu")  # planned on the host
            logits = self.draft(torch.tensor(pending, device=device), positions, self.cache, logits_rows=last)
            guesses.append(int(logits.argmax(dim=-1)))
            position += len(pending)
            pending = guesses[-1:]
        self.cached = len(tokens)  # its guesses past the sequence count only if the target accepts them
        return guesses


def accept_greedy(guesses: list[int], choices: list[int]) -> list[int]:
    """The tokens a greedy target keeps: the longest prefix of `guesses` equal to its own `choices`
    (its argmax after the newest token and after each guess, len(guesses) + 1 of them), then its
    choice where they part, or its bonus token after the last guess when every guess was right."""
    accepted = 0
    while accepted < len(guesses) and guesses[accepted] == choices[accepted]:
        accepted += 1
    return guesses[:accepted] + [choices[accepted]]


def accept_sampled(probs: torch.Tensor, guesses: list[int], generator: torch.Generator | None = None) -> list[int]:
    """Rejection sampling for guesses that a proposer made deterministically (n-gram lookup, a greedy
    draft), so that its distribution q is a point mass on each guess: accept guess x with probability
    min(1, p(x) / q(x)) = p(x); on a rejection, draw from max(0, p - q), renormalised, which is p
    without x; after the last guess, draw a bonus token from p. Every token kept is then distributed
    exactly as a draw from the target would be.

    probs: [len(guesses) + 1, vocab], the target's distribution after the newest token and after each
    guess (temperature, top-k and top-p applied); returns the tokens kept."""
    kept = []
    for p, guess in zip(probs, guesses):
        if torch.rand((), device=p.device, generator=generator) < p[guess]:
            kept.append(guess)
            continue
        residual = p.clone()
        residual[guess] = 0  # max(0, p - q) for a point mass q; multinomial renormalises
        return kept + [int(torch.multinomial(residual, 1, generator=generator)[0])]
    return kept + [int(torch.multinomial(probs[len(guesses)], 1, generator=generator)[0])]


@torch.no_grad()
def speculative_greedy_generate(target, prompt: list[int], max_new_tokens: int, proposer, k: int, accept=accept_greedy):
    """The target's greedy continuation of `prompt` (a list of token ids), `max_new_tokens` long,
    verified k proposed tokens at a time; returns (new tokens, SpeculationStats). `accept(guesses,
    choices)` picks the tokens each pass keeps (lab 10 plugs its own in)."""
    if max_new_tokens < 1 or k < 0:
        raise ValueError(f"need max_new_tokens >= 1 and k >= 0, got {max_new_tokens} and {k}")
    device = target.embed.weight.device
    cache = KVCache.for_model(target, 1, len(prompt) + max_new_tokens + k + 1)
    tokens, stats = list(prompt), SpeculationStats()
    cached = 0  # the target's cache holds tokens[:cached]
    while len(tokens) - len(prompt) < max_new_tokens:
        room = max_new_tokens - (len(tokens) - len(prompt))
        guesses = proposer.propose(tokens, min(k, room - 1)) if k else []
        fed = tokens[cached:] + guesses  # what the cache lacks, then the guesses: one pass
        positions = torch.arange(cached, cached + len(fed), device="cpu")  # planned on the host
        rows = torch.arange(len(fed) - len(guesses) - 1, len(fed), device=device)
        choices = target(torch.tensor(fed, device=device), positions, cache, logits_rows=rows).argmax(dim=-1).tolist()
        kept = accept(guesses, choices)
        tokens += kept
        cached = len(tokens) - 1  # the target's own last token is not in its cache yet
        stats.target_passes += 1
        stats.proposed += len(guesses)
        stats.accepted += len(kept) - 1
    return tokens[len(prompt) :][:max_new_tokens], stats
