"""The engine core in a process of its own, as vLLM V1 splits its server: the API process parses
HTTP, detokenizes and writes streams; the engine-core process only schedules, runs the model and
samples. They share no interpreter, so neither waits for the other's GIL, and they talk over one
pipe:

    API process  -> core:  ("add", id, prompt, params, arrival) | ("abort", id) | ("stop",)
    core -> API process:   ("ready", stats) | ("added", id, error or None)
                           | ("step", outputs, stats) | ("stats", stats) | ("failed", error)

The core drains its messages between steps (so an add waits at most one step, as in the thread),
sends each step's outputs in one message, and blocks on the pipe while it has nothing to do. It
exits when it is told to stop or when the pipe closes (the API process is gone); when the core
dies, the API process fails every open stream and answers 503 from then on.
"""

import asyncio
import logging
import multiprocessing
import threading
import time
import traceback
from dataclasses import astuple, replace

import torch

from infer.engine import RequestOutput
from infer.engine.engine import EngineStats
from infer.serve.engine_client import EngineClient, EngineUnavailable
from infer.serve.settings import EngineSettings, make_engine

logger = logging.getLogger("infer.serve")
IDLE_POLL_S = 0.5  # an idle core still checks this often that its parent is alive


def run_engine_core(conn, model, settings: EngineSettings, num_threads: int) -> None:
    """The core process's main: build the engine, then serve the pipe until told to stop."""
    torch.set_num_threads(num_threads)
    try:
        engine = make_engine(model, settings)
    except Exception as exc:
        conn.send(("failed", f"the engine could not be built: {exc!r}"))
        return
    print(f"engine core: {engine.startup_line}", flush=True)
    send_seconds = 0.0

    def stats() -> EngineStats:
        snapshot = engine.stats()
        return replace(snapshot, phase_seconds={**snapshot.phase_seconds, "send": send_seconds})

    conn.send(("ready", stats()))
    try:
        while True:
            if conn.poll(0 if engine.has_unfinished() else IDLE_POLL_S):
                changed = False
                while conn.poll():
                    message = conn.recv()
                    if message[0] == "stop":
                        return
                    changed |= handle(engine, conn, message)
                if changed:
                    conn.send(("stats", stats()))
            if engine.has_unfinished():
                outputs = [astuple(o) for o in engine.step()]
                start = time.perf_counter()
                conn.send(("step", outputs, stats()))
                send_seconds += time.perf_counter() - start
    except (EOFError, BrokenPipeError):
        return  # the API process is gone: nobody is left to serve
    except BaseException:
        conn.send(("failed", traceback.format_exc()))
        raise


def handle(engine, conn, message) -> bool:
    """Apply one add or abort; True if the engine's state changed."""
    kind, request_id = message[0], message[1]
    if kind == "abort":
        engine.abort(request_id)
        return True
    _, request_id, prompt_ids, params, arrival = message
    try:
        engine.add_request(prompt_ids, params, request_id=request_id, arrival_time=arrival)
    except ValueError as exc:
        conn.send(("added", request_id, str(exc)))
        return False
    conn.send(("added", request_id, None))
    return True


class EngineProcess(EngineClient):
    """The API side of the split: the `EngineClient` interface over the pipe to a core process."""

    def __init__(self, model, settings: EngineSettings, metrics=None, startup_timeout_s: float = 300.0):
        super().__init__(metrics)
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked locks or threads
        self.conn, core_end = context.Pipe()
        # As vLLM's CPU build: the core computes on every core but one, left to the API process. On two
        # cores (tiny model, course client) one thread gave 1.26x the output tok/s of two at concurrency 32.
        self.num_threads = settings.engine_threads or max(1, torch.get_num_threads() - 1)
        self.process = context.Process(
            target=run_engine_core,
            args=(core_end, model, settings, self.num_threads),
            name="engine-core",
            daemon=True,
        )
        self.model = model  # kept alive: a GPU model's tensors are shared with the core, not copied
        self.send_lock = threading.Lock()
        self.pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.stopping = False
        self.process.start()
        core_end.close()  # only the child holds it now, so its death closes the pipe here
        self.latest = self._wait_until_ready(startup_timeout_s)
        self.reader = threading.Thread(target=self._read, name="engine-core-reader", daemon=True)

    def start(self) -> "EngineProcess":
        self.reader.start()
        return self

    def _wait_until_ready(self, timeout_s: float) -> EngineStats:
        if not self.conn.poll(timeout_s):
            self.process.kill()
            raise RuntimeError(f"the engine core process did not start within {timeout_s:.0f} s")
        try:
            message = self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(
                f"the engine core process exited with code {self.process.exitcode} at startup (its traceback is "
                "above). It starts as a fresh interpreter that imports your main script again: a script that starts "
                'a server must do it under `if __name__ == "__main__":`, or use EngineSettings(engine_process=False)'
            ) from None
        if message[0] != "ready":
            self.process.join(5)
            raise RuntimeError(f"the engine core process failed at startup: {message[1]}")
        return message[1]

    @property
    def alive(self) -> bool:
        return self.error is None and self.process.is_alive()

    def stats(self) -> EngineStats:
        return self.latest

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stopping = True
        try:
            self._send(("stop",))
        except (OSError, EngineUnavailable):
            pass  # already gone
        self.process.join(timeout_s)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()
        if self.reader.is_alive():
            self.reader.join(timeout_s)

    async def add(self, prompt_ids, params, queue, request_id):
        self._check_alive()
        loop, arrival = asyncio.get_running_loop(), time.perf_counter()
        accepted = loop.create_future()
        self._open_stream(request_id, queue, loop, arrival)  # before the core can send a token
        self.pending[request_id] = (loop, accepted)
        try:
            self._send(("add", request_id, list(prompt_ids), params, arrival))
            error = await accepted
        except BaseException:
            self._close_stream(request_id)
            raise
        finally:
            self.pending.pop(request_id, None)
        if error is not None:
            self._close_stream(request_id)
            raise ValueError(error)
        return request_id

    def _abort_in_engine(self, request_id: str) -> None:
        try:
            self._send(("abort", request_id))
        except EngineUnavailable:
            pass  # a dead core holds nothing to free

    def _send(self, message) -> None:
        try:
            with self.send_lock:
                self.conn.send(message)
        except OSError as exc:
            raise EngineUnavailable(f"the engine core process is gone ({exc!r})") from None

    def _read(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                kind = message[0]
                if kind == "step":
                    self.latest = message[2]
                    self._deliver([RequestOutput(*fields) for fields in message[1]])
                elif kind == "added":
                    loop, accepted = self.pending[message[1]]
                    loop.call_soon_threadsafe(_resolve, accepted, message[2])
                elif kind == "stats":
                    self.latest = message[1]
                elif kind == "failed":
                    raise EngineUnavailable(f"the engine core failed:\n{message[1]}")
        except (EOFError, OSError):
            if self.stopping:
                return
            self.process.join(5)
            self._fail(EngineUnavailable(f"the engine core process died (exit code {self.process.exitcode})"))
        except EngineUnavailable as exc:
            self._fail(exc)

    def _fail(self, exc: EngineUnavailable) -> None:
        self.error = exc
        logger.error("%s; open streams end with an error, and the server answers 503 until restarted", exc)
        self._fail_all(exc)
        for loop, accepted in list(self.pending.values()):
            loop.call_soon_threadsafe(_fail_future, accepted, exc)


def _resolve(future: asyncio.Future, error: str | None) -> None:
    if not future.done():
        future.set_result(error)


def _fail_future(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
