"""The OpenAI-compatible HTTP API over the engine (FastAPI; streams are server-sent events).

    POST /v1/completions        prompt as text or token ids, or a list of them; stream or not
    POST /v1/chat/completions   messages through the chat template (chat.py); stream or not
    GET  /v1/models             the one model served
    GET  /health                200 while the engine loop runs
    GET  /metrics               Prometheus text (metrics.py)

A request is parsed and checked (protocol.py), its prompts go to the engine (engine_client.py:
a thread of this process, or the engine core's own process), and its replies are read from one
asyncio queue that the engine side fills after every step. When a
client disconnects, the response stops (Starlette cancels a stream on disconnect; a non-streamed
request watches for it) and the `finally` aborts whatever is unfinished: the engine frees the
slot before its next step. Bad input is answered with a 4xx and OpenAI-style error JSON; a dead
engine with 503, to requests in flight and after (a stream ends with an error event of code 503);
a step that failed for a request (the engine goes on) with a 500 in the same JSON.
"""

import asyncio
import logging
import time
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from infer.engine import SamplingParams
from infer.serve import protocol
from infer.serve.chat import chat_prompt_ids
from infer.serve.detokenize import IncrementalDetokenizer
from infer.serve.engine_client import Delivery, EngineClient, EngineUnavailable, RequestFailed
from infer.serve.metrics import ServerMetrics
from infer.serve.protocol import BadRequest, ChatCompletionRequest, CompletionRequest

COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
logger = logging.getLogger("infer.serve")


@dataclass
class Served:
    """What the handlers need: the engine (in a thread or its own process), the tokenizer, and the
    model's name and limits."""

    engine: EngineClient
    tokenizer: object
    model_name: str
    max_model_len: int
    metrics: ServerMetrics


def build_app(served: Served) -> FastAPI:
    app = FastAPI(title="infer: the course engine's OpenAI-compatible server")
    app.state.served = served

    @app.exception_handler(BadRequest)
    async def bad_request(_: Request, exc: BadRequest):
        return JSONResponse(protocol.error_body(exc.message, exc.status, exc.param), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException):  # unknown path, wrong method
        return JSONResponse(protocol.error_body(str(exc.detail), exc.status_code), status_code=exc.status_code)

    @app.exception_handler(EngineUnavailable)
    async def engine_gone(_: Request, exc: EngineUnavailable):
        return JSONResponse(protocol.error_body(str(exc), 503), status_code=503)

    @app.exception_handler(RequestFailed)
    async def request_failed(_: Request, exc: RequestFailed):
        return JSONResponse(protocol.error_body(str(exc), 500), status_code=500)

    @app.exception_handler(ClientDisconnect)
    async def client_left(request: Request, _: ClientDisconnect):  # one log line, not a traceback
        logger.info("client left before sending the whole request: %s %s", request.method, request.url.path)
        return Response(status_code=400)  # nobody is there to read it

    @app.get("/health")
    async def health():
        engine = served.engine
        if not engine.alive:
            return JSONResponse(protocol.error_body(f"the engine stopped: {engine.error}", 503), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        return Response(served.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": served.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "infer",
                    "max_model_len": served.max_model_len,
                }
            ],
        }

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = protocol.parse_request(await request.body(), CompletionRequest)
        check_model(served, body.model)
        prompts = [prompt_ids(served, p, i) for i, p in enumerate(body.prompts())]
        if not prompts:
            raise BadRequest("prompt: the list of prompts is empty", param="prompt")
        params = sampling_params(
            body, body.max_tokens if body.max_tokens is not None else COMPLETION_DEFAULT_MAX_TOKENS
        )
        return await respond(request, served, body, prompts, params, CompletionStyle(served.model_name))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = protocol.parse_request(await request.body(), ChatCompletionRequest)
        check_model(served, body.model)
        prompt = chat_prompt_ids(served.tokenizer, [m.model_dump() for m in body.messages])
        max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        if max_tokens is None:  # vLLM's default for chat: whatever room the context has left
            max_tokens = max(1, served.max_model_len - len(prompt))
        return await respond(
            request, served, body, [prompt], sampling_params(body, max_tokens), ChatStyle(served.model_name)
        )

    return app


def check_model(served: Served, model: str | None) -> None:
    if model is not None and model != served.model_name:
        raise BadRequest(
            f"The model `{model}` does not exist. This server serves `{served.model_name}` (GET /v1/models).",
            status=404,
            param="model",
        )


def prompt_ids(served: Served, prompt: str | list[int], index: int) -> list[int]:
    ids = served.tokenizer.encode(prompt, add_special_tokens=False) if isinstance(prompt, str) else list(prompt)
    if not ids:
        raise BadRequest(f"prompt {index} is empty: a request needs at least one prompt token", param="prompt")
    return ids


def sampling_params(body: protocol.SamplingFields, max_tokens: int) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        top_k=body.top_k,
        seed=body.seed,
        ignore_eos=body.ignore_eos,
        stop_token_ids=tuple(body.stop_token_ids),
    )


# ---------------------------------------------------------------- answering


class CompletionStyle:
    """How /v1/completions words its stream and its reply."""

    object_chunk, object_reply, id_prefix = "text_completion", "text_completion", "cmpl"

    def __init__(self, model: str):
        self.model = model

    def chunk(self, request_id: str, index: int, text: str, finish_reason: str | None, first: bool) -> dict:
        return protocol.completion_chunk(request_id, self.model, index, text, finish_reason)

    def choice(self, index: int, text: str, finish_reason: str) -> dict:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


