"""The server-side view, in Prometheus text at /metrics (vLLM's metric names, with `infer:` for
`vllm:`): what the queues and the KV store hold right now, and how long requests took as the
server saw them.

The gauges are read from the engine's latest stats when Prometheus scrapes (the engine's own, or
the snapshot its core process sent after its last step or abort), so after the last stream ends
or disconnects, `infer:num_requests_running`, `infer:num_requests_waiting` and
`infer:kv_cache_usage_perc` read 0, or KV room has leaked. The time counters (engine phases and
the front end's per-token work) let a benchmark read where a serving step goes (week 07).
Server-side TTFT counts from the moment the request reached the engine; a client's TTFT adds the
network and the HTTP handling on both ends.
"""

import math
import re
import threading
import time

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

FRONTEND_PARTS = ("deliver", "detokenize", "sse")

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


class EngineCounters(Collector):
    """Counters that the engine keeps (they only ever grow), read from its stats when Prometheus scrapes."""

    def __init__(self, labels: dict[str, str], read_stats):
        self.labels, self.read_stats = labels, read_stats

    def collect(self):
        stats = self.read_stats()
        names, values = list(self.labels), list(self.labels.values())
        # The slot store reserves a whole sequence up front, so it never preempts; week 08's paged store
        # preempts when its blocks run out (vLLM: vllm:num_preemptions_total).
        preemptions = CounterMetricFamily(
            "infer:num_preemptions", "Requests preempted to free KV room (recomputed later).", labels=names
        )
        preemptions.add_metric(values, stats.num_preemptions)
        steps = CounterMetricFamily("infer:engine_steps", "Engine steps run (one forward pass each).", labels=names)
        steps.add_metric(values, stats.num_steps)
        phases = CounterMetricFamily(
            "infer:engine_phase_seconds",
            "Wall time of the engine's steps by phase (schedule, forward, sample, update; send: to the API process).",
            labels=[*names, "phase"],
        )
        for phase, seconds in stats.phase_seconds.items():
            phases.add_metric([*values, phase], seconds)
        yield from (preemptions, steps, phases)
        # Speculative decoding (week 10), vLLM's counters: acceptance rate = accepted / draft tokens,
        # mean tokens per verifying step = 1 + accepted / drafts. 0 while speculation is off.
        for name, doc, value in (
            ("infer:spec_decode_num_drafts", "Requests' steps that verified guesses.", stats.num_drafts),
            ("infer:spec_decode_num_draft_tokens", "Guessed tokens verified.", stats.num_draft_tokens),
            ("infer:spec_decode_num_accepted_tokens", "Guessed tokens the target kept.", stats.num_accepted_tokens),
        ):
            counter = CounterMetricFamily(name, doc, labels=names)
            counter.add_metric(values, value)
            yield counter


class ServerMetrics:
    """The server's metrics. The engine client they are given to attaches its `stats` reader."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()  # one per server, so that tests can run several
        self.read_stats, self.read_alive = None, None
        labels = {"model_name": model_name}
        alive = Gauge(
            "infer:engine_alive",
            "1 while the engine runs; 0 once it has stopped (the server answers 503, the state gauges read NaN).",
            list(labels),
            registry=self.registry,
        )
        alive.labels(**labels).set_function(lambda: float(self.read_alive()))

        def gauge(name: str, doc: str, field: str) -> None:
            # A stopped engine has no state: NaN, not the last numbers it sent (waiting 5, forever).
            metric = Gauge(name, doc, list(labels), registry=self.registry)
            metric.labels(**labels).set_function(
                lambda: getattr(self.read_stats(), field) if self.read_alive() else math.nan
            )

        gauge("infer:num_requests_running", "Requests holding KV room (prefilling or decoding).", "num_running")
        gauge("infer:num_requests_waiting", "Requests queued for admission.", "num_waiting")
        gauge("infer:kv_cache_usage_perc", "Fraction of the KV store in use (1 = full).", "kv_cache_usage")
        gauge(
            "infer:prefix_cache_hit_rate",
            "Prompt tokens found in the prefix cache, over those looked up.",
            "prefix_cache_hit_rate",
        )
        self.registry.register(EngineCounters(labels, lambda: self.read_stats()))
        self.open_streams = Gauge(
            "infer:num_open_responses", "HTTP responses still being written.", list(labels), registry=self.registry
        ).labels(**labels)
        frontend = Counter(
            "infer:frontend_seconds",
            "Wall time of the API side's per-token work, by part (deliver: handing a step's outputs to the "
            "streams; detokenize; sse: building the stream's chunks).",
            [*labels, "part"],
            registry=self.registry,
        )
        self.frontend_seconds = {part: frontend.labels(**labels, part=part) for part in FRONTEND_PARTS}
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

    def attach(self, read_stats, read_alive) -> None:
        """Where the gauges and engine counters are read from: a callable returning EngineStats, and
        one that says whether the engine still runs."""
        self.read_stats, self.read_alive = read_stats, read_alive

    def finished(self, reason: str | None) -> None:
        self._finished.labels(**self._labels, finished_reason=reason or "unknown").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


LABEL_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(sample name, its labels, value) for every sample line of Prometheus text."""
    samples = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_and_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_and_labels.partition("{")
        samples.append((name, dict(LABEL_PAIR.findall(labels)), float(value)))
    return samples


def read_metrics(text: str) -> dict[str, float]:
    """{sample name: value} from Prometheus text, summed over label sets (for tests and notebooks)."""
    values: dict[str, float] = {}
    for name, _, value in metric_samples(text):
        values[name] = values.get(name, 0.0) + value
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
