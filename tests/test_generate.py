"""Greedy generation with the hand-written caches: token-identical to transformers' generate()."""

import matplotlib
import pytest
import torch

from infer import hf
from infer.experiments import cache_speed
from infer.generate import cached_greedy_generate
from infer.kv_cache import ConcatKVCache, KVCache
from infer.model import Transformer
from infer.prompts import random_prompt_ids

NEW_TOKENS = 16


@pytest.fixture(scope="module")
def models(tiny):
    return tiny.model, Transformer.from_hf(tiny.model)


def test_cached_generation_is_token_identical_to_generate_on_20_random_prompts(models):
    hf_model, ours = models
    lengths = [1, 2, 3, 5, 8, 11, 16, 23, 31, 40, 47, 55, 64, 77, 90, 101, 128, 150, 200, 255]
    for seed, length in enumerate(lengths):
        prompt = random_prompt_ids(hf_model.config, length, seed=100 + seed)
        expected = hf.greedy_generate(hf_model, prompt, NEW_TOKENS)
        for label, cache in (
            ("preallocated", KVCache.for_model(ours, 1, length + NEW_TOKENS)),
            ("growing", ConcatKVCache.for_model(ours)),
        ):
            got = cached_greedy_generate(ours, prompt, NEW_TOKENS, cache)
            assert got.shape == (1, NEW_TOKENS), f"expected [1, {NEW_TOKENS}] new tokens, got {tuple(got.shape)}"
            assert torch.equal(got, expected), (
                f"{label} cache, {length}-token prompt (seed {100 + seed}): {got.tolist()} vs generate() "
                f"{expected.tolist()}; after the prefill each step must feed the LAST token at position n + i - 1"
            )


def test_reference_always_returns_the_asked_number_of_tokens(models):
    hf_model, _ = models
    for seed in range(8):  # random weights emit the EOS id by chance; the reference must not stop there
        prompt = random_prompt_ids(hf_model.config, 30, seed=seed)
        assert hf.greedy_generate(hf_model, prompt, 24).shape == (1, 24)
    assert hf_model.generation_config.eos_token_id is not None, "the model's own EOS must be restored afterwards"


def test_another_slot_and_timestamps(models):
    hf_model, ours = models
    prompt = random_prompt_ids(hf_model.config, 12, seed=7)
    cache = KVCache.for_model(ours, 4, 32)
    stamps: list[float] = []
    got = cached_greedy_generate(ours, prompt, 6, cache, seq_id=3, timestamps=stamps)
    assert torch.equal(got, hf.greedy_generate(hf_model, prompt, 6))
    assert cache.lengths == [0, 0, 0, 17], "slot 3 holds the prompt and 5 fed-back tokens; the others stay empty"
    assert len(stamps) == 6 and stamps == sorted(stamps)
    with pytest.raises(ValueError, match="one sequence"):
        cached_greedy_generate(ours, torch.zeros(2, 4, dtype=torch.long), 3, cache)


def test_race_shapes_and_ratios(models):
    hf_model, ours = models
    prompt = random_prompt_ids(hf_model.config, 8, seed=0)
    lens = (2, 4)
    timings = cache_speed.race(cache_speed.generation_loops(hf_model, ours), prompt, lens, repeats=1, progress=False)
    assert set(timings) == {cache_speed.NAIVE, cache_speed.GROWING, cache_speed.PREALLOCATED, cache_speed.GENERATE}
    assert all(len(series) == len(lens) for series in timings.values())
    assert "preallocated / generate()" in cache_speed.format_race(lens, timings)
    fig, ax = matplotlib.pyplot.subplots()
    cache_speed.plot_race(ax, lens, timings)
    assert len(ax.lines) >= 4
