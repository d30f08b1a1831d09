"""Decode tokens of many sequences share one attention call (padded keys, a length mask): a mixed
flat batch gives the same logits as running each sequence on its own."""

import torch

from infer.kv_cache import ConcatKVCache, KVCache
from infer.model import Transformer

# float32 through 4 layers: BLAS kernels block sums differently for different batch sizes
RTOL, ATOL = 1e-4, 1e-4


def test_mixed_flat_batch_matches_each_sequence_alone(tiny):
    model = Transformer.from_hf(tiny.model)
    g = torch.Generator().manual_seed(0)
    prompt_lens = [5, 17, 1, 30, 9]
    prompts = [torch.randint(0, 250, (n,), generator=g) for n in prompt_lens]
    batched, alone = KVCache.for_model(model, 6, 64), KVCache.for_model(model, 6, 64)
    with torch.no_grad():
        for slot, p in enumerate(prompts):  # both caches hold the same prefixes
            for cache in (batched, alone):
                model(p, torch.arange(len(p)), cache, torch.full_like(p, slot))
        # one step: decodes of slots 0, 1, 3 and 4, a new prompt in slot 5, and a chunk of slot 2 (after its 1 token)
        new_prompt, chunk = torch.randint(0, 250, (7,), generator=g), torch.randint(0, 250, (4,), generator=g)
        decode_tokens = torch.randint(0, 250, (4,), generator=g)
        parts = [(0, decode_tokens[0:1], 5), (1, decode_tokens[1:2], 17), (5, new_prompt, 0), (3, decode_tokens[2:3], 30),
                 (2, chunk, 1), (4, decode_tokens[3:4], 9)]
        tokens = torch.cat([t for _, t, _ in parts])
        positions = torch.cat([torch.arange(start, start + len(t)) for _, t, start in parts])
        slots = torch.cat([torch.full((len(t),), slot) for slot, t, _ in parts])
        together = model(tokens, positions, batched, slots)
        separately = torch.cat([model(t, torch.arange(start, start + len(t)), alone, torch.full_like(t, slot))
                                for slot, t, start in parts])
    torch.testing.assert_close(together, separately, rtol=RTOL, atol=ATOL)


def test_batched_decode_works_with_the_growing_cache(tiny):
    model = Transformer.from_hf(tiny.model)
    prompts = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6])]
    fixed, growing = KVCache.for_model(model, 2, 16), ConcatKVCache.for_model(model)
    with torch.no_grad():
        for slot, p in enumerate(prompts):
            for cache in (fixed, growing):
                model(p, torch.arange(len(p)), cache, torch.full_like(p, slot))
        step = (torch.tensor([7, 8]), torch.tensor([5, 3]), torch.tensor([0, 1]))
        torch.testing.assert_close(model(*step[:2], growing, step[2]), model(*step[:2], fixed, step[2]),
                                   rtol=RTOL, atol=ATOL)
