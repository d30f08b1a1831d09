"""Lab 03 code checks: per-request latencies, the run's metrics, goodput, and a benchmark grid.

Each check builds random request records seeded by its id (streamed, one-token, multi-token
chunks and failed requests, in random order) and compares the student's function with
infer.metrics. When a value is wrong, the check recomputes it the ways students get it wrong
(failed requests counted, `<` for `<=`...) and names the one that matches."""

import math
import random

from infer.course.checks import Case, Verdict, as_number, case_rng, distinct_pair, grade_function
from infer.metrics import benchmark_duration_s, calculate_metrics, request_goodput, request_latencies_ms
from infer.profiles import BenchmarkGrid
from infer.records import RequestRecord

# The keys the lab's serving_metrics() returns (a subset of vLLM's result keys).
LAB_METRIC_KEYS = (
    "duration",
    "completed",
    "failed",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "p99_itl_ms",
    "std_e2el_ms",
    "p99_e2el_ms",
)


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
    if got is None:
        return "returned None (a missing `return`?); expected a tuple (ttft_ms, tpot_ms, e2el_ms)"
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        shown = type(got).__name__ + (f" of {len(got)} items" if isinstance(got, (tuple, list, dict)) else "")
        return f"expected a tuple (ttft_ms, tpot_ms, e2el_ms), got a {shown}"
    for name, g, e in zip(("ttft_ms", "tpot_ms", "e2el_ms"), got, expected):
        if e is None:
            if g is not None:
                return f"{name}: a one-token request has no TPOT: return None, got {g!r}"
            continue
        value, problem = as_number(g, "ms")
        if problem:
            return f"{name}: {problem}"
        if not math.isclose(value, e, rel_tol=1e-6, abs_tol=1e-9):
            slip = " (in seconds? expected ms)" if math.isclose(value * 1e3, e, rel_tol=1e-6) else ""
            shown_got, shown_expected = distinct_pair(value, e)
            return f"{name}: got {shown_got}, expected {shown_expected}{slip}"
    return None


def grade_latencies(student_latencies_ms, requests: int = 12) -> Verdict:
    qid = "03.lab.latencies"
    rng = case_rng(qid)
    kinds = ["streamed", "one_token", "chunked"] + [
        rng.choice(["streamed", "one_token", "chunked"]) for _ in range(requests - 3)
    ]
    cases = []
    for kind in kinds:
        record = random_record(rng, kind)
        cases.append(Case(_describe(record), (record,)))
    return grade_function(
        qid,
        student_latencies_ms,
        _reference_latencies,
        cases,
        _compare_latencies,
        f"TTFT, TPOT and E2EL match on {requests} random requests (one-token and multi-token chunks included)",
    )


def check_latencies(student_latencies_ms, requests: int = 12) -> None:
    print(grade_latencies(student_latencies_ms, requests).line)


def _compare_metrics(got, expected) -> str | None:
    """`expected` is (the library's metrics, the run's records): the records let a wrong value be
    recomputed the usual wrong ways, so the message names the mistake that was made."""
    metrics, records = expected
    if got is None:
        return "returned None (a missing `return`?); expected a dict of metrics"
    if not isinstance(got, dict):
        return f"expected a dict of metrics, got a {type(got).__name__}"
    for key in LAB_METRIC_KEYS:
        if key not in got:
            return f"the key {key!r} is missing"
        value, problem = as_number(got[key])
        if problem:
            return f"{key}: {problem}"
        if not math.isclose(value, float(metrics[key]), rel_tol=1e-6, abs_tol=1e-9):
            shown_got, shown_expected = distinct_pair(value, float(metrics[key]))
            hint = _metric_hint(key, value, float(metrics[key]), records)
            return f"{key}: got {shown_got}, expected {shown_expected}{hint}"
    return None


def _metric_hint(key: str, got: float, expected: float, records) -> str:
    """Why `got` is wrong, when it equals what a known mistake gives; otherwise what the key means."""
    done = [r for r in records if r.success]
    duration = benchmark_duration_s(records)
    completed_only = max(r.finish_time for r in done) - min(r.send_time for r in done)
    output = sum(r.num_output_tokens for r in done)
    mistakes = {
        "total_token_throughput": [
            (
                (sum(r.prompt_len for r in records) + output) / duration,
                "failed requests' prompt tokens are counted: count prompt_len of completed requests only",
            ),
            (
                (sum(r.prompt_len for r in done) + output) / completed_only,
                "the duration leaves out failed requests: it runs from the first send to the last finish of "
                "all records",
            ),
        ],
        "request_throughput": [
            (len(records) / duration, "failed requests are counted: count completed requests only"),
            (
                len(done) / completed_only,
                "the duration leaves out failed requests: it runs from the "
                "first send to the last finish of all records",
            ),
        ],
        "output_throughput": [
            (
                output / completed_only,
                "the duration leaves out failed requests: it runs from the "
                "first send to the last finish of all records",
            )
        ],
        "duration": [
            (
                completed_only,
                "the duration leaves out failed requests: it runs from the first send to the "
                "last finish of all records",
            )
        ],
    }
    for value, why in mistakes.get(key, []):
        if math.isclose(got, value, rel_tol=1e-6):
            return f" ({why})"
    if key.endswith("_ms") and math.isclose(got * 1e3, expected, rel_tol=1e-6):
        return " (in seconds? expected ms)"
    if "itl" in key:
        return " (pool every gap of every request; do not average per request first)"
    if "tpot" in key:
        return " (TPOT statistics take only requests with more than one output token)"
    if key.startswith("std"):
        return " (numpy's np.std, ddof=0)"
    if key in ("completed", "failed", "total_output_tokens"):
        return " (failed requests count only in `failed`)"
    return ""


