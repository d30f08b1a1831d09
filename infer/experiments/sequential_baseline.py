"""The week 03 benchmark harness, and the baseline every later week has to beat: `transformers`'
`generate()` serving requests one at a time.

How concurrency is modelled, honestly. A client keeps `concurrency` requests in flight: it sends
that many at once, and sends the next one the moment one finishes (vLLM's --max-concurrency with
an infinite request rate). The server is `generate()`, which can only serve one request at a time,
so the others wait in a first-come-first-served queue and their TTFT includes that wait. Client
and server run in one Python thread here: a request is "sent" (its send time taken) when the
request that freed its slot finishes, and the server then takes the oldest waiting request. For a
sequential server this gives the very timeline a separate client process would see, minus the
network; every time in a record is a real clock reading, nothing is simulated.

Per-token timestamps come from a `transformers` streamer: `generate()` calls `put()` once with the
prompt, then once per new token with that token already copied to the host. The copy waits for the
device, so each timestamp is taken after the token really exists (the device is synchronized).
(Checked on transformers 5.24, tests/test_benchmark.py. On Apple's "mps" device transformers streams
each token one step late to avoid that wait, so timestamps there lag by one decode step.)
"""

import time
from collections import deque
from dataclasses import asdict, dataclass

import torch
from transformers.generation.streamers import BaseStreamer

from infer import hf
from infer.metrics import DEFAULT_PERCENTILES, calculate_metrics, percentile_key, slo_from_profile
from infer.profiles import BenchmarkGrid
from infer.prompts import random_prompt_ids
from infer.records import RequestRecord
from infer.timing import synchronize

BASELINE_BACKEND = "transformers-generate-sequential"


class TokenTimestamps(BaseStreamer):
    """A streamer that notes when each new token reaches the host (time.perf_counter, seconds)."""

    def __init__(self):
        self.prompt_seen = False
        self.times: list[float] = []
        self.tokens: list[int] = []  # tokens per put() call: 1 for a batch of one
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        now = time.perf_counter()
        if not self.prompt_seen:  # the first call hands over the prompt, not a new token
            self.prompt_seen = True
            return
        self.times.append(now)
        self.tokens.append(int(value.shape[-1]) if value.dim() > 1 else 1)

    def end(self) -> None:
        self.ended = True


@torch.no_grad()
def generate_with_timestamps(model, prompt_ids: torch.Tensor, output_len: int) -> tuple[torch.Tensor, TokenTimestamps]:
    """Greedy `generate()` of exactly `output_len` tokens (EOS disabled), with per-token timestamps."""
    if prompt_ids.shape[0] != 1:
        raise ValueError(f"one request at a time: expected prompt_ids of shape [1, n], got {tuple(prompt_ids.shape)}")
    streamer = TokenTimestamps()
    return hf.greedy_generate(model, prompt_ids, output_len, streamer=streamer), streamer


def serve_one(model, prompt_ids: torch.Tensor, output_len: int, send_time: float) -> RequestRecord:
    """Serve one request with `generate()`; a request that raises becomes a failed record, not a crash."""
    prompt_len = int(prompt_ids.shape[-1])
    try:
        _, stamps = generate_with_timestamps(model, prompt_ids, output_len)
    except Exception as exc:  # noqa: BLE001 - a benchmark counts failures instead of stopping
        synchronize(prompt_ids.device)
        return RequestRecord(prompt_len, send_time, error=f"{type(exc).__name__}: {exc}", end_time=time.perf_counter())
    return RequestRecord(prompt_len, send_time, chunk_times=stamps.times, chunk_tokens=stamps.tokens)


