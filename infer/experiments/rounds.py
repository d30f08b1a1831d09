"""Systems compared in interleaved rounds: A, B, A, B, A, B. A slow spell of a shared machine
then hits every system alike, and the rounds show how much a result moves from one run to the next.

    runs = interleaved_rounds({"A": run_a, "B": run_b}, rounds=3)   # each run returns a dict of metrics
    spread([r["output_throughput"] for r in runs["A"]])             # median, min and max over the rounds
    ratio_spread(runs["A"], runs["B"], "output_throughput")         # A / B within each round, then the same
    format_target(ratio, (">=", 0.9), ".3f")  # "0.898 (0.862-0.922 over 3 rounds); target >= 0.9: MISSED"

A ratio is taken within a round, between runs made minutes apart, before the median over rounds:
the two systems of one round met the same machine.
"""

import statistics
from collections.abc import Callable

MIN_ROUNDS = 3  # fewer cannot tell a result from a disturbed run


def interleaved_rounds(
    systems: dict[str, Callable[[], dict]], rounds: int = MIN_ROUNDS, progress=None
) -> dict[str, list[dict]]:
    """Call every system once per round, in the given order, `rounds` times; each system's results
    in round order. `progress`: a tqdm bar, advanced once per call."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    results = {name: [] for name in systems}
    for _ in range(rounds):
        for name, run in systems.items():
            results[name].append(run())
            if progress is not None:
                progress.update(1)
    return results


def spread(values: list[float]) -> dict:
    """The median of the rounds, their smallest and largest value, and each round's value."""
    if not values:
        raise ValueError("no rounds to summarize")
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "per_round": list(values)}


def median_standard_error(values: list[float]) -> float:
    """How well the rounds pin their median, relative to it: the standard error of a median,
    1.2533 sigma / sqrt(n), with sigma estimated robustly as 1.4826 x the median absolute
    deviation (so that one stalled round does not set it). Rough for a handful of rounds."""
    center = statistics.median(values)
    mad = statistics.median(abs(v - center) for v in values)
    return 1.2533 * 1.4826 * mad / len(values) ** 0.5 / abs(center)


def ratio_spread(numerator: list[dict], denominator: list[dict], key: str) -> dict:
    """numerator[key] / denominator[key] within each round, summarized over the rounds."""
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} and {len(denominator)} rounds: compare runs of the same rounds")
    return spread([a[key] / b[key] for a, b in zip(numerator, denominator)])


def format_spread(summary: dict, fmt: str = ".2f") -> str:
    """`1.23 (1.10-1.31 over 3 rounds)`."""
    return (
        f"{summary['median']:{fmt}} ({summary['min']:{fmt}}-{summary['max']:{fmt}} "
        f"over {len(summary['per_round'])} rounds)"
    )


def verdict(value: float, op: str, threshold: float) -> str:
    """'met' or 'MISSED': `value` itself against `threshold`, never a rounded copy of it (a median of
    0.898 misses ">= 0.90", though it prints as 0.90 to two decimals)."""
    if op not in (">=", "<="):
        raise ValueError(f"a target's operator is '>=' or '<=', got {op!r}")
    return "met" if (value >= threshold if op == ">=" else value <= threshold) else "MISSED"


def format_target(summary: dict, target: tuple[str, float], fmt: str = ".2f") -> str:
    """`0.898 (0.862-0.922 over 3 rounds); target >= 0.9: MISSED`: the rounds' median, judged unrounded."""
    op, threshold = target
    return f"{format_spread(summary, fmt)}; target {op} {threshold:g}: {verdict(summary['median'], op, threshold)}"
