"""Put it together: a model, the engine, its thread, the app, and uvicorn on the loopback address.

`start_server(lm)` returns a running server in a background thread (for tests, notebooks and
benchmarks: the caller keeps its own event loop) and `RunningServer.stop()` ends it;
`python -m infer.serve` (`make serve`) runs one in the foreground.
"""

import socket
import threading
import time
from dataclasses import dataclass

import uvicorn

from infer.engine import Engine
from infer.model import Transformer
from infer.serve.app import Served, build_app
from infer.serve.chat import with_chat_template
from infer.serve.engine_thread import EngineThread
from infer.serve.metrics import ServerMetrics

LOOPBACK = "127.0.0.1"  # never another interface: the server is for this machine's benchmarks


@dataclass(frozen=True)
class EngineSettings:
    """The engine's limits, as vLLM's flags of the same names."""

    policy: str = "continuous"
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 2048
    max_model_len: int = 2048


def build_served(lm, settings: EngineSettings = EngineSettings(), model_name: str | None = None) -> Served:
    """The course's Transformer with `lm`'s weights in an engine, its loop started."""
    model = Transformer.from_hf(lm.model)
    engine = Engine(model, policy=settings.policy, max_num_seqs=settings.max_num_seqs,
                    max_num_batched_tokens=settings.max_num_batched_tokens, max_model_len=settings.max_model_len)
    name = model_name or lm.name
    metrics = ServerMetrics(engine, name)
    return Served(EngineThread(engine, metrics).start(), with_chat_template(lm.tokenizer), name,
                  settings.max_model_len, metrics)


@dataclass
class RunningServer:
    url: str  # e.g. http://127.0.0.1:8000, without /v1
    served: Served
    uvicorn_server: uvicorn.Server
    thread: threading.Thread

    def stop(self, timeout_s: float = 30.0) -> None:
        self.uvicorn_server.should_exit = True
        self.thread.join(timeout_s)
        self.served.engine_thread.stop(timeout_s)

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def start_server(lm, settings: EngineSettings = EngineSettings(), *, port: int | None = None,
                 model_name: str | None = None, startup_timeout_s: float = 60.0) -> RunningServer:
    """Serve `lm` on 127.0.0.1 from a background thread; returns once it accepts connections."""
    served = build_served(lm, settings, model_name)
    config = uvicorn.Config(build_app(served), host=LOOPBACK, port=port or free_port(), log_level="warning",
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            served.engine_thread.stop()
            raise RuntimeError(f"the server did not start on {LOOPBACK}:{config.port} within {startup_timeout_s:.0f} s")
        time.sleep(0.05)
    return RunningServer(f"http://{LOOPBACK}:{config.port}", served, server, thread)
