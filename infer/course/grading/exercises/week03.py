"""Lab 03 code checks: per-request latencies, the run's metrics, goodput, and a benchmark grid.

Each check builds random request records seeded by its id (streamed, one-token, multi-token
chunks and failed requests, in random order; at grading, also runs no student saw), plus scripted
runs for the rules the lab states (a failed request that starts or ends the run, latencies equal
to a limit), and compares the student's function with infer.metrics. When a value is wrong, the
check recomputes it the ways students get it wrong (failed requests counted, `<` for `<=`...)
and names the one that matches.

At grading the library code that computes the answers (HIDDEN_AT_GRADING) is not in the student's
kernel."""

import dataclasses
import math
import numbers
import random

from infer.course.grading.checks import Case, Verdict, as_number, case_rngs, distinct_pair, grade_function
from infer.experiments.prefill_decode import token_gaps_ms, ttft_and_tpot_ms
from infer.metrics import (
    benchmark_duration_s,
    calculate_metrics,
    meets_slo,
    request_goodput,
    request_latencies_ms,
    summarize_ms,
)
from infer.profiles import BenchmarkGrid
from infer.records import RequestRecord

LATENCIES_QID, METRICS_QID, GOODPUT_QID, GRID_QID = (
    "03.lab.latencies",
    "03.lab.serving_metrics",
    "03.lab.goodput",
    "03.lab.grid",
)
# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (
    request_latencies_ms,
    calculate_metrics,
    ttft_and_tpot_ms,
    token_gaps_ms,
    summarize_ms,
    benchmark_duration_s,
    request_goodput,
    meets_slo,
)

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
    qid = LATENCIES_QID
    cases = []
    for rng in case_rngs(qid):
        kinds = ["streamed", "one_token", "chunked"] + [
            rng.choice(["streamed", "one_token", "chunked"]) for _ in range(requests - 3)
        ]
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


DURATION_MISTAKE = (
    "your duration leaves out the failed requests; the duration runs from the earliest send to the latest "
    "finish of all records, failed ones included"
)


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
                "your total counts the prompt tokens of failed requests too; count prompt_len of completed "
                "requests only",
            ),
            ((sum(r.prompt_len for r in done) + output) / completed_only, DURATION_MISTAKE),
        ],
        "request_throughput": [
            (len(records) / duration, "your count includes failed requests; count completed requests only"),
            (len(done) / completed_only, DURATION_MISTAKE),
        ],
        "output_throughput": [(output / completed_only, DURATION_MISTAKE)],
        "duration": [(completed_only, DURATION_MISTAKE)],
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


def _later(record: RequestRecord, seconds: float) -> RequestRecord:
    """The same record, every time of it `seconds` later."""
    return dataclasses.replace(
        record,
        send_time=record.send_time + seconds,
        chunk_times=[t + seconds for t in record.chunk_times],
        end_time=None if record.end_time is None else record.end_time + seconds,
    )


def failed_at_the_edges(rng: random.Random) -> list[tuple[str, list[RequestRecord]]]:
    """Runs in which a failed request is sent first, and one in which it finishes last: the duration
    runs over every record, failed ones included."""
    first = [_later(record, 1.0) for record in random_run(rng, 8)]  # room before the first send
    first.append(RequestRecord(9, 0.5, error="connection refused", end_time=0.6))
    last = random_run(rng, 8)
    latest = max(r.finish_time for r in last)
    last.append(RequestRecord(9, latest - 0.1, error="timed out", end_time=latest + 1.0))
    return [
        (f"a run of {len(first)} requests whose first request sent failed", first),
        (f"a run of {len(last)} requests whose last to finish failed", last),
    ]


def grade_serving_metrics(student_serving_metrics, runs: int = 5) -> Verdict:
    qid = METRICS_QID
    cases = []
    for rng in case_rngs(qid):
        cases += [Case(description, (records,)) for description, records in failed_at_the_edges(rng)]
        for _ in range(runs):
            records = random_run(rng)
            failed = sum(not r.success for r in records)
            cases.append(
                Case(f"a run of {len(records)} requests ({failed} failed, one-token ones included)", (records,))
            )
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
    """A run where some requests' TTFT, TPOT and E2EL equal the SLO limits exactly: times are binary
    fractions (1/64 s), so every correct way of computing them in ms gives exactly 500, 31.25 and
    750. A failed request finishes last, so the duration is not the completed requests' own."""
    records = []
    for i in range(8):
        send = i / 8
        ttft = 0.5 if i % 2 == 0 else rng.choice([0.25, 0.75])
        gap = 1 / 32 if i % 3 else rng.choice([1 / 64, 1 / 16])
        steps = 8 if i == 4 else rng.randint(2, 7)  # request 4: E2EL 0.5 + 8/32 s = 750 ms exactly
        times = [send + ttft + gap * step for step in range(steps + 1 if i == 4 else steps)]
        records.append(RequestRecord(rng.randint(1, 512), send, chunk_times=times))
    records.append(RequestRecord(7, 0.375, chunk_times=[0.875]))  # one token: TPOT 0, TTFT on the limit
    latest = max(r.finish_time for r in records)
    records.append(RequestRecord(9, 0.9, error="timed out", end_time=latest + 1.0))
    return records, {"ttft": 500.0, "tpot": 31.25, "e2el": 750.0}


