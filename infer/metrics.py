"""Serving metrics from request records, defined exactly as vLLM's serving benchmark
(`vllm bench serve`, vllm/benchmarks/serve.py) defines them, with the same result key names.

Per successful request (times from infer.records.RequestRecord, reported in ms):
- TTFT  = first chunk's arrival - send time               (queueing + prefill, whose logits give the first token)
- E2EL  = last chunk's arrival  - send time               (the whole wait, client side)
- TPOT  = (E2EL - TTFT) / (output tokens - 1)             only when output tokens > 1
- ITL   = every gap between consecutive chunks            pooled over all requests
Over the run:
- duration = first send -> last finish, failed requests included (their time was spent too)
- request / output-token / total-token throughput = counts of successful requests / duration
- goodput = successful requests meeting every SLO (ttft, tpot, e2el in ms) / duration;
  a one-token request counts with TPOT 0, as in vLLM
- statistics: mean, median, std (numpy's, ddof 0) and percentiles (numpy's linear interpolation).
  An empty list (e.g. no request with two tokens) reports 0, as vLLM does.

Failed requests are counted in `failed` and left out of every latency statistic and token count.
"""

import datetime
import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from infer.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el")  # vLLM's --goodput names, each in ms
DEFAULT_PERCENTILES = (50, 90, 95, 99)
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
RESULTS_ENV_VAR = "INFER_RESULTS_DIR"


@dataclass(frozen=True)
class RequestLatencies:
    """One successful request's latencies in ms; `tpot_ms` is None for a one-token answer."""

    ttft_ms: float
    tpot_ms: float | None
    e2el_ms: float
    itls_ms: tuple[float, ...]


def request_latencies_ms(record: RequestRecord) -> RequestLatencies:
    """TTFT, TPOT, E2EL and the inter-chunk gaps of one successful request, in ms."""
    if not record.success:
        raise ValueError(f"a failed request has no latencies (error: {record.error or 'no output chunk received'})")
    record.validate()
    times = record.chunk_times
    ttft_s = times[0] - record.send_time
    e2el_s = times[-1] - record.send_time  # ends at the last chunk that carried output, as in vLLM
    n = record.num_output_tokens
    tpot_ms = (e2el_s - ttft_s) / (n - 1) * 1e3 if n > 1 else None
    itls_ms = tuple((later - earlier) * 1e3 for earlier, later in zip(times, times[1:]))
    return RequestLatencies(ttft_s * 1e3, tpot_ms, e2el_s * 1e3, itls_ms)


def percentile_key(p: float) -> str:
    """vLLM's name for a percentile: 99 -> "p99", 99.9 -> "p99.9"."""
    return f"p{int(p)}" if float(p) == int(p) else f"p{p}"


def summarize_ms(values_ms: Sequence[float], percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """{"mean", "median", "std", "p50", ...} of `values_ms`; all 0 for an empty list, as in vLLM."""
    values = np.asarray(list(values_ms) or [0.0], dtype=float)
    summary = {"mean": float(np.mean(values)), "median": float(np.median(values)), "std": float(np.std(values))}
    for p in percentiles:
        if not 0 <= p <= 100:
            raise ValueError(f"percentiles must lie in [0, 100], got {p}")
        summary[percentile_key(p)] = float(np.percentile(values, p))  # linear interpolation, numpy's default
    return summary


def validate_slo(slo_ms: dict[str, float] | None) -> dict[str, float]:
    """The SLOs as {"ttft": ms, ...}; an unknown key or a negative value is an error."""
    slo_ms = dict(slo_ms or {})
    for key, value in slo_ms.items():
        if key not in SLO_KEYS:
            hint = (
                f" (write {key.removesuffix('_ms')!r}: the value is already in ms)"
                if key.removesuffix("_ms") in SLO_KEYS
                else ""
            )
            raise ValueError(f"unknown SLO {key!r}{hint}; valid SLO keys are {', '.join(SLO_KEYS)} (values in ms)")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"SLO {key!r} must be a finite number of ms >= 0, got {value!r}")
    return slo_ms


def slo_from_profile(profile) -> dict[str, float]:
    """A profile's SLOs (infer.profiles.SLO) in vLLM's --goodput form: {"ttft": ms, "tpot": ms}."""
    return {"ttft": profile.slo.ttft_ms, "tpot": profile.slo.tpot_ms}


def meets_slo(latencies: RequestLatencies, slo_ms: dict[str, float]) -> bool:
    """Does one request meet every SLO? A one-token request counts with TPOT 0 (vLLM does the same)."""
    observed = {"ttft": latencies.ttft_ms, "tpot": latencies.tpot_ms or 0.0, "e2el": latencies.e2el_ms}
    return all(observed[key] <= limit for key, limit in slo_ms.items())


def benchmark_duration_s(records: Sequence[RequestRecord]) -> float:
    """First send to last finish over all requests, the failed ones included."""
    _check_records(records)
    return max(r.finish_time for r in records) - min(r.send_time for r in records)


