"""The server-side view, in Prometheus text at /metrics (vLLM's metric names, with `infer:` for
`vllm:`): what the queues and the KV store hold right now, and how long requests took as the
server saw them.

The gauges are read from the engine when Prometheus scrapes, not copied after each step, so they
are never stale: after the last stream ends or disconnects, `infer:num_requests_running`,
`infer:num_requests_waiting` and `infer:kv_cache_usage_perc` read 0, or a slot has leaked.
Server-side TTFT counts from the moment the request reached the engine; a client's TTFT adds the
network and the HTTP handling on both ends.
"""

import threading
import time

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

# Bucket edges in seconds: from a tiny model's sub-millisecond decode step to a long queue.
LATENCY_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
)


class EngineCounter(Collector):
    """A counter that the engine keeps (it only ever grows), read when Prometheus scrapes."""

    def __init__(self, name: str, doc: str, labels: dict[str, str], read):
        self.name, self.doc, self.labels, self.read = name, doc, labels, read

    def collect(self):
        counter = CounterMetricFamily(self.name, self.doc, labels=list(self.labels))
        counter.add_metric(list(self.labels.values()), self.read())
        yield counter


class ServerMetrics:
    def __init__(self, engine, model_name: str):
        self.registry = CollectorRegistry()  # one per server, so that tests can run several
        labels = {"model_name": model_name}
        scheduler = engine.scheduler

        def gauge(name: str, doc: str, read) -> None:
            metric = Gauge(name, doc, list(labels), registry=self.registry)
            metric.labels(**labels).set_function(read)

        gauge(
            "infer:num_requests_running",
            "Requests holding KV room (prefilling or decoding).",
            lambda: len(scheduler.running),
        )
        gauge("infer:num_requests_waiting", "Requests queued for admission.", lambda: len(scheduler.waiting))
        gauge("infer:kv_cache_usage_perc", "Fraction of the KV store in use (1 = full).", lambda: engine.kv_store.usage)
        # The slot store reserves a whole sequence up front, so nothing is ever preempted; week 08's
        # paged store preempts when its blocks run out. A counter read from the engine at each scrape,
        # exposed as infer:num_preemptions_total (vLLM: vllm:num_preemptions_total).
        self.registry.register(
            EngineCounter(
                "infer:num_preemptions",
                "Requests preempted to free KV room (recomputed later).",
                labels,
                lambda: engine.num_preemptions,
            )
        )
        gauge(
            "infer:prefix_cache_hit_rate",
            "Prompt tokens found in the prefix cache, over those looked up.",
            lambda: engine.prefix_cache_hit_rate,
        )
        self.open_streams = Gauge(
            "infer:num_open_responses", "HTTP responses still being written.", list(labels), registry=self.registry
        ).labels(**labels)
        self._finished = Counter(
            "infer:request_success",
            "Requests ended, by finish reason (abort: the client left).",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self._labels = labels

        def histogram(name: str, doc: str):
            return Histogram(name, doc, list(labels), buckets=LATENCY_BUCKETS_S, registry=self.registry).labels(
                **labels
            )

        self.ttft = histogram("infer:time_to_first_token_seconds", "Arrival at the engine to the first token.")
        self.itl = histogram("infer:inter_token_latency_seconds", "Gap between a request's consecutive tokens.")
        self.e2el = histogram("infer:e2e_request_latency_seconds", "Arrival at the engine to the last token.")

    def finished(self, reason: str | None) -> None:
        self._finished.labels(**self._labels, finished_reason=reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


def read_metrics(text: str) -> dict[str, float]:
    """{sample name: value} from Prometheus text, summed over label sets (for tests and notebooks)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_and_labels, value = line.rsplit(" ", 1)
        name = name_and_labels.split("{", 1)[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


class GaugeSampler:
    """Scrape a server's /metrics every `period_s` seconds from a background thread, while a
    benchmark runs: the server-side view over time (`with GaugeSampler(url) as s: ...; s.samples`).
    Each sample is (seconds since start, {metric name: value})."""

    def __init__(self, url: str, period_s: float = 0.05):
        self.url, self.period_s = url.rstrip("/") + "/metrics", period_s
        self.samples: list[tuple[float, dict[str, float]]] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="gauge-sampler", daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        with httpx.Client(timeout=5) as client:
            while not self.stopping.wait(self.period_s):
                self.samples.append((time.perf_counter() - start, read_metrics(client.get(self.url).text)))

    def __enter__(self) -> "GaugeSampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join()