def _goodput_with(
    records,
    slo_ms,
    *,
    meets=lambda value, limit: value <= limit,
    one_token_tpot=0.0,
    duration=None,
    combine=all,
    count_failed=False,
) -> float:
    """Goodput computed one way or another: the right way with the defaults, else a known mistake."""
    good = 0
    for record in records:
        if record.success:
            lat = request_latencies_ms(record)
            tpot = one_token_tpot if lat.tpot_ms is None else lat.tpot_ms
            observed = {"ttft": lat.ttft_ms, "tpot": tpot, "e2el": lat.e2el_ms}
            good += combine(meets(observed[key], limit) for key, limit in slo_ms.items())
        elif count_failed:
            good += 1
    return good / (duration if duration is not None else benchmark_duration_s(records))


def _goodput_mistakes(records, slo_ms) -> list[tuple[float, str]]:
    done = [r for r in records if r.success]
    completed_only = max(r.finish_time for r in done) - min(r.send_time for r in done)
    return [
        (
            _goodput_with(records, slo_ms, meets=lambda value, limit: value < limit),
            "a request whose latency equals a limit meets it: compare with <=, not <",
        ),
        (
            _goodput_with(records, slo_ms, one_token_tpot=math.inf),
            "your goodput leaves out one-token requests; a one-token request has no TPOT and counts with TPOT 0",
        ),
        (_goodput_with(records, slo_ms, duration=completed_only), DURATION_MISTAKE),
        (
            _goodput_with(records, slo_ms, combine=any),
            "your goodput counts requests that meet any one SLO; a good request meets every SLO in the set",
        ),
        (
            _goodput_with(records, slo_ms, count_failed=True),
            "your goodput counts failed requests; count completed ones",
        ),
    ]


def _compare_goodput(got, expected) -> str | None:
    value_expected, records, slo_ms = expected
    value, problem = as_number(got, "req/s", what="a number of requests per second")
    if problem:
        return problem
    if math.isclose(value, value_expected, rel_tol=1e-6, abs_tol=1e-12):
        return None
    shown_got, shown_expected = distinct_pair(value, value_expected)
    why = next(
        (
            why
            for wrong, why in _goodput_mistakes(records, slo_ms)
            if math.isclose(value, wrong, rel_tol=1e-6, abs_tol=1e-12)
        ),
        "a request is good when it is completed and meets every SLO (a value equal to a limit meets it, a "
        "one-token request counts with TPOT 0); divide by the duration of Part C",
    )
    return f"got {shown_got} req/s, expected {shown_expected} ({why})"


def grade_goodput(student_goodput, runs: int = 8) -> Verdict:
    qid = GOODPUT_QID
    cases = []
    slos = [{"ttft": 500, "tpot": 20}, {"tpot": 25}, {"e2el": 1500}, {"ttft": 800, "tpot": 30, "e2el": 2000}]
    for rng in case_rngs(qid):
        records, slo = _on_the_limit_run(rng)
        cases.append(Case(f"SLO {slo} on {len(records)} requests, some exactly on the limits", (records, slo)))
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


def _whole(n) -> bool:
    """An exact count: a positive int (numpy's and torch's integer types too), never a bool."""
    if hasattr(n, "shape") and hasattr(n, "item") and getattr(n, "shape", None) == ():
        n = n.item()
    return isinstance(n, numbers.Integral) and not isinstance(n, bool) and n >= 1


def grade_grid(grid) -> Verdict:
    """The lab's grid requirements, checked one by one (several designs pass)."""
    qid = GRID_QID
    if not isinstance(grid, BenchmarkGrid):
        return Verdict(qid, False, f"expected an infer.profiles.BenchmarkGrid, got {type(grid).__name__}")
    lengths = [*grid.input_lens, *grid.output_lens]
    if not all(_whole(n) for n in lengths):
        return Verdict(qid, False, "input and output lengths must be exact token counts: positive ints")
    inputs, outputs = [int(n) for n in grid.input_lens], [int(n) for n in grid.output_lens]
    if 2048 not in inputs or 64 not in outputs:
        return Verdict(qid, False, "the grid must contain the service's workload: 2048 input and 64 output tokens")
    if len(set(inputs)) < 2:
        return Verdict(
            qid,
            False,
            f"input_lens={tuple(inputs)} holds one input length: use at least two different ones, so that "
            "the prefill's share of TTFT shows",
        )
    if not all(_whole(c) for c in grid.concurrency) or not _whole(grid.num_prompts):
        return Verdict(qid, False, "concurrency levels and num_prompts are counts: positive ints")
    conc = [int(c) for c in grid.concurrency]
    if not conc or conc[0] != 1 or conc != sorted(set(conc)) or max(conc) < 32:
        return Verdict(qid, False, "concurrency must start at 1, rise strictly, and reach at least 32")
    if grid.num_prompts < 4 * max(conc):
        return Verdict(
            qid,
            False,
            f"num_prompts={int(grid.num_prompts)} gives the top concurrency fewer than 4 rounds; "
            f"use at least {4 * max(conc)}",
        )
    cells = len(inputs) * len(outputs) * len(conc)
    if cells > 24:
        return Verdict(qid, False, f"{cells} cells is more than the 24 the time budget allows")
    # The same line for every grid that passes: several designs do, and nbval compares this line.
    return Verdict(qid, True, "the grid meets every requirement")


def check_grid(grid) -> None:
    print(grade_grid(grid).line)