def request_goodput(
    records: Sequence[RequestRecord], slo_ms: dict[str, float], duration_s: float | None = None
) -> float:
    """Successful requests per second that meet every SLO in `slo_ms`."""
    slo_ms = validate_slo(slo_ms)
    duration_s = benchmark_duration_s(records) if duration_s is None else duration_s
    good = sum(meets_slo(request_latencies_ms(r), slo_ms) for r in records if r.success)
    return good / duration_s


def calculate_metrics(
    records: Sequence[RequestRecord],
    *,
    slo_ms: dict[str, float] | None = None,
    percentiles: Iterable[float] = DEFAULT_PERCENTILES,
    duration_s: float | None = None,
) -> dict:
    """vLLM's serving metrics of a run, under vLLM's result key names.

    `duration_s` defaults to the first send -> last finish span of the records; pass the wall
    time of the run instead to match vLLM's own clock (which also covers the client's overhead).
    `request_goodput` is None unless SLOs are given, as in vLLM."""
    _check_records(records)
    slo_ms = validate_slo(slo_ms)
    percentiles = tuple(percentiles)
    for i, record in enumerate(records):
        record.validate(i)
    duration_s = benchmark_duration_s(records) if duration_s is None else duration_s
    if not duration_s > 0:
        raise ValueError(f"the benchmark duration must be > 0 s, got {duration_s}; were all the times equal?")

    ok = [r for r in records if r.success]
    if not ok:
        warnings.warn("every request failed: latency statistics are reported as 0", stacklevel=2)
    latencies = [request_latencies_ms(r) for r in ok]
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(r.num_output_tokens for r in ok)
    result = {
        "duration": duration_s,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration_s,
        "request_goodput": (sum(meets_slo(lat, slo_ms) for lat in latencies) / duration_s) if slo_ms else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
    }
    samples = {
        "ttft": [lat.ttft_ms for lat in latencies],
        "tpot": [lat.tpot_ms for lat in latencies if lat.tpot_ms is not None],  # only requests with > 1 token
        "itl": [gap for lat in latencies for gap in lat.itls_ms],  # pooled, not averaged per request first
        "e2el": [lat.e2el_ms for lat in latencies],
    }
    for metric in LATENCY_METRICS:
        for stat, value in summarize_ms(samples[metric], percentiles).items():
            result[f"{stat}_{metric}_ms"] = value
    return result


LITTLES_LAW_TOLERANCE = 0.10  # relative: a closed loop loses a little to its ramp-up and drain


def littles_law_in_flight(metrics: dict) -> float:
    """Requests in flight on average, by Little's law L = lambda x W: the request throughput times
    the MEAN end-to-end latency, in seconds (the law is about means: a median would not do).

    Over a run that starts and ends with nothing in flight, this is exactly the time-average number
    of requests sent and not yet finished. So it checks the load, not the server: a closed loop
    that keeps c requests in flight (a new one the moment one ends) comes back to about c; a
    client that leaves gaps, a long drain at the end, or a burst of more than c requests does not."""
    return metrics["request_throughput"] * metrics["mean_e2el_ms"] / 1e3


def littles_law_holds(metrics: dict, concurrency: int, tolerance: float = LITTLES_LAW_TOLERANCE) -> bool:
    """Did the run keep `concurrency` requests in flight on average, within `tolerance` (relative)?"""
    return abs(littles_law_in_flight(metrics) / concurrency - 1) <= tolerance


def _check_records(records) -> None:
    if records is None or len(records) == 0:
        raise ValueError("no request records: a benchmark needs at least one request")
    bad = [type(r).__name__ for r in records if not isinstance(r, RequestRecord)]
    if bad:
        raise TypeError(f"expected infer.records.RequestRecord items, got {bad[0]}")


# ---------------------------------------------------------------- results files


def results_dir() -> Path:
    """Where results JSON goes: $INFER_RESULTS_DIR, else beside redirected figures ($INFER_FIGURES_DIR,
    set by the tests and `make site`, so that their runs never overwrite committed results), else results/."""
    from infer.paths import REPO_ROOT
    from infer.plotting import FIGURES_ENV_VAR

    folder = os.environ.get(RESULTS_ENV_VAR) or os.environ.get(FIGURES_ENV_VAR) or REPO_ROOT / "results"
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def results_document(runs: list[dict], meta: dict, **extra) -> dict:
    """A results file's content: provenance metadata, then one vLLM-keyed result per run."""
    required = ("device", "model", "weights", "dtype", "profile", "date", "commit", "torch", "transformers")
    missing = [key for key in required if key not in meta]
    if missing:
        raise ValueError(f"metadata lacks {', '.join(missing)}: build it with infer.provenance.provenance(lm)")
    return {
        "metadata": dict(meta),
        **extra,
        "saved_at": datetime.datetime.now().isoformat(timespec="seconds"),
        "runs": list(runs),
    }


def save_results(name: str, runs: list[dict], meta: dict, **extra) -> Path:
    """Write results_dir()/<name>.json and return its path."""
    path = results_dir() / f"{name}.json"
    path.write_text(json.dumps(results_document(runs, meta, **extra), indent=2) + "\n")
    return path


def load_results(path: str | os.PathLike) -> dict:
    return json.loads(Path(path).read_text())
