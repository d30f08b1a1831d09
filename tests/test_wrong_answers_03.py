"""Lab 03: deliberately wrong answers, substituted into the solution, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 03 (cell id -> replacement solution).
LAB03_MISTAKES = {
    "q1": "answer_q1 = 0.40  # seconds, not ms",
    "q2": "answer_q2 = (0.60 - 0.40) / 5 * 1e3  # divided by N instead of N - 1",
    "q3": "answer_q3 = (10 + 100) / 2  # averaged per request first",
    "q4": "answer_q4 = 200  # the median, not the mean",
    "q5": "answer_q5 = 200  # most requests, not the 99th percentile",
    "q6": "answer_q6 = 2000 / 40  # throughput, not goodput",
    "q7": 'answer_q7 = "output_throughput"',
    "latencies": """    ttft_s = record.chunk_times[0] - record.send_time
    e2el_s = record.chunk_times[-1] - record.send_time
    n = len(record.chunk_times)  # chunks, not tokens
    tpot_ms = (e2el_s - ttft_s) / (n - 1) * 1e3 if n > 1 else None
    return ttft_s * 1e3, tpot_ms, e2el_s * 1e3""",
    "serving-metrics": """    done = [r for r in records if r.success]
    duration = max(r.finish_time for r in records) - min(r.send_time for r in records)
    lats = [latencies_ms(r) for r in done]
    per_request = [np.mean(np.diff(r.chunk_times)) * 1e3 for r in done if len(r.chunk_times) > 1]
    itls = [(b - a) * 1e3 for r in done for a, b in zip(r.chunk_times, r.chunk_times[1:])]
    tpots = [t for _, t, _ in lats if t is not None]
    out = sum(r.num_output_tokens for r in done)
    return {
        "duration": duration, "completed": len(done), "failed": len(records) - len(done),
        "total_output_tokens": out, "request_throughput": len(done) / duration,
        "output_throughput": out / duration,
        "total_token_throughput": (sum(r.prompt_len for r in done) + out) / duration,
        "mean_ttft_ms": np.mean([t for t, _, _ in lats]), "median_ttft_ms": np.median([t for t, _, _ in lats]),
        "p99_ttft_ms": np.percentile([t for t, _, _ in lats], 99), "mean_tpot_ms": np.mean(tpots),
        "p99_tpot_ms": np.percentile(tpots, 99),
        "mean_itl_ms": np.mean(per_request),  # averaged per request first, not pooled
        "p99_itl_ms": np.percentile(itls, 99), "std_e2el_ms": np.std([e for _, _, e in lats]),
        "p99_e2el_ms": np.percentile([e for _, _, e in lats], 99),
    }""",
    "goodput": """    duration = max(r.finish_time for r in records) - min(r.send_time for r in records)
    good = 0
    for r in records:
        if not r.success:
            continue
        ttft, tpot, e2el = latencies_ms(r)
        observed = {"ttft": ttft, "tpot": float("inf") if tpot is None else tpot, "e2el": e2el}  # drops one-token requests
        good += all(observed[key] <= limit for key, limit in slo_ms.items())
    return good / duration""",
    "grid": "my_grid = BenchmarkGrid(input_lens=(512, 2048), output_lens=(64,), concurrency=(1, 2, 4, 8, 16, 32), num_prompts=32)",
}
LAB03_CHECK_OF_TASK = {
    "latencies": "check-latencies",
    "serving-metrics": "check-serving-metrics",
    "goodput": "check-goodput",
    "grid": "check-grid",
}


def test_lab03_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "03_measuring.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB03_MISTAKES, LAB03_CHECK_OF_TASK, tmp_path)
