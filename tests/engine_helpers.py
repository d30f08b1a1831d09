"""What the engine tests compare against: one request alone through the course's greedy loop."""

import torch

from infer.engine import SamplingParams
from infer.generate import cached_greedy_generate
from infer.kv_cache import KVCache


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def single_request_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    cache = KVCache.for_model(model, 1, len(prompt) + max_tokens)
    return cached_greedy_generate(model, torch.tensor(prompt), max_tokens, cache)[0].tolist()
