"""Engines side by side on the same decode steps (week 09): what a change to the step buys.

`decode_engine` holds BATCH sequences of CONTEXT prompt tokens, so that after its prefill every
step decodes all of them; `side_by_side` times the same number of steps of each engine in turns
(A, B, A, B, ...: this machine's drift meets every engine alike) and checks that they generated
the same greedy tokens: a change that moves one token changed the model, not only its speed.
"""

import statistics
import time

from infer.engine import Engine
from infer.engine.sequence import benchmark_params
from infer.experiments.rounds import spread

BATCH, CONTEXT, STEPS, WARMUP_STEPS = 32, 288, 20, 10


def decode_engine(
    model, store: str, steps: int, batch: int = BATCH, context: int = CONTEXT, **engine_options
) -> Engine:
    """An engine holding `batch` sequences of `context` prompt tokens, with room for `steps` decodes."""
    prompt = [1 + i % (model.arch.vocab_size - 1) for i in range(context)]
    engine_options.setdefault("max_model_len", context + steps + 16)
    engine = Engine(model, max_num_seqs=batch, max_num_batched_tokens=batch * context, kv_store=store, **engine_options)
    for _ in range(batch):
        engine.add_request(prompt, benchmark_params(steps + 8))
    return engine


def greedy_tokens(engine: Engine, steps: int, tokens: dict[str, list[int]] | None = None) -> dict[str, list[int]]:
    """Step `engine` `steps` times; each request's tokens so far (added to `tokens` if given)."""
    tokens = {} if tokens is None else tokens
    for _ in range(steps):
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    return tokens


def timed_rounds(engines: dict[str, Engine], rounds: int) -> tuple[dict[str, list[float]], dict[str, dict]]:
    """Each engine's median step (ms) in each of `rounds` interleaved rounds of STEPS steps, after
    WARMUP_STEPS each; and the greedy tokens each generated, by request."""
    tokens = {name: greedy_tokens(engine, WARMUP_STEPS) for name, engine in engines.items()}
    step_ms: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, engine in engines.items():
            times = []
            for _ in range(STEPS):
                start = time.perf_counter()
                greedy_tokens(engine, 1, tokens[name])
                times.append((time.perf_counter() - start) * 1e3)
            step_ms[name].append(statistics.median(times))
    return step_ms, tokens


def side_by_side(engines: dict[str, Engine], rounds: int, first: str) -> dict:
    """Median ms of a step of each engine over `rounds` interleaved rounds (timed_rounds), each
    engine's ratio to `first`'s, and whether all generated the same tokens."""
    step_ms, tokens = timed_rounds(engines, rounds)
    return {
        "step_ms": {name: spread(values) for name, values in step_ms.items()},
        f"ratio_to_{first}": {
            name: spread([a / b for a, b in zip(values, step_ms[first])]) for name, values in step_ms.items()
        },
        "same_greedy_tokens": all(t == tokens[first] for t in tokens.values()),
    }
