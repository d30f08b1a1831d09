"""Pins the transformers behaviour the course depends on (these APIs move between releases)."""

import torch

from infer import hf
from infer.generate import naive_greedy_generate
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


def test_greedy_generate_stays_plain_greedy_whatever_the_checkpoint_asks(tiny, monkeypatch):
    """A pretrained generation_config (Qwen2.5-Instruct's repetition_penalty=1.1, sampling settings)
    must not leak into greedy_generate: every "token-identical to generate()" check relies on it."""
    ids = random_prompt_ids(tiny.config, 10, seed=3)
    plain = naive_greedy_generate(tiny.model, ids, 16)
    for field, value in dict(
        repetition_penalty=1.5,
        no_repeat_ngram_size=2,
        min_new_tokens=20,
        do_sample=True,
        temperature=0.7,
        top_k=20,
        top_p=0.8,
        num_beams=2,
        suppress_tokens=plain[0, :3].tolist(),
        begin_suppress_tokens=plain[0, :1].tolist(),
    ).items():
        monkeypatch.setattr(tiny.model.generation_config, field, value)
    assert torch.equal(hf.greedy_generate(tiny.model, ids, 16), plain), (
        "greedy_generate picked up the model's generation_config: set the field in hf.PLAIN_GREEDY"
    )
