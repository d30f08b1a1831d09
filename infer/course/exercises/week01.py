"""Lab 01 code checks: the naive loop, TTFT/TPOT from timestamps, arithmetic intensity."""

import random

from infer.course.checks import Case, check_function, close_to
from infer.prefill_decode import ttft_and_tpot_ms, verify_naive_loop
from infer.roofline import matmul_arithmetic_intensity


def check_naive_loop(naive_greedy_generate, model, prompts: int = 5) -> None:
    """Tokens of the student's loop must equal transformers' greedy generate() on fresh prompts."""
    rng = random.Random()
    lengths = tuple(rng.randint(3, 40) for _ in range(prompts))
    print(verify_naive_loop(model, model.config, naive_greedy_generate, qid="01.lab.naive_loop",
                            prompt_lens=lengths, seed=rng.randrange(2**31)).line)


def check_ttft_tpot(student_ttft_and_tpot_ms, requests: int = 6) -> None:
    rng = random.Random()
    cases = []
    for _ in range(requests):
        send = rng.uniform(0, 100)
        first = send + rng.uniform(0.01, 2.0)
        gaps = [rng.uniform(0.001, 0.3) for _ in range(rng.randint(1, 30))]
        times = [first]
        for gap in gaps:
            times.append(times[-1] + gap)
        cases.append(Case(f"a request sent at {send:.3f} s with {len(times)} tokens", (send, times)))
    check_function("01.lab.ttft_tpot", student_ttft_and_tpot_ms, ttft_and_tpot_ms, cases, close_to(1e-6, unit="ms"),
                   f"TTFT and TPOT match on {requests} random requests")


def check_intensity(student_intensity, shapes: int = 6) -> None:
    rng = random.Random()
    cases = [Case("a decode-like matmul m=1, k=n=1536, bf16", (1, 1536, 1536, 2))]
    for _ in range(shapes - 1):
        m, k, n, width = rng.randint(1, 4096), rng.randint(64, 8192), rng.randint(64, 8192), rng.choice([1, 2, 4])
        cases.append(Case(f"m={m}, k={k}, n={n}, {width} bytes per element", (m, k, n, width)))
    check_function("01.lab.intensity", student_intensity, matmul_arithmetic_intensity, cases, close_to(1e-9),
                   f"arithmetic intensity matches on {shapes} matmul shapes")