def run_sequential_server(
    model, prompts: torch.Tensor, output_len: int, concurrency: int, progress=None
) -> list[RequestRecord]:
    """Serve each row of `prompts` [n, len] one at a time, with `concurrency` requests in flight.

    The client sends `concurrency` requests at once and a new one whenever one finishes; the
    server takes the oldest waiting request (FIFO). Returns the records in the order served."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    device = prompts.device
    waiting_to_send = deque(range(prompts.shape[0]))
    in_flight = deque()  # (prompt index, send time), oldest first
    synchronize(device)
    start = time.perf_counter()  # the first `concurrency` requests leave together
    while waiting_to_send and len(in_flight) < concurrency:
        in_flight.append((waiting_to_send.popleft(), start))
    records = []
    while in_flight:
        index, send_time = in_flight.popleft()
        records.append(serve_one(model, prompts[index : index + 1], output_len, send_time))
        if progress is not None:
            progress.update(1)
        if waiting_to_send:  # the finished request freed a slot: the client sends the next at once
            in_flight.append((waiting_to_send.popleft(), time.perf_counter()))
    return records


# ---------------------------------------------------------------- the grid


@dataclass(frozen=True)
class BaselineSizes:
    """How many requests the sequential baseline measures per grid cell, and how many warm-ups.

    A one-at-a-time server's throughput does not depend on how many requests wait, so the
    baseline does not need the grid's full prompt count for its throughput (200 sequential
    requests per cell would take an hour on the gpu profile). Its latency percentiles do need
    requests: `min_prompts` is sized so that the percentiles it reports have a tail to stand on
    (`supported_percentiles`)."""

    min_prompts: int  # at least this many measured requests per cell
    rounds: int  # and at least `rounds` x concurrency, so every slot is refilled
    warmup: int  # untimed requests of the cell's shape before it


BASELINE_SIZES = {
    "cpu": BaselineSizes(min_prompts=40, rounds=2, warmup=1),  # p50, p90 and p95 supported
    "gpu": BaselineSizes(min_prompts=20, rounds=2, warmup=2),  # p50 and p90 (p95 from concurrency 32's 64)
    # make gpu-check's 10 minutes: every cell of its grid, p50 only (its percentiles are not the point).
    "gpu-check": BaselineSizes(min_prompts=4, rounds=1, warmup=1),
    # The stand-in for the gpu profile runs every cell of the grid once, no more: it checks paths, not speed.
    "gpu-dryrun": BaselineSizes(min_prompts=1, rounds=1, warmup=1),
}

TAIL_REQUESTS = 2  # a percentile is reported only when at least this many requests lie in the tail beyond it


def supported_percentiles(n: int, percentiles) -> list[float]:
    """The percentiles that `n` requests can support: those with at least TAIL_REQUESTS requests
    beyond them. A p95 of 8 requests is an interpolation between the two slowest: it needs 40;
    a p99 needs 200."""
    return [p for p in percentiles if n * (100 - p) / 100 >= TAIL_REQUESTS]


def sample_counts(records: list[RequestRecord]) -> dict[str, int]:
    """How many values each latency statistic of `calculate_metrics` stands on: one per successful
    request for TTFT and E2EL, one per request with more than one token for TPOT, one per gap
    between chunks for ITL (it pools them)."""
    ok = [r for r in records if r.success]
    return {
        "ttft": len(ok),
        "e2el": len(ok),
        "tpot": sum(r.num_output_tokens > 1 for r in ok),
        "itl": sum(len(r.chunk_times) - 1 for r in ok),
    }


def drop_unsupported_percentiles(run: dict, counts: dict[str, int]) -> dict:
    """`run` without the tail percentile keys that its samples cannot support (`supported_percentiles`):
    vLLM's client writes every percentile it is asked for, the baseline only those it reports, so
    that a results file never holds a p99 of 40 requests. The p50 stays, as the median does: it
    needs no tail. `counts`: from `sample_counts`."""
    kept = dict(run)
    for metric, n in counts.items():
        for p in DEFAULT_PERCENTILES:
            if p > 50 and p not in supported_percentiles(n, (p,)):
                kept.pop(f"{percentile_key(p)}_{metric}_ms", None)
    return kept


def prompts_per_cell(grid: BenchmarkGrid, sizes: BaselineSizes, concurrency: int) -> int:
    """Measured requests of one cell (the ramp-up requests come on top, see `steady_state`)."""
    return min(grid.num_prompts, max(sizes.min_prompts, sizes.rounds * concurrency))


def steady_state(records: list[RequestRecord], concurrency: int) -> tuple[list[RequestRecord], float]:
    """The records to measure, without the ramp-up, and the time the server spent on them (s).

    The client sends its first `concurrency` requests at once, so the first of them waits for
    nobody, the second for one request, ...: only from the `concurrency`-th on does every request
    find the queue full, as it will for the rest of the run. Those first `concurrency - 1` requests
    (served first, FIFO) are left out. The duration starts when the server turns to the first
    measured request (when the last ramp-up request finishes), so that throughput counts only the
    work done for the requests it counts."""
    ramp_up = concurrency - 1
    if len(records) <= ramp_up:
        raise ValueError(f"{len(records)} records leave nothing to measure after a ramp-up of {ramp_up}")
    measured = records[ramp_up:]
    start = records[ramp_up - 1].finish_time if ramp_up else measured[0].send_time
    return measured, max(r.finish_time for r in measured) - start


def run_baseline_grid(
    lm,
    grid: BenchmarkGrid | None = None,
    *,
    sizes: BaselineSizes | None = None,
    slo_ms: dict | None = None,
    progress: bool = True,
    seed: int = 0,
) -> tuple[list[dict], dict]:
    """Run the sequential `generate()` baseline over every cell of the grid.

    Returns (runs, records): one vLLM-keyed result per cell (plus the cell's settings; percentiles
    only where its samples support them, `drop_unsupported_percentiles`), and the raw
    measured records of each cell keyed by (input_len, output_len, concurrency). Every cell of one
    input length serves the same prompts (exact-length token ids, seeded), after `sizes.warmup`
    untimed requests; the ramp-up requests of `steady_state` are served but not measured."""
    from tqdm.auto import tqdm

    profile = lm.profile
    grid = grid or profile.grid
    sizes = sizes or BASELINE_SIZES[profile.name]
    slo_ms = slo_from_profile(profile) if slo_ms is None else slo_ms
    device = next(lm.model.parameters()).device
    cells = grid.cells()
    total = sum(prompts_per_cell(grid, sizes, c) + c - 1 for _, _, c in cells)
    bar = tqdm(total=total, desc="baseline requests", disable=not progress)
    runs, records = [], {}
    for input_len, output_len, concurrency in cells:
        n = prompts_per_cell(grid, sizes, concurrency)
        prompts = random_prompt_ids(lm.config, input_len, batch=n + concurrency - 1, seed=seed + input_len).to(device)
        for _ in range(sizes.warmup):  # first calls pay for allocations, caches, kernel selection
            generate_with_timestamps(lm.model, prompts[:1], output_len)
        bar.set_postfix(input=input_len, output=output_len, concurrency=concurrency)
        served = run_sequential_server(lm.model, prompts, output_len, concurrency, progress=bar)
        measured, duration_s = steady_state(served, concurrency)
        records[(input_len, output_len, concurrency)] = measured
        run = {
            "backend": BASELINE_BACKEND,
            "input_len": input_len,
            "output_len": output_len,
            "max_concurrency": concurrency,
            "request_rate": "inf",
            "num_prompts": n,
            "num_warmups": sizes.warmup,
            "num_ramp_up": concurrency - 1,
            **calculate_metrics(measured, slo_ms=slo_ms, duration_s=duration_s),
        }
        runs.append(drop_unsupported_percentiles(run, sample_counts(measured)))
    bar.close()
    return runs, records


def baseline_settings(grid: BenchmarkGrid, sizes: BaselineSizes, slo_ms: dict) -> dict:
    """The settings a results file records next to its runs."""
    return {
        "grid": asdict(grid),
        "baseline_sizes": asdict(sizes),
        "goodput_slo_ms": dict(slo_ms),
        "concurrency_model": "client keeps max_concurrency requests in flight; the server serves them "
        "one at a time, first come first served; TTFT includes the queueing",
        "ramp_up": "the first max_concurrency - 1 requests (sent together, so they queue less) are served but "
        "not measured; duration runs from the server's start on the first measured request",
        "percentiles_reported": f"only those with at least {TAIL_REQUESTS} measured values beyond them (requests "
        "for TTFT, TPOT and E2EL; gaps between chunks for ITL, which pools them); the others are left out",
    }


# ---------------------------------------------------------------- tables and figures


TABLE_PERCENTILES = (50, 90, 95)


def format_runs_table(runs: list[dict]) -> str:
    """One line per run: throughput, goodput, and TTFT/TPOT percentiles (ms), each only where the
    run's n measured requests support it (`supported_percentiles`; "-" elsewhere)."""
    ttft_head = " ".join(f"{f'p{p}':>7}" for p in TABLE_PERCENTILES)
    lines = [
        f"{'in':>5} {'out':>4} {'conc':>4} {'n':>3} | {'req/s':>6} {'good/s':>6} {'out tok/s':>9} | "
        f"TTFT ms {ttft_head} | TPOT ms {ttft_head}"
    ]
    for r in runs:
        goodput = "-" if r.get("request_goodput") is None else f"{r['request_goodput']:.2f}"
        shown = supported_percentiles(r["completed"], TABLE_PERCENTILES)
        cells = {
            metric: " ".join(
                f"{r[f'p{p}_{metric}_ms']:>7.1f}" if p in shown else f"{'-':>7}" for p in TABLE_PERCENTILES
            )
            for metric in ("ttft", "tpot")
        }
        lines.append(
            f"{r['input_len']:>5} {r['output_len']:>4} {r['max_concurrency']:>4} {r['completed']:>3} | "
            f"{r['request_throughput']:>6.2f} {goodput:>6} {r['output_throughput']:>9.1f} | "
            f"{'':7} {cells['ttft']} | {'':7} {cells['tpot']}"
        )
    return "\n".join(lines)


