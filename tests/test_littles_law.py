"""Little's law as weeks 05 and 07 check it: request throughput x MEAN E2EL must come back to the
concurrency the client held. The check must be able to fail: a single burst of `level` requests
that all end in one step passes it by construction, so the sweeps run several rounds per level,
and a run that did not hold the level fails it."""

import pytest

from infer.engine.simulator import simulate
from infer.engine.step_costs import FixedStepCost
from infer.experiments.batching_study import StudySizes, concurrency_sweep
from infer.metrics import calculate_metrics, littles_law_holds, littles_law_in_flight
from infer.model import Transformer

LEVEL, ROUNDS = 4, 3
STEP = FixedStepCost(ms=10.0)


def served(num_requests: int, max_concurrency: int | None, output_lens=None) -> dict:
    output_lens = output_lens or [6] * num_requests
    run = simulate(
        STEP,
        [16] * num_requests,
        output_lens,
        policy="continuous",
        max_num_seqs=LEVEL,
        max_num_batched_tokens=16 * LEVEL,
        max_model_len=64,
        max_concurrency=max_concurrency,
    )
    return calculate_metrics(run.records)


def test_a_closed_loop_at_the_level_comes_back_to_it():
    metrics = served(ROUNDS * LEVEL, max_concurrency=LEVEL)
    assert littles_law_in_flight(metrics) == pytest.approx(LEVEL, rel=0.02)
    assert littles_law_holds(metrics, LEVEL)


def test_one_burst_of_level_requests_passes_whatever_happened():
    """Every request sent at once and finished in one step: throughput = level / E2EL, so the
    product is the level by construction. This is why one round per level proves nothing."""
    metrics = served(LEVEL, max_concurrency=None)
    assert littles_law_in_flight(metrics) == pytest.approx(LEVEL)


def test_a_burst_of_several_rounds_fails_the_check():
    """All rounds sent at once (no concurrency cap): the later ones wait in the queue, in flight for
    the client, so on average twice the level is in flight, not the level the sweep claims."""
    metrics = served(ROUNDS * LEVEL, max_concurrency=None)
    assert littles_law_in_flight(metrics) > 1.5 * LEVEL
    assert not littles_law_holds(metrics, LEVEL)


def test_a_long_drain_fails_the_check():
    """One long request per round of short ones: at the end the loop runs dry while it finishes."""
    outputs = [40 if i == 0 else 2 for i in range(ROUNDS * LEVEL)]
    metrics = served(ROUNDS * LEVEL, max_concurrency=LEVEL, output_lens=outputs)
    assert not littles_law_holds(metrics, LEVEL)


def test_the_week05_sweep_holds_the_law_at_every_level(tiny):
    sizes = StudySizes(
        4, (8, 16), (2, 4), 2, sweep_concurrency=(1, 4), sweep_input_len=16, sweep_output_len=4, sweep_rounds=ROUNDS
    )
    rows = concurrency_sweep(Transformer.from_hf(tiny.model), tiny.config, sizes)
    for row in rows:
        assert row["completed"] == ROUNDS * row["concurrency"]
        assert row["littles_law_holds"], (row["concurrency"], row["littles_law_in_flight"])
