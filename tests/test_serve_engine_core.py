"""The engine core in its own process (infer.serve.engine_core): what happens when either process
dies. Killed under load, the core takes nothing down with it: every open stream ends with an error
the client can read, /health and new requests answer 503 and say why, and the API process keeps
answering. And a core whose API process is killed exits on its own instead of running on."""

import math
import os
import signal
import threading
import time
from dataclasses import replace

import httpx
import psutil
import pytest

from infer.serve.metrics import read_metrics
from infer.serve.server import EngineSettings, running_server_process, start_server

SETTINGS = EngineSettings(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=512)


def read_stream(url: str, outcome: dict, index: int) -> None:
    body = {"prompt": [5 + index] * 8, "max_tokens": 450, "ignore_eos": True, "stream": True}
    lines = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    except httpx.HTTPError as exc:  # the connection itself ended: also an answer, if it came quickly
        lines.append(f"transport error: {exc!r}")
    outcome[index] = lines


def test_killing_the_engine_core_under_load_fails_streams_cleanly_and_answers_503(tiny):
    with start_server(tiny, SETTINGS) as server:
        engine = server.served.engine
        outcome: dict[int, list[str]] = {}
        clients = [threading.Thread(target=read_stream, args=(server.url, outcome, i)) for i in range(6)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 60
        while engine.stats().num_running < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.stats().num_running == 6, "the six streams never ran together: the test did not load the core"
        os.kill(engine.process.pid, signal.SIGKILL)
        for client in clients:
            client.join(30)
        assert not any(client.is_alive() for client in clients), "a stream hung after its engine died"
        for index, lines in outcome.items():
            assert lines and "engine" in lines[-2] + lines[-1], (
                f"stream {index} ended without saying the engine failed; its last lines: {lines[-2:]}"
            )
            if lines[-1] == "data: [DONE]":  # the stream's own error event, not a cut connection
                assert '"code":503' in lines[-2].replace(" ", ""), f"stream {index}'s error event: {lines[-2]}"
        health = httpx.get(f"{server.url}/health")
        assert health.status_code == 503 and "died" in health.json()["error"]["message"]
        refused = httpx.post(f"{server.url}/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
        assert refused.status_code == 503, "a request to a server without an engine must be refused with 503"
        assert "engine" in refused.json()["error"]["message"]
        scraped = httpx.get(f"{server.url}/metrics")
        assert scraped.status_code == 200, "the API process must keep answering"
        gauges = read_metrics(scraped.text)
        assert gauges["infer:engine_alive"] == 0, "/metrics must say the engine is down"
        assert math.isnan(gauges["infer:num_requests_running"]), "a dead core's last numbers are not its state"
        assert engine.process.exitcode == -signal.SIGKILL


def test_the_engine_core_exits_when_its_api_process_is_killed(tmp_path):
    with running_server_process("cpu", SETTINGS, tmp_path / "server.log", startup_timeout_s=120) as url:
        port = int(url.rsplit(":", 1)[1])
        server = next(p for p in psutil.process_iter(["pid"]) if any(c.laddr.port == port for c in _listening(p)))
        cores = [child for child in server.children() if "multiprocessing" in " ".join(child.cmdline())]
        assert cores, f"no engine core process under the server (pid {server.pid}): {server.children()}"
        server.kill()
        gone, alive = psutil.wait_procs(cores, timeout=20)
        assert not alive, f"the engine core outlived its API process by 20 s: {alive}"


def _listening(process: psutil.Process) -> list:
    try:
        return [c for c in process.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return []


@pytest.mark.parametrize("engine_process", [True, False], ids=["own process", "in-process thread"])
def test_both_engines_count_their_steps_and_phases(tiny, engine_process):
    settings = EngineSettings(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256)
    with start_server(tiny, replace(settings, engine_process=engine_process), model_name="tiny") as server:
        reply = httpx.post(
            f"{server.url}/v1/completions",
            json={"prompt": [3, 4, 5, 6], "max_tokens": 6, "temperature": 0, "ignore_eos": True},
            timeout=60,
        ).json()
        stats = server.served.engine.stats()
        metrics = httpx.get(f"{server.url}/metrics").text
    assert reply["usage"]["completion_tokens"] == 6
    assert stats.num_steps >= 6 and stats.phase_seconds["forward"] > 0, stats
    assert 'infer:engine_phase_seconds_total{model_name="tiny",phase="forward"}' in metrics
    assert 'infer:frontend_seconds_total{model_name="tiny",part="detokenize"}' in metrics
    assert ("send" in stats.phase_seconds) == engine_process, "only a core process sends its outputs down a pipe"
