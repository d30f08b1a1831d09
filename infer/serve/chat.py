"""Chat messages to prompt tokens: the tokenizer's own chat template when it has one (every
instruct model ships one), else a plain documented template for the course's random models.

The plain template writes each message as `<role>: <content>` on its own line after the BOS
token, and ends with `assistant: ` so that the model continues as the assistant:

    <|bos|>system: Be brief.
    user: Hi
    assistant:

`export.py` saves it with the random model's tokenizer, so that vLLM serving the exported folder
builds exactly the same prompt.
"""

PLAIN_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def with_chat_template(tokenizer):
    """`tokenizer`, given the plain template if it has none of its own."""
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    return tokenizer


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt token ids of a conversation, ready for the assistant's turn."""
    text = with_chat_template(tokenizer).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)
