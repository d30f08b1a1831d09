"""Week 01: the two phases of generation, and how long each takes.

- `naive_greedy_generate`: the simplest correct loop. Every step runs the model over the whole
  sequence so far and keeps only the last position's prediction: correct, and quadratic.
- `prefill_ms` / `decode_step_ms`: the two phases timed apart, with `transformers`' KV cache.
  Prefill processes a whole prompt in one forward pass; a decode step processes one token
  against the cached keys and values of everything before it.
"""

import time

import torch

from infer import hf
from infer.timing import Timing, benchmark, synchronize


@torch.no_grad()
def naive_greedy_generate(model, prompt_ids: torch.Tensor, max_new_tokens: int,
                          timestamps: list[float] | None = None) -> torch.Tensor:
    """Greedy decoding without a cache. Returns the new tokens, shape [batch, max_new_tokens].

    If `timestamps` is a list, the wall-clock time (time.perf_counter, seconds) at which each new
    token became available is appended to it: the raw material of TTFT and TPOT."""
    sequence = prompt_ids
    for _ in range(max_new_tokens):
        logits = hf.forward(model, sequence)  # the whole sequence, every step
        next_token = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
        if timestamps is not None:
            synchronize(next_token.device)
            timestamps.append(time.perf_counter())
    return sequence[:, prompt_ids.shape[1]:]


def ttft_and_tpot_ms(send_time_s: float, token_times_s: list[float]) -> tuple[float, float]:
    """Time to first token and mean time per output token after it, both in milliseconds.

    TPOT averages over the gaps after the first token, so it needs at least two tokens."""
    if len(token_times_s) < 2:
        raise ValueError(f"TPOT needs at least 2 output tokens, got {len(token_times_s)}")
    ttft_ms = (token_times_s[0] - send_time_s) * 1e3
    tpot_ms = (token_times_s[-1] - token_times_s[0]) * 1e3 / (len(token_times_s) - 1)
    return ttft_ms, tpot_ms


@torch.no_grad()
def prefill_ms(model, prompt_ids: torch.Tensor, *, warmup: int = 1, repeats: int = 5) -> Timing:
    """One forward pass over the whole prompt, filling a fresh KV cache: the prefill phase."""
    return benchmark(lambda: hf.forward(model, prompt_ids, hf.new_cache(model)),
                     device=prompt_ids.device, warmup=warmup, repeats=repeats)


@torch.no_grad()
def decode_step_ms(model, context_ids: torch.Tensor, *, warmup: int = 1, repeats: int = 5) -> Timing:
    """One forward pass of a single new token against a cache holding `context_ids`: a decode step."""
    cache = hf.new_cache(model)
    hf.forward(model, context_ids, cache)
    next_token = context_ids[:, -1:]

    def one_step():
        hf.forward(model, next_token, cache)
        cache.crop(-1)  # drop the token just added, so that every repeat sees the same context

    return benchmark(one_step, device=context_ids.device, warmup=warmup, repeats=repeats)