def grade_serving_metrics(student_serving_metrics, runs: int = 5) -> Verdict:
    qid = "03.lab.serving_metrics"
    rng = case_rng(qid)
    cases = []
    for _ in range(runs):
        records = random_run(rng)
        failed = sum(not r.success for r in records)
        cases.append(Case(f"a run of {len(records)} requests ({failed} failed, one-token ones included)", (records,)))
    return grade_function(
        qid,
        student_serving_metrics,
        lambda records: (calculate_metrics(records), records),
        cases,
        _compare_metrics,
        f"{len(LAB_METRIC_KEYS)} metrics match vLLM's definitions on {runs} random runs",
    )


def check_serving_metrics(student_serving_metrics, runs: int = 5) -> None:
    print(grade_serving_metrics(student_serving_metrics, runs).line)


def _on_the_limit_run(rng: random.Random) -> tuple[list[RequestRecord], dict[str, float]]:
    """A run where some requests' TTFT and TPOT equal the SLO limits exactly: times are binary
    fractions (1/32 s), so every correct way of computing them in ms gives exactly 500 and 31.25."""
    records = []
    for i in range(8):
        send = i / 8
        ttft = 0.5 if i % 2 == 0 else rng.choice([0.25, 0.75])
        gap = 1 / 32 if i % 3 else rng.choice([1 / 64, 1 / 16])
        times = [send + ttft + gap * step for step in range(rng.randint(2, 9))]
        records.append(RequestRecord(rng.randint(1, 512), send, chunk_times=times))
    records.append(random_record(rng, "failed"))
    return records, {"ttft": 500.0, "tpot": 31.25}


def _strict_goodput(records, slo_ms) -> float:
    """Goodput with `<` in place of `<=`: the mistake of treating a value equal to the limit as a miss."""
    good = 0
    for record in records:
        if record.success:
            lat = request_latencies_ms(record)
            observed = {"ttft": lat.ttft_ms, "tpot": lat.tpot_ms or 0.0, "e2el": lat.e2el_ms}
            good += all(observed[key] < limit for key, limit in slo_ms.items())
    return good / benchmark_duration_s(records)


def _compare_goodput(got, expected) -> str | None:
    value_expected, records, slo_ms = expected
    value, problem = as_number(got, "req/s", what="a number of requests per second")
    if problem:
        return problem
    if math.isclose(value, value_expected, rel_tol=1e-6, abs_tol=1e-12):
        return None
    shown_got, shown_expected = distinct_pair(value, value_expected)
    if math.isclose(value, _strict_goodput(records, slo_ms), rel_tol=1e-6, abs_tol=1e-12):
        why = "a request whose latency equals a limit meets it: compare with <=, not <"
    else:
        why = (
            "a request is good when it meets every SLO; a one-token request counts with TPOT 0; "
            "divide by the whole duration"
        )
    return f"got {shown_got} req/s, expected {shown_expected} ({why})"


def grade_goodput(student_goodput, runs: int = 8) -> Verdict:
    qid = "03.lab.goodput"
    rng = case_rng(qid)
    cases = []
    records, slo = _on_the_limit_run(rng)
    cases.append(Case(f"SLO {slo} on {len(records)} requests, some exactly on the limits", (records, slo)))
    slos = [{"ttft": 500, "tpot": 20}, {"tpot": 25}, {"e2el": 1500}, {"ttft": 800, "tpot": 30, "e2el": 2000}]
    for i in range(runs - 1):
        records = random_run(rng)
        slo = (
            slos[i % len(slos)]
            if i < len(slos)
            else {k: rng.choice(v) for k, v in {"ttft": [300, 700, 1200], "tpot": [20, 30, 50]}.items()}
        )
        cases.append(Case(f"SLO {slo} on {len(records)} requests", (records, slo)))
    return grade_function(
        qid,
        student_goodput,
        lambda records, slo: (request_goodput(records, slo), records, slo),
        cases,
        _compare_goodput,
        f"goodput matches on {runs} random runs and SLO sets",
    )


def check_goodput(student_goodput, runs: int = 8) -> None:
    print(grade_goodput(student_goodput, runs).line)


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
        return Verdict(
            qid,
            False,
            f"num_prompts={grid.num_prompts} gives the top concurrency fewer than 4 rounds; "
            f"use at least {4 * max(conc)}",
        )
    cells = len(grid.input_lens) * len(grid.output_lens) * len(conc)
    if cells > 24:
        return Verdict(qid, False, f"{cells} cells is more than the 24 the time budget allows")
    # The same line for every grid that passes: several designs do, and nbval compares this line.
    return Verdict(qid, True, "the grid meets every requirement")


def check_grid(grid) -> None:
    print(grade_grid(grid).line)
