"""A tokenizer that needs no download, for models with random weights.

Bytes map to token ids 0-255, so any text round-trips. The special tokens sit at the ids the
model config names; every other id up to the vocabulary size decodes to a visible placeholder
such as `<|id:4711|>`, which is what a random-weight model mostly produces."""

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

BYTE_TOKENS = 256


def byte_level_tokenizer(
    vocab_size: int, bos_id: int, eos_id: int, pad_id: int | None = None
) -> PreTrainedTokenizerFast:
    specials = {bos_id: "<|bos|>", eos_id: "<|eos|>"}
    if pad_id is not None:
        specials[pad_id] = "<|pad|>"
    if min(specials) < BYTE_TOKENS or max(specials) >= vocab_size:
        raise ValueError(f"special token ids {sorted(specials)} must lie in [{BYTE_TOKENS}, {vocab_size})")

    byte_alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(byte_alphabet)}
    for token_id in range(BYTE_TOKENS, vocab_size):
        vocab[specials.get(token_id, f"<|id:{token_id}|>")] = token_id

    # BPE without merges splits every word into single bytes: exactly byte-level tokenization.
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=specials[bos_id],
        eos_token=specials[eos_id],
        pad_token=specials.get(pad_id, specials[eos_id]),
    )


def _byte_of(char: str) -> int:
    """Inverse of GPT-2's byte-to-unicode table, which the ByteLevel pre-tokenizer uses."""
    code = ord(char)
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]