class ChatStyle(CompletionStyle):
    """/v1/chat/completions: text goes in `delta.content`, and the first delta names the role."""

    object_chunk, object_reply, id_prefix = "chat.completion.chunk", "chat.completion", "chatcmpl"

    def chunk(self, request_id, index, text, finish_reason, first):
        delta = {"role": "assistant", "content": text} if first else {"content": text}
        return protocol.chat_chunk(request_id, self.model, index, delta, finish_reason)

    def choice(self, index, text, finish_reason):
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }


async def respond(
    request: Request,
    served: Served,
    body: protocol.SamplingFields,
    prompts: list[list[int]],
    params: SamplingParams,
    style: CompletionStyle,
):
    """Queue the prompts (one engine request per choice), then stream or collect their tokens."""
    request_id = protocol.new_id(style.id_prefix)
    queue: asyncio.Queue = asyncio.Queue()
    engine_ids: list[str] = []
    try:
        for index, ids in enumerate(prompts):
            engine_ids.append(await served.engine.add(ids, params, queue, f"{request_id}-{index}"))
    except (ValueError, EngineUnavailable) as exc:  # ValueError: the engine's own checks (lengths, vocabulary, ...)
        for engine_id in engine_ids:
            served.engine.abort(engine_id)
        if isinstance(exc, EngineUnavailable):
            raise
        raise BadRequest(str(exc)) from None
    answer = Answer(served, style, request_id, engine_ids, prompts, queue)
    if body.stream:
        return StreamingResponse(answer.stream(body.include_usage), media_type="text/event-stream")
    return await answer.collect(request)


class Answer:
    """One HTTP request's choices as their tokens come back from the engine."""

    def __init__(
        self,
        served: Served,
        style: CompletionStyle,
        request_id: str,
        engine_ids: list[str],
        prompts: list[list[int]],
        queue: asyncio.Queue,
    ):
        self.served, self.style, self.request_id, self.queue = served, style, request_id, queue
        self.engine_ids = engine_ids
        self.index = {engine_id: i for i, engine_id in enumerate(engine_ids)}
        self.prompt_tokens = sum(len(p) for p in prompts)
        self.detokenizers = [IncrementalDetokenizer(served.tokenizer) for _ in prompts]
        self.texts = ["" for _ in prompts]
        self.completion_tokens = 0
        self.finish_reasons: list[str | None] = [None] * len(prompts)

    async def deliveries(self):
        """Yield (choice index, new text, finish reason or None, first?) until every choice ends."""
        unfinished = len(self.engine_ids)
        while unfinished:
            item = await self.queue.get()
            if isinstance(item, EngineUnavailable):
                raise item
            if isinstance(item, BaseException):  # the engine thread's own exception: it has stopped
                raise EngineUnavailable(f"the engine stopped: {type(item).__name__}: {item}")
            delivery: Delivery = item
            out = delivery.output
            if out.finish_reason == "error":
                raise RequestFailed(out.error)
            index = self.index[out.request_id]
            first = not self.detokenizers[index].ids
            started = time.perf_counter()
            text = self.detokenizers[index].add(out.new_token_ids)
            self.served.metrics.frontend_seconds["detokenize"].inc(time.perf_counter() - started)
            self.texts[index] += text
            self.completion_tokens += len(out.new_token_ids)
            if out.finished:
                unfinished -= 1
                self.finish_reasons[index] = out.finish_reason
            yield index, text, out.finish_reason if out.finished else None, first

    def abort_unfinished(self) -> None:
        for engine_id in self.engine_ids:
            self.served.engine.abort(engine_id)  # a no-op for a finished request

    async def stream(self, include_usage: bool):
        metrics = self.served.metrics
        metrics.open_streams.inc()
        try:
            try:
                sse_seconds = metrics.frontend_seconds["sse"]
                async for index, text, reason, first in self.deliveries():
                    started = time.perf_counter()
                    chunk = protocol.sse(self.style.chunk(self.request_id, index, text, reason, first))
                    sse_seconds.inc(time.perf_counter() - started)
                    yield chunk
            except (EngineUnavailable, RequestFailed) as exc:
                status = 503 if isinstance(exc, EngineUnavailable) else 500
                yield protocol.sse(protocol.error_body(str(exc), status))
                yield protocol.SSE_DONE
                return
            if include_usage:
                yield protocol.sse(
                    protocol.usage_chunk(
                        self.request_id,
                        self.style.model,
                        self.style.object_chunk,
                        self.prompt_tokens,
                        self.completion_tokens,
                    )
                )
            yield protocol.SSE_DONE
        finally:  # normal end, client gone (cancelled), or error: nothing may keep running
            self.abort_unfinished()
            metrics.open_streams.dec()

    async def collect(self, request: Request):
        async def drain():
            async for _ in self.deliveries():
                pass

        collecting = asyncio.ensure_future(drain())
        watching = asyncio.ensure_future(wait_for_disconnect(request))
        try:
            await asyncio.wait({collecting, watching}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
            if not collecting.done():
                collecting.cancel()
            self.abort_unfinished()
        if not collecting.done() or collecting.cancelled():
            return Response(status_code=499)  # the client left; nobody reads this
        collecting.result()  # re-raises a dead engine (503) or a failed step (500)
        choices = [
            self.style.choice(i, text, reason) for i, (text, reason) in enumerate(zip(self.texts, self.finish_reasons))
        ]
        return {
            "id": self.request_id,
            "object": self.style.object_reply,
            "created": int(time.time()),
            "model": self.style.model,
            "choices": choices,
            "usage": protocol.usage(self.prompt_tokens, self.completion_tokens),
        }


async def wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
