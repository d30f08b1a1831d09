"""Turn each sampling row's logits into a token: greedy (temperature 0), or a draw from the
temperature-scaled distribution, cut to the top-k tokens and to the top-p probability mass.

Each seeded request draws from its own `torch.Generator`, so its tokens depend on its seed and
its logits only, never on which other requests share the batch. Unseeded requests share one
generator (torch's default), as in vLLM.
"""

import torch

from infer.engine.sequence import SamplingParams


def filter_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits [vocab] with everything outside the top-k tokens and the top-p mass set to -inf.

    top-p keeps the smallest set of most likely tokens whose probabilities reach top_p; the most
    likely token always stays."""
    if 0 < top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the more likely tokens already hold top_p
        logits = logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))
    return logits


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a non-greedy request draws from: logits [vocab] scaled by its temperature,
    cut to its top-k and top-p, softmaxed (speculative decoding verifies guesses against it)."""
    return filter_top_k_top_p(logits.float() / params.temperature, params.top_k, params.top_p).softmax(-1)


class Sampler:
    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)
        self.generators: dict[str, torch.Generator] = {}  # request id -> its own seeded generator

    def add(self, request_id: str, params: SamplingParams) -> None:
        if params.seed is not None and not params.greedy:
            self.generators[request_id] = torch.Generator(self.device).manual_seed(params.seed)

    def remove(self, request_id: str) -> None:
        self.generators.pop(request_id, None)

    def sample(self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]) -> list[int]:
        """One token per row of logits [rows, vocab]; greedy rows in one argmax, others one by one."""
        tokens = logits.argmax(dim=-1)
        for row, (request_id, p) in enumerate(zip(request_ids, params)):
            if p.greedy:
                continue
            probs = sampling_probs(logits[row], p)
            tokens[row] = torch.multinomial(probs, 1, generator=self.generators.get(request_id))[0]
        return tokens.tolist()  # the one host-device sync of a step
