"""What the server accepts and what it answers: the OpenAI request fields it honours, their
checks, and the shapes of replies, stream chunks and errors (the shapes vLLM's server uses, so
that `vllm bench serve` and OpenAI clients parse them).

Every check that can fail on a client's input raises `BadRequest` with a message that names the
field and the numbers; the app turns it into a 400 with OpenAI-style error JSON. Fields that
vLLM's benchmark sends with neutral values (`repetition_penalty` 1.0, `logprobs` null, `n` 1)
are accepted; other values of them are refused by name rather than silently ignored, because
this engine does not implement them.
"""

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class BadRequest(Exception):
    """A client's mistake: answered with `status` (400, or 404 for an unknown model)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


def error_body(message: str, status: int, param: str | None = None) -> dict:
    """OpenAI's error object, as vLLM sends it: {"error": {"message", "type", "param", "code"}}."""
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "BadRequestError"),
            "param": param,
            "code": status,
        }
    }


# ---------------------------------------------------------------- requests


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """Fields both endpoints share. Unknown fields are ignored, as vLLM and OpenAI do."""

    model_config = ConfigDict(extra="ignore", strict=False)

    model: str | None = None
    max_tokens: int | None = Field(default=None)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = Field(default_factory=list)
    repetition_penalty: float = 1.0
    logprobs: Any = None
    n: int = 1

    @field_validator("top_k")
    @classmethod
    def _top_k_off(cls, value: int) -> int:
        return 0 if value == -1 else value  # vLLM and OpenAI clients write "off" as -1

    def check_supported(self) -> None:
        if self.repetition_penalty != 1.0:
            raise BadRequest(
                f"repetition_penalty {self.repetition_penalty} is not supported by this engine (only 1.0, no penalty)",
                param="repetition_penalty",
            )
        if self.logprobs not in (None, False, 0):
            raise BadRequest(
                f"logprobs={self.logprobs!r} is not supported by this engine (only null)", param="logprobs"
            )
        if self.n != 1:
            raise BadRequest(f"n={self.n} is not supported by this engine (only 1 completion per prompt)", param="n")

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    # A text, a list of token ids, or a list of either (several prompts, one choice each).
    prompt: str | list[int] | list[str] | list[list[int]]

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list, one per choice."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if self.prompt and isinstance(self.prompt[0], int):
            return [self.prompt]
        return list(self.prompt)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None  # the newer name of max_tokens


def parse_request(raw: bytes, schema: type[SamplingFields]) -> SamplingFields:
    """Decode and check a request body; any problem raises BadRequest that says what and where."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:  # the decoder recurses once per level of nesting
        raise BadRequest("the request body nests JSON arrays or objects too deeply to decode") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        request = schema.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        given = "" if first["type"] == "missing" else f" (got {json.dumps(first.get('input'))[:80]})"
        raise BadRequest(f"{where}: {first['msg']}{given}", param=where) from None
    request.check_supported()
    return request


# ---------------------------------------------------------------- replies


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_chunk(request_id: str, model: str, index: int, text: str, finish_reason: str | None) -> dict:
    """One streamed piece of a completion: `choices[0].text` is what `vllm bench serve` reads."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}],
    }


def chat_chunk(request_id: str, model: str, index: int, delta: dict, finish_reason: str | None) -> dict:
    return {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def usage_chunk(request_id: str, model: str, obj: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """The last message of a stream with include_usage: empty choices, then the token counts."""
    return {
        "id": request_id,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def sse(message: dict | str) -> str:
    """One server-sent event: `data: <json>` and a blank line."""
    return f"data: {message if isinstance(message, str) else json.dumps(message, separators=(',', ':'))}\n\n"


SSE_DONE = sse("[DONE]")
