"""Greedy generation, twice: without a cache (week 01) and with one (week 02).

`naive_greedy_generate` runs the model over the whole sequence at every step and keeps only the
last position's prediction: correct, and quadratic. `cached_greedy_generate` runs it over the
prompt once (the prefill, which fills the cache), and from then on over the single newest token,
whose keys and values join the cache while it attends to everything stored there. Same tokens,
far less work: the naive loop's cost grows with the square of the length, this one's linearly.
"""

import time

import torch

from infer import hf
from infer.timing import synchronize


@torch.no_grad()
def naive_greedy_generate(
    model, prompt_ids: torch.Tensor, max_new_tokens: int, timestamps: list[float] | None = None
) -> torch.Tensor:
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
    return sequence[:, prompt_ids.shape[1] :]


@torch.no_grad()
def cached_greedy_generate(
    model,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    cache,
    *,
    seq_id: int = 0,
    timestamps: list[float] | None = None,
) -> torch.Tensor:
    """Greedy decoding of one sequence with `model` (an infer.model.Transformer) and `cache`
    (a KVCache or ConcatKVCache), in slot `seq_id`. Returns the new tokens, [1, max_new_tokens].

    Positions and slot ids stay on the CPU and the chosen tokens on the device, so a step never
    waits for the device unless `timestamps` (a list: the time.perf_counter() of each new token)
    asks for it."""
    if prompt_ids.dim() == 2 and prompt_ids.shape[0] != 1:
        raise ValueError(f"one sequence at a time: prompt_ids must be [n] or [1, n], got {tuple(prompt_ids.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = model.embed.weight.device
    prompt = prompt_ids.reshape(-1).to(device)
    n = prompt.shape[0]

    def step(token_ids: torch.Tensor, first_position: int, last: torch.Tensor | None = None) -> torch.Tensor:
        positions = torch.arange(first_position, first_position + token_ids.shape[0], device="cpu")
        slots = None if seq_id == 0 else torch.full_like(positions, seq_id)
        next_token = model(token_ids, positions, cache, slots, logits_rows=last).argmax(dim=-1)
        if timestamps is not None:
            synchronize(device)
            timestamps.append(time.perf_counter())
        return next_token  # [1], on the device

    # Only the last position's logits are needed. Its index lives on the device: a host index into a
    # device tensor is copied there with a blocking copy, which would wait for the whole step.
    last = torch.tensor([n - 1], device=device)
    tokens = [step(prompt, 0, last)]  # prefill: the whole prompt in one pass fills the cache
    for i in range(1, max_new_tokens):  # decode: one new token per pass (its only row), at position n + i - 1
        tokens.append(step(tokens[-1], n + i - 1))
    return torch.cat(tokens)[None]
