"""What the engine tests compare against: one request alone through the course's greedy loop."""

import torch

from infer.engine.sequence import benchmark_params
from infer.generate import cached_greedy_generate
from infer.kv_cache import KVCache

greedy = benchmark_params  # temperature 0, EOS ignored: exactly max_tokens tokens


def single_request_greedy(model, prompt: list[int], max_tokens: int) -> list[int]:
    cache = KVCache.for_model(model, 1, len(prompt) + max_tokens)
    return cached_greedy_generate(model, torch.tensor(prompt), max_tokens, cache)[0].tolist()
