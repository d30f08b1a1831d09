"""Lab 03 code checks: per-request latencies, the run's metrics, goodput, and a benchmark grid.

Each check builds fresh random request records (streamed, one-token, multi-token chunks and
failed requests, in random order) and compares the student's function with infer.metrics."""

import math
import random

from infer.course.checks import Case, Verdict, check_function
from infer.metrics import calculate_metrics, request_goodput, request_latencies_ms
from infer.profiles import BenchmarkGrid
from infer.records import RequestRecord

# The keys the lab's serving_metrics() returns (a subset of vLLM's result keys).
LAB_METRIC_KEYS = ("duration", "completed", "failed", "total_output_tokens", "request_throughput",
                   "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
                   "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "std_e2el_ms", "p99_e2el_ms")


def random_record(rng: random.Random, kind: str | None = None, t0: float = 0.0) -> RequestRecord:
    """One random record: kind "streamed", "one_token", "chunked" or "failed" (random if None)."""
    kind = kind or rng.choice(["streamed", "streamed", "one_token", "chunked", "failed"])
    send = t0 + rng.uniform(0, 2.0)
    prompt_len = rng.randint(1, 4096)
    if kind == "failed":
        return RequestRecord(prompt_len, send, error="connection reset", end_time=send + rng.uniform(0, 3.0))
    first = send + rng.uniform(0.01, 1.5)
    chunks = 1 if kind == "one_token" else rng.randint(2, 40)
    times = [first]
    for _ in range(chunks - 1):
        times.append(times[-1] + rng.expovariate(1 / 0.03))
    tokens = None
    if kind == "chunked":  # at least one chunk carries several tokens, so chunks and tokens differ
        tokens = [rng.randint(1, 4) for _ in times]
        tokens[rng.randrange(len(tokens))] = rng.randint(2, 4)
    return RequestRecord(prompt_len, send, chunk_times=times, chunk_tokens=tokens)


def random_run(rng: random.Random, n: int | None = None) -> list[RequestRecord]:
    """A run with at least one of each kind of record, shuffled."""
    n = n or rng.randint(6, 30)
    records = [random_record(rng, kind) for kind in ("streamed", "one_token", "chunked", "failed")]
    records += [random_record(rng) for _ in range(n - len(records))]
    rng.shuffle(records)
    return records


def _describe(record: RequestRecord) -> str:
    if not record.success:
        return "a failed request"
    tokens = record.num_output_tokens
    chunked = " in multi-token chunks" if record.chunk_tokens and tokens != len(record.chunk_times) else ""
    return f"a request with {tokens} output token{'s' if tokens != 1 else ''}{chunked}"


def _reference_latencies(record):
    lat = request_latencies_ms(record)
    return lat.ttft_ms, lat.tpot_ms, lat.e2el_ms


def _compare_latencies(got, expected) -> str | None:
    if not isinstance(got, tuple) or len(got) != 3:
        return f"expected a tuple (ttft_ms, tpot_ms, e2el_ms), got {type(got).__name__} {got!r}"
    for name, g, e in zip(("ttft_ms", "tpot_ms", "e2el_ms"), got, expected):
        if e is None:
            if g is not None:
                return f"{name}: a one-token request has no TPOT: return None, got {g!r}"
            continue
        if g is None or isinstance(g, bool) or not isinstance(g, (int, float)) and not hasattr(g, "item"):
            return f"{name}: expected a number in ms, got {g!r}"
        if not math.isclose(float(g), e, rel_tol=1e-6, abs_tol=1e-9):
            slip = " (in seconds? expected ms)" if math.isclose(float(g) * 1e3, e, rel_tol=1e-6) else ""
            return f"{name}: got {float(g):.6g}, expected {e:.6g}{slip}"
    return None


def check_latencies(student_latencies_ms, requests: int = 12) -> None:
    rng = random.Random()
    kinds = ["streamed", "one_token", "chunked"] + [rng.choice(["streamed", "one_token", "chunked"]) for _ in range(requests - 3)]
    cases = []
    for kind in kinds:
        record = random_record(rng, kind)
        cases.append(Case(_describe(record), (record,)))
    check_function("03.lab.latencies", student_latencies_ms, _reference_latencies, cases, _compare_latencies,
                   f"TTFT, TPOT and E2EL match on {requests} random requests (one-token and multi-token chunks included)")


def _compare_dicts(keys):
    def compare(got, expected) -> str | None:
        if not isinstance(got, dict):
            return f"expected a dict, got {type(got).__name__}"
        for key in keys:
            if key not in got:
                return f"the key {key!r} is missing"
            g, e = got[key], expected[key]
            if g is None or isinstance(g, bool) or not isinstance(g, (int, float)) and not hasattr(g, "item"):
                return f"{key}: expected a number, got {g!r}"
            if not math.isclose(float(g), float(e), rel_tol=1e-6, abs_tol=1e-9):
                return f"{key}: got {float(g):.6g}, expected {float(e):.6g}{_hint(key, float(g), float(e))}"
        return None

    return compare


def _hint(key: str, got: float, expected: float) -> str:
    if key.endswith("_ms") and math.isclose(got * 1e3, expected, rel_tol=1e-6):
        return " (in seconds? expected ms)"
    if "itl" in key:
        return " (pool every gap of every request; do not average per request first)"
    if "tpot" in key:
        return " (TPOT statistics take only requests with more than one output token)"
    if key.startswith("std"):
        return " (numpy's np.std, ddof=0)"
    if key in ("duration", "request_throughput", "output_throughput", "total_token_throughput"):
        return " (the duration runs from the first send to the last finish, failed requests included)"
    if key in ("completed", "failed", "total_output_tokens"):
        return " (failed requests count only in `failed`)"
    return ""


def check_serving_metrics(student_serving_metrics, runs: int = 5) -> None:
    rng = random.Random()
    cases = []
    for _ in range(runs):
        records = random_run(rng)
        failed = sum(not r.success for r in records)
        cases.append(Case(f"a run of {len(records)} requests ({failed} failed, one-token ones included)", (records,)))
    check_function("03.lab.serving_metrics", student_serving_metrics, lambda records: calculate_metrics(records),
                   cases, _compare_dicts(LAB_METRIC_KEYS),
                   f"{len(LAB_METRIC_KEYS)} metrics match vLLM's definitions on {runs} random runs")


def check_goodput(student_goodput, runs: int = 8) -> None:
    rng = random.Random()
    cases = []
    slos = [{"ttft": 500, "tpot": 20}, {"tpot": 25}, {"e2el": 1500}, {"ttft": 800, "tpot": 30, "e2el": 2000}]
    for i in range(runs):
        records = random_run(rng)
        slo = slos[i % len(slos)] if i < len(slos) else {k: rng.choice(v) for k, v in
                                                          {"ttft": [300, 700, 1200], "tpot": [20, 30, 50]}.items()}
        cases.append(Case(f"SLO {slo} on {len(records)} requests", (records, slo)))
    check_function("03.lab.goodput", student_goodput, request_goodput, cases, _goodput_compare(),
                   f"goodput matches on {runs} random runs and SLO sets")


def _goodput_compare():
    def compare(got, expected) -> str | None:
        if got is None or isinstance(got, bool) or not isinstance(got, (int, float)) and not hasattr(got, "item"):
            return f"expected a number of requests per second, got {got!r}"
        if not math.isclose(float(got), expected, rel_tol=1e-6, abs_tol=1e-12):
            return (f"got {float(got):.4g} req/s, expected {expected:.4g} (a request is good when it meets every SLO; "
                    f"a one-token request counts with TPOT 0; divide by the whole duration)")
        return None

    return compare


# ---------------------------------------------------------------- grid design


def grade_grid(grid) -> Verdict:
    """The lab's grid requirements, checked one by one (several designs pass)."""
    qid = "03.lab.grid"
    if not isinstance(grid, BenchmarkGrid):
        return Verdict(qid, False, f"expected an infer.profiles.BenchmarkGrid, got {type(grid).__name__}")
    lengths = [*grid.input_lens, *grid.output_lens]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths):
        return Verdict(qid, False, "input and output lengths must be exact token counts: positive ints")
    if 2048 not in grid.input_lens or 64 not in grid.output_lens:
        return Verdict(qid, False, "the grid must contain the seed's workload: 2048 input and 64 output tokens")
    if len(grid.input_lens) < 2:
        return Verdict(qid, False, "use at least two input lengths, so that the prefill's share of TTFT shows")
    conc = list(grid.concurrency)
    if not conc or conc[0] != 1 or conc != sorted(set(conc)) or max(conc) < 32:
        return Verdict(qid, False, "concurrency must start at 1, rise strictly, and reach at least 32")
    if grid.num_prompts < 4 * max(conc):
        return Verdict(qid, False, f"num_prompts={grid.num_prompts} gives the top concurrency fewer than 4 rounds; "
                                   f"use at least {4 * max(conc)}")
    cells = len(grid.input_lens) * len(grid.output_lens) * len(conc)
    if cells > 24:
        return Verdict(qid, False, f"{cells} cells is more than the 24 the time budget allows")
    return Verdict(qid, True, f"{cells} cells, {grid.num_prompts} prompts each, concurrency 1..{max(conc)}")


def check_grid(grid) -> None:
    print(grade_grid(grid).line)
