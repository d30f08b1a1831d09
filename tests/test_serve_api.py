"""infer.serve: the server's endpoints, reply shapes and errors, over real HTTP on 127.0.0.1.

Every request of the bad-request corpus gets its 4xx, OpenAI-style error JSON and a message that
names what was wrong; none gets a 500, and the server keeps serving afterwards."""

import concurrent.futures
import json
import logging
import socket
import time

import httpx
import pytest
import torch

from infer import hf
from infer.serve.metrics import read_metrics
from infer.serve.server import EngineSettings, start_server

MAX_MODEL_LEN = 512


@pytest.fixture(scope="module", params=[True, False], ids=["engine process", "engine thread"])
def server(tiny, request):
    """The server with its engine core in a process of its own (the default), then in a thread."""
    settings = EngineSettings(
        max_num_seqs=4, max_num_batched_tokens=512, max_model_len=MAX_MODEL_LEN, engine_process=request.param
    )
    with start_server(tiny, settings, model_name="tiny") as running:
        yield running


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def stream_messages(http, path: str, body: dict) -> list:
    """Every `data:` payload of a streamed reply, JSON-decoded except the final [DONE]."""
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    return [p if p == "[DONE]" else json.loads(p) for p in payloads]


def wait_until_idle(http, timeout_s: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        gauges = read_metrics(http.get("/metrics").text)
        idle = (
            gauges["infer:num_requests_running"] == 0
            and gauges["infer:num_requests_waiting"] == 0
            and gauges["infer:kv_cache_usage_perc"] == 0
            and gauges["infer:num_open_responses"] == 0
        )
        if idle or time.monotonic() > deadline:
            return gauges
        time.sleep(0.05)


# ---------------------------------------------------------------- what works


def test_models_and_health(http):
    assert http.get("/health").status_code == 200
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_completion_streams_what_vllm_bench_serve_parses(http):
    body = {
        "model": "tiny",
        "prompt": [5, 6, 7, 8],
        "max_tokens": 6,
        "ignore_eos": True,
        "temperature": 0.0,
        "repetition_penalty": 1.0,
        "logprobs": None,
        "stream_options": {"include_usage": True},
    }
    messages = stream_messages(http, "/v1/completions", body)
    assert messages[-1] == "[DONE]"
    usage = messages[-2]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    chunks = messages[:-2]
    assert len(chunks) == 6  # one chunk per token: vLLM's client measures ITL per chunk
    assert all(isinstance(c["choices"][0]["text"], str) for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]


def test_greedy_text_is_transformers_greedy_generate(http, tiny):
    prompt = [17, 300, 42, 99, 511, 7]
    expected = hf.greedy_generate(tiny.model, torch.tensor([prompt]), 12)[0].tolist()
    reply = http.post(
        "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    ).json()
    assert reply["choices"][0]["text"] == tiny.tokenizer.decode(expected, skip_special_tokens=True)
    assert reply["usage"]["completion_tokens"] == 12


def test_text_prompt_and_a_list_of_prompts(http, tiny):
    reply = http.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 3, "ignore_eos": True}).json()
    assert reply["usage"]["prompt_tokens"] == len(tiny.tokenizer.encode("Hello", add_special_tokens=False))
    reply = http.post(
        "/v1/completions", json={"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 3, "ignore_eos": True}
    ).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert reply["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    streamed = stream_messages(http, "/v1/completions", {"prompt": ["ab", "cd"], "max_tokens": 4, "ignore_eos": True})
    indexes = [m["choices"][0]["index"] for m in streamed[:-1]]
    assert sorted(indexes) == [0] * 4 + [1] * 4


def test_chat_uses_the_template_and_streams_deltas(http, tiny):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    reply = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "ignore_eos": True}).json()
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant"
    template_text = "<|bos|>system: Be brief.\nuser: Hi\nassistant: "
    assert reply["usage"]["prompt_tokens"] == len(tiny.tokenizer.encode(template_text, add_special_tokens=False))
    streamed = stream_messages(
        http, "/v1/chat/completions", {"messages": messages, "max_tokens": 4, "ignore_eos": True}
    )
    deltas = [m["choices"][0]["delta"] for m in streamed[:-1]]
    assert deltas[0]["role"] == "assistant" and len(deltas) == 4


def test_a_disconnected_stream_frees_its_slot_at_once(http, server):
    with http.stream(
        "POST", "/v1/completions", json={"prompt": [3] * 8, "max_tokens": 400, "ignore_eos": True, "stream": True}
    ) as response:
        lines = response.iter_lines()
        while not next(lines).startswith("data: "):
            pass
        assert read_metrics(http.get("/metrics").text)["infer:num_requests_running"] == 1
    gauges = wait_until_idle(http)
    assert gauges["infer:num_requests_running"] == 0 and gauges["infer:kv_cache_usage_perc"] == 0
    assert gauges["infer:num_open_responses"] == 0
    assert 'finished_reason="abort"' in http.get("/metrics").text


# ---------------------------------------------------------------- the bad-request corpus

TOO_LONG = list(range(10, 10 + MAX_MODEL_LEN - 10))

