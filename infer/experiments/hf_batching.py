"""`transformers`' two batched generation APIs, as the week 05 benchmark runs them against the
course engine, wrapped here because they move between releases (checked on transformers 5.24):

- static batching: `generate()` on a left-padded batch. Every row runs until the batch's longest
  answer is done, so a short answer's slot idles while the long ones finish;
- continuous batching: `generate_batch()` (transformers >= 4.56), a paged-cache scheduler in a
  background thread. Sized here explicitly: left to itself on a CPU, it sizes its KV cache from
  the machine's memory, which took about a minute before the first token on a 2-core box.

Both are greedy with end-of-sequence disabled, so each request gets exactly the tokens asked for.
"""

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig


def _greedy_config(max_new_tokens: int, pad_token_id: int) -> GenerationConfig:
    # eos_token_id=[]: transformers 5 replaces None with the model's own EOS id (see infer/hf.py)
    return GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=[], pad_token_id=pad_token_id)


@torch.no_grad()
def static_batched_generate(
    model, prompts: list[list[int]], output_lens: list[int], batch_size: int, pad_token_id: int
) -> list[list[int]]:
    """Requests in arrival order, `batch_size` at a time, each batch left-padded to its longest
    prompt and run for its longest output. Returns each request's first output_len tokens."""
    device = next(model.parameters()).device
    results = []
    for first in range(0, len(prompts), batch_size):
        batch, lens = prompts[first : first + batch_size], output_lens[first : first + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad_token_id] * (width - len(p)) + list(p) for p in batch], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
        out = model.generate(ids, attention_mask=mask, generation_config=_greedy_config(max(lens), pad_token_id))
        results += [row[width : width + n].tolist() for row, n in zip(out, lens)]
    return results


def continuous_batched_generate(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    max_batch_tokens: int,
    num_blocks: int,
    block_size: int = 64,
    pad_token_id: int = 0,
) -> list[list[int]]:
    """`generate_batch()` over all prompts (it takes one max_new_tokens for every request);
    results in input order."""
    config = ContinuousBatchingConfig(num_blocks=num_blocks, page_size=block_size, max_batch_tokens=max_batch_tokens)
    out = model.generate_batch(
        [list(p) for p in prompts],
        generation_config=_greedy_config(max_new_tokens, pad_token_id),
        continuous_batching_config=config,
        progress_bar=False,
        warmup=False,
    )
    if len(out) != len(prompts) or any(result.error is not None for result in out.values()):
        raise RuntimeError(f"generate_batch returned {len(out)} of {len(prompts)} results, or failed ones")
    return [list(result.generated_tokens) for result in out.values()]  # keyed req_0, req_1, ... in input order
