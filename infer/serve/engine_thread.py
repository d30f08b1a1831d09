"""The engine loop in one background thread, so that every connection's requests share its batches.

The web server's event loop must never wait for a forward pass, and the engine must never wait
for a slow client. So they meet in three places only:
- `add` runs the engine's own `add_request` (bad input raises there, before anything is queued);
  the app calls it in a worker thread, since it waits for the engine's lock while a step runs;
- `abort` only notes the request id: the loop aborts it before its next step, which frees the
  slot at once, and an aborted request never gets another token;
- after each step the loop hands all the step's outputs to the event loop in one callback, each
  to the queue of the request it belongs to, stamped with the time the step ended.

The loop sleeps on an event while the engine is idle, and wakes for a new request or an abort.
"""

import asyncio
import threading
import time
from dataclasses import dataclass

from infer.engine import Engine, RequestOutput, SamplingParams
from infer.serve.metrics import ServerMetrics


@dataclass
class Delivery:
    """One step's output for one request, as its stream receives it."""

    output: RequestOutput
    time: float  # time.perf_counter() when the step ended


@dataclass
class _Stream:
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float
    last_token: float | None = None


class EngineThread:
    def __init__(self, engine: Engine, metrics: ServerMetrics | None = None, idle_wait_s: float = 0.5):
        self.engine = engine
        self.metrics = metrics
        self.idle_wait_s = idle_wait_s  # an idle loop re-checks this often, even without a wake-up
        self.streams: dict[str, _Stream] = {}
        self.to_abort: set[str] = set()
        self.guard = threading.Lock()  # protects `streams` and `to_abort`, never held during a step
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.error: BaseException | None = None  # what killed the loop, if anything did

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

    # ------------------------------------------------------------ called by the app

    def add(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        queue: asyncio.Queue,
        loop: asyncio.AbstractEventLoop,
        request_id: str | None = None,
    ) -> str:
        """Queue a request whose outputs go to `queue` (on `loop`). Raises ValueError for bad input."""
        if not self.alive:
            raise RuntimeError(f"the engine loop is not running ({self.error!r})")
        arrival = time.perf_counter()
        with self.engine.lock:  # register the stream before the loop can produce its first token
            request_id = self.engine.add_request(prompt_ids, params, request_id=request_id, arrival_time=arrival)
            with self.guard:
                self.streams[request_id] = _Stream(queue, loop, arrival)
        self.wake.set()
        return request_id

    def abort(self, request_id: str) -> None:
        """Abort before the next step (never blocks); unknown or finished ids are ignored."""
        with self.guard:
            if request_id not in self.streams:
                return
            self.to_abort.add(request_id)
        self.wake.set()

    # ------------------------------------------------------------ the loop

    def _run(self) -> None:
        try:
            while not self.stopping.is_set():
                self._apply_aborts()
                if not self.engine.has_unfinished():
                    self.wake.wait(self.idle_wait_s)
                    self.wake.clear()
                    continue
                outputs = self.engine.step()
                self._deliver(outputs, time.perf_counter())
        except BaseException as exc:  # the server reports it on /health and to every open stream
            self.error = exc
            self._fail_all(exc)
            raise

    def _apply_aborts(self) -> None:
        with self.guard:
            ids, self.to_abort = self.to_abort, set()
            for request_id in ids:
                self.streams.pop(request_id, None)
        for request_id in ids:
            self.engine.abort(request_id)
            if self.metrics is not None:
                self.metrics.finished("abort")

    def _deliver(self, outputs: list[RequestOutput], now: float) -> None:
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delivery]]] = {}
        with self.guard:
            for out in outputs:
                stream = self.streams.get(out.request_id)
                if stream is None or out.request_id in self.to_abort:
                    continue  # aborted while this step ran: its client is gone
                self._observe(stream, out, now)
                if out.finished:
                    del self.streams[out.request_id]
                batches.setdefault(stream.loop, []).append((stream.queue, Delivery(out, now)))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _observe(self, stream: _Stream, out: RequestOutput, now: float) -> None:
        if self.metrics is not None:
            if stream.last_token is None:
                self.metrics.ttft.observe(now - stream.arrival)
            else:
                self.metrics.itl.observe(now - stream.last_token)
            if out.finished:
                self.metrics.e2el.observe(now - stream.arrival)
                self.metrics.finished(out.finish_reason)
        stream.last_token = now

    def _fail_all(self, exc: BaseException) -> None:
        with self.guard:
            streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)


def _put_all(items: list[tuple[asyncio.Queue, Delivery]]) -> None:
    for queue, delivery in items:
        queue.put_nowait(delivery)
