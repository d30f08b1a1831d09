"""Pins the transformers behaviour the course depends on (these APIs move between releases)."""

import torch

from infer import hf
from infer.prompts import random_prompt_ids


def test_cached_forward_matches_full_forward(tiny):
    ids = random_prompt_ids(tiny.config, 24, seed=2)
    full = hf.forward(tiny.model, ids)
    cache = hf.new_cache(tiny.model)
    prefix = hf.forward(tiny.model, ids[:, :20], cache)
    rest = hf.forward(tiny.model, ids[:, 20:], cache)
    assert cache.get_seq_length() == 24, "the cache must grow by the tokens of each forward"
    torch.testing.assert_close(torch.cat([prefix, rest], dim=1), full, rtol=1e-4, atol=1e-4)


def test_cache_crop_removes_the_last_token(tiny):
    cache = hf.new_cache(tiny.model)
    hf.forward(tiny.model, random_prompt_ids(tiny.config, 10), cache)
    cache.crop(-1)
    assert cache.get_seq_length() == 9


def test_greedy_generate_returns_exactly_the_new_tokens(tiny):
    ids = random_prompt_ids(tiny.config, 12, seed=5)
    new = hf.greedy_generate(tiny.model, ids, 9)
    assert new.shape == (1, 9)
    assert len(set(new[0].tolist())) > 1, "tiny's random init should not collapse to one repeated token"


def test_greedy_generate_ignores_eos(tiny):
    # With eos_token_id=None, transformers 5 falls back to the model's EOS and this prompt stops after 3 tokens.
    ids = random_prompt_ids(tiny.config, 38, seed=58)
    assert hf.greedy_generate(tiny.model, ids, 24).shape == (1, 24), "generate() stopped early at EOS"
