"""The chunked policy: running sequences first, in the order they were admitted (vLLM V1's order:
no decode goes ahead of a prompt admitted before it), new prompts last, all within the token
budget; a prompt splits across steps; and whatever the budget (down to 1 token a step), every
request gets exactly its single-request greedy tokens."""

import random

import pytest

from infer.engine import Engine
from infer.engine.scheduler import chunked_token_counts
from infer.engine.simulator import simulate
from infer.engine.step_costs import FixedStepCost
from infer.model import Transformer
from tests.engine_helpers import greedy, single_request_greedy

MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


# ------------------------------------------------------------ the decision, over plain numbers


def test_running_sequences_go_in_admission_order_then_new_prompts():
    running, new = chunked_token_counts(
        [30, 1, 1], [True, False, False], [50, 9], free_slots=5, max_num_batched_tokens=20
    )
    assert running == [20, 0, 0] and new == []  # the prompt admitted first takes the budget; no decode-first sort


def test_the_issues_state_decode_prefill_decode():
    # vLLM V1 at budget 40: the first decode, then 39 of the prompt; the later decode waits a step
    assert chunked_token_counts([1, 200, 1], [False, True, False], [50], 4, 40) == ([1, 39, 0], [])


def test_leftover_budget_starts_new_prompts_as_chunks():
    running, new = chunked_token_counts(
        [1, 1, 4], [False, False, True], [10, 10, 10], free_slots=3, max_num_batched_tokens=20
    )
    assert running == [1, 1, 4] and new == [10, 4]


def test_new_prompts_only_into_free_slots():
    assert chunked_token_counts([1], [False], [3, 3, 3], free_slots=1, max_num_batched_tokens=100) == ([1], [3])
    assert chunked_token_counts([1], [False], [3], free_slots=0, max_num_batched_tokens=100) == ([1], [])


def test_a_budget_smaller_than_the_running_sequences_leaves_the_later_ones_out():
    running, new = chunked_token_counts(
        [1, 5, 1, 1], [False, True, False, False], [4], free_slots=2, max_num_batched_tokens=2
    )
    assert running == [1, 1, 0, 0] and new == []


# ------------------------------------------------------------ the engine


@pytest.mark.parametrize("budget", [1, 2, 3, 5, 8, 17, 64, 1000])
def test_every_budget_gives_single_request_greedy_tokens(model, budget):
    rng = random.Random(budget)
    requests = [([rng.randrange(256) for _ in range(rng.randint(1, 40))], rng.randint(1, 12)) for _ in range(7)]
    engine = Engine(
        model,
        policy="chunked",
        max_num_seqs=rng.choice([2, 3, 8]),
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        log_steps=True,
    )
    got = {str(i): [] for i in range(len(requests))}
    pending = list(enumerate(requests))
    while pending or engine.has_unfinished():
        for _ in range(rng.randint(0, 2)):  # arrivals while others prefill and decode
            if pending:
                i, (prompt, max_tokens) = pending.pop(0)
                engine.add_request(prompt, greedy(max_tokens), request_id=str(i))
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    for i, (prompt, max_tokens) in enumerate(requests):
        assert got[str(i)] == single_request_greedy(model, prompt, max_tokens), f"request {i}, budget {budget}"
    assert all(record.num_tokens <= budget for record in engine.step_log)
    assert engine.kv_store.num_free == engine.limits.max_num_seqs


@pytest.mark.parametrize("seed", range(4))
def test_chunked_with_aborts_matches_greedy_and_frees_every_slot(model, seed):
    rng = random.Random(100 + seed)
    requests = [([rng.randrange(256) for _ in range(rng.randint(1, 60))], rng.randint(1, 16)) for _ in range(10)]
    engine = Engine(
        model,
        policy="chunked",
        max_num_seqs=4,
        max_num_batched_tokens=rng.choice([4, 16, 33]),
        max_model_len=MAX_MODEL_LEN,
    )
    got = {str(i): [] for i in range(len(requests))}
    aborted = set()
    for i, (prompt, max_tokens) in enumerate(requests):
        engine.add_request(prompt, greedy(max_tokens), request_id=str(i))
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
        if rng.random() < 0.2:
            victim = rng.choice([r for r in got if r not in aborted and r in engine.requests] or [None])
            if victim is not None:
                engine.abort(victim)
                aborted.add(victim)
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
    for i, (prompt, max_tokens) in enumerate(requests):
        if str(i) not in aborted:
            assert got[str(i)] == single_request_greedy(model, prompt, max_tokens), f"request {i}, seed {seed}"
    assert engine.kv_store.num_free == engine.limits.max_num_seqs


def test_a_long_prompt_is_split_and_the_decodes_keep_going(model):
    engine = Engine(
        model, policy="chunked", max_num_seqs=4, max_num_batched_tokens=16, max_model_len=MAX_MODEL_LEN, log_steps=True
    )
    engine.add_request([1, 2], greedy(12), request_id="a")
    engine.add_request([3, 4], greedy(12), request_id="b")
    engine.step()  # both short prompts in one step
    engine.add_request(list(range(50)), greedy(2), request_id="long")
    while engine.has_unfinished():
        engine.step()
    log = engine.step_log
    # 50 prompt tokens at 14 a step (16 minus the two decodes): 4 steps, each also decoding a and b
    with_long = [r for r in log if "long" in r.request_ids]
    assert [r.request_ids for r in with_long[:4]] == [("a", "b", "long")] * 4
    assert [r.num_prefill_tokens for r in with_long[:4]] == [14, 14, 14, 8]


def test_prompts_longer_than_the_budget_are_accepted(model):
    engine = Engine(model, policy="chunked", max_num_batched_tokens=8, max_model_len=MAX_MODEL_LEN)
    result = engine.generate([list(range(40))], greedy(3), progress=False)[0]
    assert result.token_ids == single_request_greedy(model, list(range(40)), 3)


def test_unknown_policy_names_the_valid_ones(model):
    with pytest.raises(ValueError, match="valid policies: 'static', 'continuous', 'chunked'"):
        Engine(model, policy="chunky")


@pytest.mark.parametrize("seed", range(20))
def test_a_prompt_mid_prefill_is_always_the_newest_running_sequence(seed):
    """Why V1's arrival order and a decode-first sort give the same steps in this engine: a new
    prompt starts only with budget every running sequence left over, so no decode ever runs after
    a prompt that is still being prefilled (vLLM parts the two with --long-prefill-token-threshold)."""
    rng = random.Random(seed)
    n = rng.randint(3, 12)
    run = simulate(
        FixedStepCost(),
        [rng.choice([rng.randint(1, 20), rng.randint(50, 300)]) for _ in range(n)],
        [rng.randint(1, 12) for _ in range(n)],
        policy="chunked",
        max_num_seqs=rng.choice([2, 4, 8]),
        max_num_batched_tokens=rng.choice([3, 16, 64, 200]),
        max_model_len=512,
        offsets=sorted(rng.uniform(0, 0.03) for _ in range(n)),
    )
    for step in run.steps:
        kinds = [
            item.prefill for item in step.items
        ]  # in batch order: the running sequences as admitted, then newcomers
        assert kinds == sorted(kinds), f"a decode after a prompt mid-prefill: {step.items}"
