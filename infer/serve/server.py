"""Put it together: a model, the engine, its thread, the app, and uvicorn on the loopback address.

`start_server(lm)` returns a running server in a background thread (for tests and notebooks: the
caller keeps its own event loop), its engine core in a process of its own unless the settings say
`engine_process=False`; and `RunningServer.stop()` ends it. `running_server_process`
runs `python -m infer.serve` (what `make serve` runs in the foreground) as a separate process,
as benchmarks need: a client in the same interpreter would compete with the server for its lock.
"""

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from infer.model import Transformer
from infer.serve.app import Served, build_app
from infer.serve.chat import with_chat_template
from infer.serve.engine_core import EngineProcess
from infer.serve.engine_thread import EngineThread
from infer.serve.metrics import ServerMetrics
from infer.serve.settings import EngineSettings, make_engine

LOOPBACK = "127.0.0.1"  # never another interface: the server is for this machine's benchmarks


def build_served(lm, settings: EngineSettings = EngineSettings(), model_name: str | None = None) -> Served:
    """The course's Transformer with `lm`'s weights behind an engine, started: in its own process
    (the default) or in a thread of this one."""
    model = Transformer.from_hf(lm.model)
    name = model_name or lm.name
    metrics = ServerMetrics(name)
    if settings.engine_process:
        engine = EngineProcess(model, settings, metrics).start()
    else:
        engine = EngineThread(make_engine(model, settings), metrics).start()
    return Served(engine, with_chat_template(lm.tokenizer), name, settings.max_model_len, metrics)


@dataclass
class RunningServer:
    url: str  # e.g. http://127.0.0.1:8000, without /v1
    served: Served
    uvicorn_server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 30.0) -> None:
        self.uvicorn_server.should_exit = True
        self.thread.join(timeout_s)
        self.served.engine.stop(timeout_s)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def start_server(
    lm,
    settings: EngineSettings = EngineSettings(),
    *,
    port: int | None = None,
    model_name: str | None = None,
    startup_timeout_s: float = 60.0,
) -> RunningServer:
    """Serve `lm` on 127.0.0.1 from a background thread; returns once it accepts connections."""
    served = build_served(lm, settings, model_name)
    config = uvicorn.Config(
        build_app(served), host=LOOPBACK, port=port or free_port(), log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            served.engine.stop()
            raise RuntimeError(f"the server did not start on {LOOPBACK}:{config.port} within {startup_timeout_s:.0f} s")
        time.sleep(0.05)
    return RunningServer(f"http://{LOOPBACK}:{config.port}", served, server, thread)


def wait_for_health(url: str, process: subprocess.Popen, timeout_s: float, log_path) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with code {process.returncode}; see {log_path}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not answer {url}/health within {timeout_s:.0f} s; see {log_path}")
        time.sleep(1.0)


@contextmanager
def server_process(
    command: list[str],
    port: int,
    log_path: str | os.PathLike,
    startup_timeout_s: float,
    env: dict[str, str] | None = None,
):
    """Run a server command (ours or vLLM's) with its output in `log_path`, wait until /health
    answers on `port`, yield its URL; terminate it afterwards (kill it if it does not stop)."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            url = f"http://{LOOPBACK}:{port}"
            wait_for_health(url, process, startup_timeout_s, log_path)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextmanager
def running_server_process(
    profile: str,
    settings: EngineSettings,
    log_path: str | os.PathLike,
    *,
    port: int | None = None,
    startup_timeout_s: float = 300.0,
    model: str | None = None,
):
    """`python -m infer.serve` in a process of its own (as vLLM's server runs), so that a client in
    this process shares no interpreter with it; yields its URL. `model`: another model than the
    profile's (infer.models), with random weights too."""
    port = port or free_port()
    command = [
        sys.executable,
        "-m",
        "infer.serve",
        "--port",
        str(port),
        "--profile",
        profile,
        "--weights",
        "random",
        *(["--model", model] if model else []),
        "--policy",
        settings.policy,
        "--max-num-seqs",
        str(settings.max_num_seqs),
        "--max-num-batched-tokens",
        str(settings.max_num_batched_tokens),
        "--max-model-len",
        str(settings.max_model_len),
        "--kv-store",
        settings.kv_store,
        "--block-size",
        str(settings.block_size),
        *(["--num-kv-blocks", str(settings.num_kv_blocks)] if settings.num_kv_blocks else []),
        *(["--enable-prefix-caching"] if settings.enable_prefix_caching else []),
        *([] if settings.engine_process else ["--engine-in-process"]),
        *(["--engine-threads", str(settings.engine_threads)] if settings.engine_threads else []),
        "--decode-attention",
        settings.decode_attention,
        *(["--cuda-graphs"] if settings.cuda_graphs else []),
        *(["--packed-linears"] if settings.packed_linears else []),
    ]
    with server_process(command, port, log_path, startup_timeout_s) as url:
        yield url