BAD_REQUESTS = [
    # (name, path, raw body or JSON, status, words the message must contain)
    ("malformed JSON", "/v1/completions", b'{"prompt": "x",', 400, ["not valid JSON"]),
    (
        "JSON nested 5,000 deep",
        "/v1/completions",
        b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        400,
        ["too deeply"],
    ),
    ("not an object", "/v1/completions", [1, 2], 400, ["JSON object"]),
    ("missing prompt", "/v1/completions", {"max_tokens": 3}, 400, ["prompt", "required"]),
    ("prompt of the wrong type", "/v1/completions", {"prompt": 123}, 400, ["prompt"]),
    ("empty text prompt", "/v1/completions", {"prompt": ""}, 400, ["empty"]),
    ("empty token prompt", "/v1/completions", {"prompt": []}, 400, ["empty"]),
    ("empty prompt in a list", "/v1/completions", {"prompt": [[1, 2], []]}, 400, ["prompt 1", "empty"]),
    ("max_tokens -3", "/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, ["max_tokens", "-3"]),
    ("max_tokens 0", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, ["max_tokens", "0"]),
    ("max_tokens not a number", "/v1/completions", {"prompt": "x", "max_tokens": "many"}, 400, ["max_tokens", "many"]),
    ("negative temperature", "/v1/completions", {"prompt": "x", "temperature": -0.5}, 400, ["temperature", "-0.5"]),
    ("top_p 0", "/v1/completions", {"prompt": "x", "top_p": 0}, 400, ["top_p", "0"]),
    ("stream not a boolean", "/v1/completions", {"prompt": "x", "stream": "sometimes"}, 400, ["stream"]),
    ("token id outside the vocabulary", "/v1/completions", {"prompt": [1, 5000]}, 400, ["5000", "1024"]),
    (
        "prompt too long",
        "/v1/completions",
        {"prompt": TOO_LONG, "max_tokens": 16},
        400,
        [str(MAX_MODEL_LEN), str(len(TOO_LONG) + 16), str(len(TOO_LONG))],
    ),
    ("repetition penalty", "/v1/completions", {"prompt": "x", "repetition_penalty": 1.2}, 400, ["repetition_penalty"]),
    ("logprobs", "/v1/completions", {"prompt": "x", "logprobs": 5}, 400, ["logprobs"]),
    ("several completions", "/v1/completions", {"prompt": "x", "n": 2}, 400, ["n=2"]),
    ("unknown model", "/v1/completions", {"prompt": "x", "model": "gpt-9"}, 404, ["gpt-9", "does not exist"]),
    ("chat without messages", "/v1/chat/completions", {"max_tokens": 2}, 400, ["messages"]),
    ("chat with no message", "/v1/chat/completions", {"messages": []}, 400, ["messages"]),
    (
        "chat with an unknown role",
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "x"}]},
        400,
        ["role"],
    ),
    (
        "chat with an unknown model",
        "/v1/chat/completions",
        {"model": "x", "messages": [{"role": "user", "content": "x"}]},
        404,
        ["does not exist"],
    ),
]


@pytest.mark.parametrize("name,path,body,status,words", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_request_gets_its_status_and_a_message(http, name, path, body, status, words):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post(path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"] in ("BadRequestError", "NotFoundError")
    for word in words:
        assert word in error["message"], f"{name}: {word!r} not in {error['message']!r}"


def test_unknown_path_and_wrong_method_get_openai_errors(http):
    assert http.get("/v1/nothing").json()["error"]["code"] == 404
    assert http.get("/v1/completions").json()["error"]["code"] == 405


def test_the_server_still_serves_after_the_corpus(http):
    for _, path, body, _, _ in BAD_REQUESTS:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        assert http.post(path, content=content).status_code < 500
    assert http.get("/health").status_code == 200
    reply = http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2, "ignore_eos": True})
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 2
    assert wait_until_idle(http)["infer:num_requests_running"] == 0


def test_metrics_show_preemptions_and_prefix_hits_of_a_paged_store_under_pressure(tiny):
    """Eight concurrent requests sharing a 64-token beginning, in a pool with room for about three."""
    settings = EngineSettings(
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=128,
        kv_store="paged",
        num_kv_blocks=16,
        block_size=16,
        enable_prefix_caching=True,
    )
    shared = list(range(10, 74))
    with (
        start_server(tiny, settings, model_name="tiny") as running,
        httpx.Client(base_url=running.url, timeout=120) as http,
    ):
        http.post(
            "/v1/completions", json={"model": "tiny", "prompt": shared + [5], "max_tokens": 2}
        )  # caches the beginning
        bodies = [
            {"model": "tiny", "prompt": shared + [100 + i], "max_tokens": 48, "ignore_eos": True} for i in range(8)
        ]
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda body: http.post("/v1/completions", json=body), bodies))
        assert all(r.status_code == 200 for r in replies), [r.text for r in replies if r.status_code != 200]
        gauges = read_metrics(http.get("/metrics").text)
    assert gauges["infer:num_preemptions_total"] > 0, "a pool of 16 blocks for 8 requests of 7 blocks each must preempt"
    assert gauges["infer:prefix_cache_hit_rate"] > 0.5, "the shared 64 tokens (4 blocks) should be found in the cache"
    assert gauges["infer:kv_cache_usage_perc"] == 0


def test_a_client_that_leaves_mid_request_costs_one_log_line(server, http):
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append  # the server's own logger, whatever the test runner does with the root logger
    server_logger = logging.getLogger("infer.serve")
    server_logger.addHandler(handler)
    server_logger.setLevel(logging.INFO)
    host, port = server.url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n" + b'{"prompt": '
            )  # 11 of the 100 bytes announced
            time.sleep(0.5)  # the server is waiting for the rest when the client goes
        deadline = time.time() + 10
        while not records and time.time() < deadline:
            time.sleep(0.05)
    finally:
        server_logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == ["client left before sending the whole request: POST /v1/completions"]
    assert not any(r.exc_info for r in records), "a client that disconnects is not a server error: no traceback"
    assert http.get("/health").status_code == 200
