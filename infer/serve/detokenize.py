"""Token ids to streamed text, one token at a time, without decoding the whole answer each step.

A token can hold part of a character: byte-level tokenizers split "é" into two tokens, and the
first alone decodes to the replacement character U+FFFD. So the text of the newest tokens is
decoded together with a few tokens before them (the prefix), and held back while it still ends
in a broken character. This is the scheme vLLM's incremental detokenizer uses.
"""

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # decoding starts here, for context
        self.read_offset = 0  # text up to here has been emitted

    def add(self, token_ids: list[int]) -> str:
        """Append tokens and return the text they complete (possibly "")."""
        self.ids.extend(token_ids)
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        full_text = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if full_text.endswith(REPLACEMENT_CHAR) or len(full_text) <= len(prefix_text):
            return ""  # an incomplete character (or only special tokens): wait for more
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full_text[len(prefix_text) :]
