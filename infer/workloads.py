"""Benchmark workloads as exact token counts, and when each request is sent.

A `Workload` is prompts (token ids, never text that "should be about N tokens"), the number of
tokens each request must generate, and each request's send time in seconds from the start.

`arrival_offsets` draws send times as vLLM 0.32's `vllm bench serve` does (its `get_request`):
gaps from a gamma distribution of shape `burstiness` and mean 1 / rate (burstiness 1 is a Poisson
process; lower is burstier, higher more regular, infinite is evenly spaced), summed, then
rescaled so that the last request leaves at exactly num_requests / rate, which vLLM does so that
different seeds give the same average rate. An infinite rate sends everything at 0.
"""

import math
import random
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Workload:
    name: str
    prompts: list[list[int]]
    output_lens: list[int]
    offsets: list[float] = field(default=None)  # send times in seconds; None: all at once

    def __post_init__(self):
        if self.offsets is None:
            object.__setattr__(self, "offsets", [0.0] * len(self.prompts))
        if not len(self.prompts) == len(self.output_lens) == len(self.offsets):
            raise ValueError(
                f"{len(self.prompts)} prompts, {len(self.output_lens)} output lengths and "
                f"{len(self.offsets)} offsets: give one of each per request"
            )

    @property
    def prompt_lens(self) -> list[int]:
        return [len(p) for p in self.prompts]

    @property
    def max_model_len(self) -> int:
        """The longest request, prompt and output together."""
        return max(len(p) + n for p, n in zip(self.prompts, self.output_lens))


def random_prompt(rng: random.Random, length: int, vocab_size: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(length)]


def mixed_workload(
    name: str,
    vocab_size: int,
    num_requests: int,
    prompt_range: tuple[int, int],
    output_range: tuple[int, int],
    *,
    seed: int = 0,
    request_rate: float = math.inf,
) -> Workload:
    """Prompt and output lengths uniform in their (inclusive) ranges, sent at `request_rate` per
    second (Poisson arrivals; inf: all at once)."""
    rng = random.Random(seed)
    prompts = [random_prompt(rng, rng.randint(*prompt_range), vocab_size) for _ in range(num_requests)]
    outputs = [rng.randint(*output_range) for _ in range(num_requests)]
    return Workload(name, prompts, outputs, arrival_offsets(num_requests, request_rate, seed=seed))


def arrival_offsets(
    num_requests: int, request_rate: float = math.inf, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """When each request leaves, in seconds from the start, as vLLM 0.32 schedules them."""
    if num_requests < 1:
        raise ValueError(f"num_requests must be >= 1, got {num_requests}")
    if not request_rate > 0:
        raise ValueError(f"request_rate must be > 0 requests/s (inf: all at once), got {request_rate}")
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0 (1.0 is a Poisson process), got {burstiness}")
    if math.isinf(request_rate):
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps = np.full(num_requests, 1.0 / request_rate)
    else:
        gaps = np.random.default_rng(seed).gamma(
            shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests
        )
    offsets = np.cumsum(gaps)
    return (offsets * (num_requests / request_rate) / offsets[-1]).tolist()