def _series(runs: list[dict]):
    """Runs grouped by (input_len, output_len), each sorted by concurrency."""
    groups: dict[tuple[int, int], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["input_len"], r["output_len"]), []).append(r)
    return {key: sorted(rs, key=lambda r: r["max_concurrency"]) for key, rs in sorted(groups.items())}


def plot_throughput(ax, runs: list[dict]) -> None:
    """Output tokens/s against concurrency, one line per (input, output) length."""
    for (input_len, output_len), rs in _series(runs).items():
        ax.plot(
            [r["max_concurrency"] for r in rs],
            [r["output_throughput"] for r in rs],
            marker="o",
            label=f"{input_len} in / {output_len} out",
        )
    concurrencies = sorted({r["max_concurrency"] for r in runs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)


def plot_latency(ax, runs: list[dict], metric: str) -> None:
    """p50 (solid) and the highest tail percentile that every run supports (dashed) of `metric`
    ("ttft" or "tpot") against concurrency."""
    fewest = min(r["completed"] for r in runs)
    tails = supported_percentiles(fewest, [p for p in TABLE_PERCENTILES if p > 50])
    for index, ((input_len, _output_len), rs) in enumerate(_series(runs).items()):
        x = [r["max_concurrency"] for r in rs]
        color = f"C{index}"
        ax.plot(x, [r[f"p50_{metric}_ms"] for r in rs], marker="o", color=color, label=f"{input_len} in: p50")
        if tails:
            ax.plot(
                x,
                [r[f"p{tails[-1]}_{metric}_ms"] for r in rs],
                marker="^",
                color=color,
                linestyle="--",
                label=f"{input_len} in: p{tails[-1]}",
            )
    concurrencies = sorted({r["max_concurrency"] for r in runs})
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"concurrency (requests in flight; n >= {fewest} measured per point)")
    ax.set_ylabel(f"{metric.upper()} (ms)")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.3)


