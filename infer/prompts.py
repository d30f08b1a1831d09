"""Benchmark prompts as token ids of exact length.

Text that "should be about 2048 tokens" never is: tokenizers disagree, chat templates add
tokens. So prompts are drawn as ids directly, seeded, avoiding the special tokens."""

import torch
from transformers import PretrainedConfig


def random_prompt_ids(config: PretrainedConfig, length: int, *, batch: int = 1, seed: int = 0) -> torch.Tensor:
    """A [batch, length] tensor of ordinary token ids, the same for the same arguments.

    Drawn on the host by the CPU generator, so that every machine draws the same ids: move them to
    the model's device (`.to(lm.device)`) before a forward pass."""
    if length < 1 or batch < 1:
        raise ValueError(f"length and batch must be >= 1, got length={length}, batch={batch}")
    special = {getattr(config, key, None) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    special = {i for s in special for i in (s if isinstance(s, (list, tuple)) else [s]) if i is not None}
    special = sorted(i for i in special if i < config.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(config.vocab_size - len(special), (batch, length), generator=generator, device="cpu")
    for token in special:  # the k-th draw becomes the k-th ordinary id: step over each special id in turn
        ids += ids >= token
    return ids
