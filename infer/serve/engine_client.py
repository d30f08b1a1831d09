"""What the app sees of the engine, wherever it runs: `add` a request with the queue its outputs go
to, `abort` one, ask whether the engine is `alive`, read its `stats()`. Two engines stand behind
this one interface: `EngineThread` (the engine in a background thread of the server's own
process) and `EngineProcess` (the engine core in a process of its own, as vLLM V1 runs it).

Both route a step's outputs the same way, here: each output goes to the asyncio queue of the
stream it belongs to, stamped with the time it reached the front end, and the server's
histograms observe it. A stream leaves the table when its request finishes or is aborted, so an
output that arrives for an aborted request finds nobody and is dropped.
"""

import asyncio
import threading
import time
from dataclasses import dataclass

from infer.engine import RequestOutput
from infer.engine.engine import EngineStats


class EngineUnavailable(RuntimeError):
    """The engine has stopped (it failed, or its process died): the server answers 503."""


class RequestFailed(RuntimeError):
    """A step failed for this request (finish reason "error"); the engine goes on: the server answers 500."""


@dataclass
class Delivery:
    """One step's output for one request, as its stream receives it."""

    output: RequestOutput
    time: float  # time.perf_counter() when the output reached the front end


@dataclass
class _Stream:
    queue: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival: float
    last_token: float | None = None


class EngineClient:
    def __init__(self, metrics=None):
        self.metrics = metrics  # a ServerMetrics, or None
        if metrics is not None:
            metrics.attach(self.stats, lambda: self.alive)  # its gauges read this engine, wherever it runs
        self.streams: dict[str, _Stream] = {}
        self.guard = threading.Lock()  # protects `streams`, never held during a step
        self.error: BaseException | None = None  # what stopped the engine, if anything did

    # ------------------------------------------------------------ what the app calls

    async def add(self, prompt_ids: list[int], params, queue: asyncio.Queue, request_id: str) -> str:
        """Queue a request whose outputs go to `queue`. Raises ValueError for bad input and
        EngineUnavailable when the engine is gone."""
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        """Abort before the engine's next step (never blocks); unknown or finished ids are ignored."""
        with self.guard:
            if self.streams.pop(request_id, None) is None:
                return
        self._abort_in_engine(request_id)
        if self.metrics is not None:
            self.metrics.finished("abort")

    @property
    def alive(self) -> bool:
        raise NotImplementedError

    def stats(self) -> EngineStats:
        raise NotImplementedError

    def stop(self, timeout_s: float = 30.0) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ shared by both engines

    def _abort_in_engine(self, request_id: str) -> None:
        raise NotImplementedError

    def _check_alive(self) -> None:
        if not self.alive:
            raise EngineUnavailable(f"the engine is not running: {self.error}")

    def _open_stream(self, request_id: str, queue: asyncio.Queue, loop: asyncio.AbstractEventLoop, arrival: float):
        with self.guard:
            self.streams[request_id] = _Stream(queue, loop, arrival)

    def _close_stream(self, request_id: str) -> None:
        with self.guard:
            self.streams.pop(request_id, None)

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        now = time.perf_counter()
        batches: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, Delivery]]] = {}
        with self.guard:
            for out in outputs:
                stream = self.streams.get(out.request_id)
                if stream is None:
                    continue  # aborted while this step ran: its client is gone
                self._observe(stream, out, now)
                if out.finished:
                    del self.streams[out.request_id]
                batches.setdefault(stream.loop, []).append((stream.queue, Delivery(out, now)))
        for loop, items in batches.items():
            loop.call_soon_threadsafe(_put_all, items)
        if self.metrics is not None:
            self.metrics.frontend_seconds["deliver"].inc(time.perf_counter() - now)

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
