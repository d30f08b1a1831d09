"""The engine loop in a background thread of the server's own process (the simple way; week 07
measures what it costs against `EngineProcess`).

The web server's event loop must never wait for a forward pass, and the engine must never wait
for a slow client. So they meet in three places only:
- `add` runs the engine's own `add_request` in a worker thread (bad input raises there, before
  anything is queued), since it waits for the engine's lock while a step runs;
- `abort` only notes the request id: the loop aborts it before its next step, which frees its
  KV room at once, and an aborted request never gets another token;
- after each step the loop hands all the step's outputs to the event loop in one callback.

The loop sleeps on an event while the engine is idle, and wakes for a new request or an abort.
Both threads share one interpreter: while the event loop parses JSON or writes a stream, the
engine's Python code waits for the GIL.
"""

import asyncio
import threading
import time

from infer.engine import Engine
from infer.serve.engine_client import EngineClient


class EngineThread(EngineClient):
    def __init__(self, engine: Engine, metrics=None, idle_wait_s: float = 0.5):
        super().__init__(metrics)
        self.engine = engine
        self.idle_wait_s = idle_wait_s  # an idle loop re-checks this often, even without a wake-up
        self.to_abort: set[str] = set()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> "EngineThread":
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stopping.set()
        self.wake.set()
        self.thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive()

    def stats(self):
        return self.engine.stats()

    async def add(self, prompt_ids, params, queue, request_id):
        self._check_alive()
        loop, arrival = asyncio.get_running_loop(), time.perf_counter()
        return await asyncio.to_thread(self._add_now, prompt_ids, params, queue, loop, request_id, arrival)

    def _add_now(self, prompt_ids, params, queue, loop, request_id, arrival) -> str:
        with self.engine.lock:  # register the stream before the loop can produce its first token
            request_id = self.engine.add_request(prompt_ids, params, request_id=request_id, arrival_time=arrival)
            self._open_stream(request_id, queue, loop, arrival)
        self.wake.set()
        return request_id

    def _abort_in_engine(self, request_id: str) -> None:
        with self.guard:
            self.to_abort.add(request_id)
        self.wake.set()

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                with self.guard:
                    ids, self.to_abort = self.to_abort, set()
                for request_id in ids:
                    self.engine.abort(request_id)
                if not self.engine.has_unfinished():
                    self.wake.wait(self.idle_wait_s)
                    self.wake.clear()
                    continue
                self._deliver(self.engine.step())
        except BaseException as exc:  # the server reports it on /health and to every open stream
            self.error = exc
            self._fail_all(exc)
            raise
