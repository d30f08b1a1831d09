"""The server never dies of a request (issue 29):
- six ordinary requests that made a prefill-first engine's core raise, and the server answer 503 to
  everything after, now all complete;
- a step that fails fails only its requests: each gets an OpenAI-style error (a JSON 500, or an
  error event in its stream), the others finish, the engine goes on and /health stays 200;
- a dead engine answers JSON 503s to requests in flight, and /metrics says it is down instead of
  showing its last numbers (tests/test_serve_engine_core.py kills the core process itself)."""

import asyncio
import json
import math
import threading

import httpx
import pytest

from infer.serve.metrics import metric_samples, read_metrics
from infer.serve.server import EngineSettings, start_server

PROMPT_LEN, MAX_TOKENS = 200, 128
POISON = 3  # a prompt that starts with this token makes the test's step fail


def six_requests(url: str, stream: bool) -> list[httpx.Response]:
    async def send_all():
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            bodies = [
                {"prompt": [10 + i] * PROMPT_LEN, "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
                for i in range(6)
            ]
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for body in bodies))

    return asyncio.run(send_all())


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_six_requests_that_preempt_past_the_budget_all_complete(tiny, policy):
    """Issue 29's case: a paged pool of 40 blocks, a budget of 256. Preempted requests come back as
    prefills of up to 327 tokens; under a prefill-first policy the core used to raise on them."""
    settings = EngineSettings(policy=policy, kv_store="paged", num_kv_blocks=40, max_num_batched_tokens=256)
    with start_server(tiny, settings) as server:
        responses = six_requests(server.url, stream=False)
        statuses = [r.status_code for r in responses]
        assert statuses == [200] * 6, f"statuses {statuses}: {responses[statuses.index(max(statuses))].text[:300]}"
        assert [r.json()["usage"]["completion_tokens"] for r in responses] == [MAX_TOKENS] * 6
        gauges = read_metrics(httpx.get(f"{server.url}/metrics").text)
        assert httpx.get(f"{server.url}/health").status_code == 200
    if policy != "static":
        assert gauges["infer:num_preemptions_total"] > 0, "the pool was meant to be too small: nothing was preempted"


@pytest.fixture
def failing_server(tiny):
    """A server whose engine fails any step that holds a request whose prompt starts with POISON."""
    settings = EngineSettings(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256, engine_process=False)
    with start_server(tiny, settings) as server:
        engine = server.served.engine.engine
        forward = engine.runner.forward

        def forward_or_fail(work):
            if any(item.seq.prompt_token_ids[0] == POISON for item in work):
                raise RuntimeError("injected failure")
            return forward(work)

        engine.runner.forward = forward_or_fail
        yield server


def test_a_failed_step_fails_only_its_requests_and_the_engine_goes_on(failing_server):
    url = failing_server.url
    results: dict[str, httpx.Response | list[str]] = {}

    def plain(name: str, first_token: int):
        body = {"prompt": [first_token] + [5] * 20, "max_tokens": 40, "ignore_eos": True}
        results[name] = httpx.post(f"{url}/v1/completions", json=body, timeout=60)

    def streamed(name: str, first_token: int):
        body = {"prompt": [first_token] + [6] * 20, "max_tokens": 40, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            results[name] = [line for line in response.iter_lines() if line.startswith("data: ")]

    clients = [
        threading.Thread(target=plain, args=("good", 7)),
        threading.Thread(target=streamed, args=("good stream", 8)),
        threading.Thread(target=plain, args=("poisoned", POISON)),
        threading.Thread(target=streamed, args=("poisoned stream", POISON)),
    ]
    for client in clients:
        client.start()
    for client in clients:
        client.join(60)

    poisoned = results["poisoned"]
    assert poisoned.status_code == 500 and poisoned.headers["content-type"] == "application/json", poisoned.text
    assert "injected failure" in poisoned.json()["error"]["message"]
    last_event = json.loads(results["poisoned stream"][-2].removeprefix("data: "))
    assert last_event["error"]["code"] == 500 and "injected failure" in last_event["error"]["message"]
    assert results["poisoned stream"][-1] == "data: [DONE]"
    # The others may have shared a failed step with a poisoned request; a request sent after must succeed.
    after = httpx.post(f"{url}/v1/completions", json={"prompt": [9] * 10, "max_tokens": 12, "ignore_eos": True})
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 12
    assert httpx.get(f"{url}/health").status_code == 200, "one failed step must not stop the engine"
    gauges = read_metrics(httpx.get(f"{url}/metrics").text)
    assert gauges["infer:num_requests_running"] == 0 and gauges["infer:kv_cache_usage_perc"] == 0, (
        "a failed request's KV room was not freed"
    )
    errors = [v for name, labels, v in metric_samples(httpx.get(f"{url}/metrics").text)
              if name == "infer:request_success_total" and labels.get("finished_reason") == "error"]  # fmt: skip
    assert errors and errors[0] >= 2


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the loop's death, on purpose
def test_a_dead_engine_answers_json_503_in_flight_and_metrics_say_it_is_down(tiny):
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=512, engine_process=False)
    with start_server(tiny, settings) as server:
        engine_thread = server.served.engine
        step = engine_thread.engine.step

        def step_then_die():
            if engine_thread.engine.num_steps >= 3:
                raise SystemExit("the engine loop is gone")  # not an Exception: no request-level recovery
            return step()

        engine_thread.engine.step = step_then_die
        response = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": [4] * 8, "max_tokens": 100, "ignore_eos": True}, timeout=30
        )
        assert response.status_code == 503 and response.headers["content-type"] == "application/json", response.text
        assert "engine" in response.json()["error"]["message"]
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and health.headers["content-type"] == "application/json"
        samples = {name: value for name, _, value in metric_samples(httpx.get(f"{server.url}/metrics").text)}
        assert samples["infer:engine_alive"] == 0
        assert math.isnan(samples["infer:num_requests_waiting"]), "a dead engine's queue is unknown, not its last value"
