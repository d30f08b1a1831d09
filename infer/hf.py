"""The few `transformers` APIs the course leans on, in one place, because they move between
releases (5.x renames `past_key_values` to `cache`). tests/test_hf.py pins their behaviour."""

import copy
import inspect

import torch
from transformers import DynamicCache, GenerationConfig


def new_cache(model) -> DynamicCache:
    return DynamicCache(config=model.config)


def forward(
    model, input_ids: torch.Tensor, cache: DynamicCache | None = None, *, last_only: bool = False
) -> torch.Tensor:
    """Logits [batch, seq, vocab] of one forward pass; with a cache, its K/V are read and extended.

    `last_only=True` runs the output head on the last position only ([batch, 1, vocab]), as a
    server's prefill does: only that row picks the next token."""
    rows = {"logits_to_keep": 1} if last_only else {}
    if cache is None:
        return model(input_ids, use_cache=False, **rows).logits
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return model(input_ids, use_cache=True, **{name: cache}, **rows).logits


# Every generation field that could change a greedy choice, set to its plain value. `generate()`
# fills each field left unset from the model's own generation_config, and pretrained checkpoints
# set some (Qwen2.5-Instruct: repetition_penalty=1.1, which pushes the argmax away from tokens
# already seen). The sampling settings, unused by greedy, are transformers' own defaults: a
# checkpoint's (Qwen's temperature 0.7, top_k 20, top_p 0.8) would only draw warnings.
PLAIN_GREEDY = dict(
    do_sample=False,
    num_beams=1,
    repetition_penalty=1.0,
    encoder_repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    encoder_no_repeat_ngram_size=0,
    min_new_tokens=0,
    suppress_tokens=[],
    begin_suppress_tokens=[],
    temperature=1.0,
    top_k=50,
    top_p=1.0,
)


@torch.no_grad()
def greedy_generate(model, prompt_ids: torch.Tensor, max_new_tokens: int, streamer=None) -> torch.Tensor:
    """`transformers`' own greedy `generate()`, returning only the new tokens [batch, max_new_tokens].

    Plain greedy whatever the checkpoint's generation_config says (PLAIN_GREEDY). End-of-sequence
    is disabled so that exactly `max_new_tokens` come back: random-weight models emit EOS by
    chance, and a comparison needs equal lengths. It takes an empty list: transformers 5 replaces
    `eos_token_id=None` with the model's own EOS id. A `streamer` sees every token."""
    config = GenerationConfig(**PLAIN_GREEDY, max_new_tokens=max_new_tokens, eos_token_id=[], pad_token_id=0)
    out = model.generate(
        prompt_ids, attention_mask=torch.ones_like(prompt_ids), generation_config=config, streamer=streamer
    )
    return out[:, prompt_ids.shape[1] :]


def float32_copy(model):
    """`model` itself when it is float32, else a float32 copy of it (on the same device).

    Token-for-token comparisons with `greedy_generate` run in float32: in bf16 a cached and an
    uncached path (or two implementations) round differently, and with random weights a near-tie
    argmax can flip without any bug."""
    return model if next(model.parameters()).dtype == torch.float32 else copy.deepcopy(model).float()