def plot_request_timeline(ax, record: RequestRecord, service_start: float | None = None) -> None:
    """One request on a time axis (ms after it was sent), with TTFT, ITL, TPOT and E2EL marked.

    `service_start`: when the server began working on it (a queued request waits before that)."""
    from infer.metrics import request_latencies_ms

    lat = request_latencies_ms(record)
    t = [(c - record.send_time) * 1e3 for c in record.chunk_times]
    if service_start is not None and service_start > record.send_time:
        wait = (service_start - record.send_time) * 1e3
        ax.barh(2, wait, left=0, height=0.5, color="0.8", label=f"queued: {wait:.0f} ms")
        ax.barh(2, t[0] - wait, left=wait, height=0.5, color="C1", alpha=0.7, label="prefill (gives the first token)")
    else:
        ax.barh(2, t[0], left=0, height=0.5, color="C1", alpha=0.7, label="prefill (gives the first token)")
    ax.barh(2, t[-1] - t[0], left=t[0], height=0.5, color="C0", alpha=0.5, label="decode steps")
    ax.vlines(t, 1.7, 2.3, color="k", linewidth=0.8)
    ax.plot([0], [2], marker=">", color="k", markersize=8)
    ax.annotate("", xy=(t[0], 1.1), xytext=(0, 1.1), arrowprops=dict(arrowstyle="<->"))
    ax.text(t[0] / 2, 1.0, f"TTFT {lat.ttft_ms:.1f} ms", ha="center", va="top", fontsize=8)
    ax.annotate("", xy=(t[-1], 0.4), xytext=(0, 0.4), arrowprops=dict(arrowstyle="<->"))
    ax.text(t[-1] / 2, 0.3, f"E2EL {lat.e2el_ms:.1f} ms", ha="center", va="top", fontsize=8)
    if len(t) > 1:
        ax.annotate("", xy=(t[1], 2.9), xytext=(t[0], 2.9), arrowprops=dict(arrowstyle="<->", color="C3"))
        ax.text(t[1], 3.0, f"one ITL: {lat.itls_ms[0]:.1f} ms", color="C3", ha="left", va="bottom", fontsize=8)
        ax.text(
            t[-1],
            1.62,
            f"TPOT = ({lat.e2el_ms:.1f} - {lat.ttft_ms:.1f}) / {record.num_output_tokens - 1} = {lat.tpot_ms:.1f} ms",
            ha="right",
            va="top",
            fontsize=8,
            color="C0",
        )
    ax.set_yticks([2], ["request"])
    ax.set_ylim(-0.2, 3.6)
    ax.set_xlim(-0.02 * t[-1], t[-1] * 1.05)
    ax.set_xlabel("time since the request was sent (ms); ticks: output tokens arriving")
    ax.legend(loc="upper left", fontsize=7, ncol=3)
