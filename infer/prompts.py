"""Benchmark prompts as token ids of exact length.

Text that "should be about 2048 tokens" never is: tokenizers disagree, chat templates add
tokens. So prompts are drawn as ids directly, seeded, avoiding the special tokens."""

import torch
from transformers import PretrainedConfig


def random_prompt_ids(config: PretrainedConfig, length: int, *, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A [batch, length] tensor of ordinary token ids, the same for the same arguments."""
    if length < 1 or batch < 1:
        raise ValueError(f"length and batch must be >= 1, got length={length}, batch={batch}")
    special = {getattr(config, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    special = {i for s in special for i in (s if isinstance(s, (list, tuple)) else [s]) if i is not None}
    allowed = torch.tensor([i for i in range(config.vocab_size) if i not in special])
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randint(len(allowed), (batch, length), generator=generator)
    return allowed[picks]
