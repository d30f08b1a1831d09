"""The engine: every policy gives each request exactly its single-request greedy tokens, whatever
the arrival order, batch-mates and aborts; seeded sampling is reproducible per request; bad input
is refused at add_request and changes nothing."""

import random

import pytest
import torch

from infer.engine import Engine, SamplingParams
from infer.engine.kv_store import SlotKVStore
from infer.kv_cache import KVCache
from infer.model import Transformer
from tests.engine_helpers import greedy, single_request_greedy

MAX_MODEL_LEN = 160


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


def random_requests(rng: random.Random, count: int) -> list[tuple[list[int], int]]:
    return [([rng.randrange(256) for _ in range(rng.randint(1, 48))], rng.randint(1, 24)) for _ in range(count)]


@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize("seed", range(6))
def test_every_request_gets_its_single_request_greedy_tokens(model, policy, seed):
    rng = random.Random(seed)
    requests = random_requests(rng, 10)
    engine = Engine(
        model,
        policy=policy,
        max_num_seqs=rng.choice([1, 3, 4, 8]),
        max_num_batched_tokens=rng.choice([48, 64, 200]),
        max_model_len=MAX_MODEL_LEN,
    )
    order = list(range(len(requests)))
    rng.shuffle(order)
    got = {i: [] for i in order}
    aborted = set()
    arrivals = iter(order)
    for i in arrivals:  # a few arrive at once, the rest one per step, with aborts along the way
        engine.add_request(requests[i][0], greedy(requests[i][1]), request_id=str(i))
        if rng.random() < 0.6:
            continue
        for out in engine.step():
            got[int(out.request_id)] += out.new_token_ids
        if rng.random() < 0.15:
            victim = rng.choice([j for j in got if j not in aborted])
            engine.abort(str(victim))
            aborted.add(victim)
    while engine.has_unfinished():
        for out in engine.step():
            got[int(out.request_id)] += out.new_token_ids
    for i, (prompt, max_tokens) in enumerate(requests):
        if i in aborted:
            continue
        assert got[i] == single_request_greedy(model, prompt, max_tokens), f"request {i} ({policy}, seed {seed})"
    assert engine.kv_store.num_free == engine.limits.max_num_seqs


def test_generate_returns_results_in_input_order(model):
    rng = random.Random(7)
    requests = random_requests(rng, 6)
    engine = Engine(model, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN)
    results = engine.generate([p for p, _ in requests], [greedy(n) for _, n in requests], progress=False)
    assert [len(r.token_ids) for r in results] == [n for _, n in requests]
    assert [r.prompt_token_ids for r in results] == [p for p, _ in requests]
    assert all(r.finish_reason == "length" for r in results)
    assert results[3].token_ids == single_request_greedy(model, *requests[3])


def test_one_forward_per_step(model):
    engine = Engine(model, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN)
    engine.generate([[1, 2, 3]] * 6, greedy(5), progress=False)
    assert engine.runner.num_forwards == engine.num_steps


def batches_of_a_short_a_long_and_a_late_request(model, policy: str) -> list[tuple[str, ...]]:
    """Two slots; "short" (2 tokens) and "long" (6) arrive first, "late" (2) waits for a slot.
    Returns each step's batch, as request ids."""
    engine = Engine(
        model, policy=policy, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=MAX_MODEL_LEN, log_steps=True
    )
    engine.add_request([1, 2], greedy(2), request_id="short")
    engine.add_request([3, 4], greedy(6), request_id="long")
    engine.add_request([5, 6], greedy(2), request_id="late")
    while engine.has_unfinished():
        engine.step()
    return [record.request_ids for record in engine.step_log]


def test_continuous_admits_into_a_free_slot_between_decode_steps(model):
    batches = batches_of_a_short_a_long_and_a_late_request(model, "continuous")
    # prefill both; decode both (short ends); prefill late alone (decodes stall); decode long and late
    assert batches[:4] == [("short", "long"), ("short", "long"), ("late",), ("long", "late")]


def test_static_waits_for_the_whole_batch(model):
    batches = batches_of_a_short_a_long_and_a_late_request(model, "static")
    assert batches[:7] == [("short", "long"), ("short", "long")] + [("long",)] * 4 + [("late",)]


def test_seeded_sampling_does_not_depend_on_batch_mates(model):
    params = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=1234, ignore_eos=True)
    alone = Engine(model, max_num_seqs=4, max_model_len=MAX_MODEL_LEN)
    alone_tokens = alone.generate([[10, 20, 30]], params, progress=False)[0].token_ids
    crowd = Engine(model, max_num_seqs=4, max_model_len=MAX_MODEL_LEN)
    mates = SamplingParams(max_tokens=9, temperature=1.0, seed=99, ignore_eos=True)
    results = crowd.generate([[7, 8], [10, 20, 30], [1] * 40, [5]], [mates, params, mates, greedy(3)], progress=False)
    assert results[1].token_ids == alone_tokens
    other_seed = (
        Engine(model, max_num_seqs=4, max_model_len=MAX_MODEL_LEN)
        .generate(
            [[10, 20, 30]],
            SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=4321, ignore_eos=True),
            progress=False,
        )[0]
        .token_ids
    )
    assert other_seed != alone_tokens  # the seed matters: 12 draws from a wide distribution


def test_stop_tokens_and_eos_end_a_request(model):
    engine = Engine(model, max_model_len=MAX_MODEL_LEN)
    free_run = engine.generate([[1, 2, 3]], greedy(8), progress=False)[0].token_ids
    stop_at = free_run[3]
    stopped = engine.generate(
        [[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0, stop_token_ids=(stop_at,)), progress=False
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free_run[: free_run.index(stop_at) + 1]


BAD_REQUESTS = [
    ([], greedy(4), "prompt is empty"),
    ([1, 2, 5000], greedy(4), "token id 5000 is out of vocabulary"),
    ([1, -1], greedy(4), "token id -1 is out of vocabulary"),
    ([1, 2.5], greedy(4), "token ids must be integers, got 2.5 (float)"),
    (
        [1] * 100,
        greedy(100),
        "maximum context length is 160 tokens. However, you requested 200 tokens "
        "(100 in the prompt, 100 for the completion)",
    ),
    ([1, 2], SamplingParams(max_tokens=0), "max_tokens must be at least 1, got 0"),
    ([1, 2], SamplingParams(max_tokens=-3), "max_tokens must be at least 1, got -3"),
    ([1, 2], SamplingParams(temperature=-0.5), "temperature must be non-negative, got -0.5"),
    ([1, 2], SamplingParams(top_p=0.0), "top_p must be in (0, 1], got 0.0"),
    ([1, 2], SamplingParams(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
]


@pytest.mark.parametrize("prompt, params, message", BAD_REQUESTS)
def test_bad_input_is_refused_and_changes_nothing(model, prompt, params, message):
    engine = Engine(model, max_num_seqs=2, max_model_len=MAX_MODEL_LEN)
    engine.add_request([4, 5, 6], greedy(3), request_id="good")
    with pytest.raises(ValueError) as error:
        engine.add_request(prompt, params)
    assert message in str(error.value)
    assert list(engine.requests) == ["good"] and len(engine.scheduler.waiting) == 1
    tokens = [t for outs in iter(engine.step, []) for out in outs for t in out.new_token_ids]
    assert tokens == single_request_greedy(model, [4, 5, 6], 3)


def test_numpy_and_torch_token_ids_are_accepted(model):
    import numpy as np

    engine = Engine(model, max_model_len=MAX_MODEL_LEN)
    engine.add_request(list(np.array([4, 5, 6])), greedy(3), request_id="numpy")
    engine.add_request(torch.tensor([4, 5, 6]), greedy(3), request_id="torch")
    assert engine.num_waiting == 2 and engine.requests["numpy"].prompt_token_ids == [4, 5, 6]
    engine.step()
    assert engine.num_running == 2 and engine.kv_cache_usage == 2 / 32


def test_duplicate_request_id_is_refused(model):
    engine = Engine(model, max_model_len=MAX_MODEL_LEN)
    engine.add_request([1, 2], greedy(2), request_id="a")
    with pytest.raises(ValueError, match="request id 'a' is already in use"):
        engine.add_request([3], greedy(2), request_id="a")
    assert engine.requests["a"].prompt_token_ids == [1, 2]


def test_a_prompt_longer_than_one_step_is_refused_by_prefill_first_policies(model):
    engine = Engine(model, max_num_batched_tokens=32, max_model_len=MAX_MODEL_LEN)
    with pytest.raises(ValueError, match="the prompt has 40 tokens, more than max_num_batched_tokens=32"):
        engine.add_request([1] * 40, greedy(2))


def test_abort_frees_the_slot_at_once(model):
    engine = Engine(model, max_num_seqs=1, max_model_len=MAX_MODEL_LEN)
    engine.add_request([1, 2], greedy(50), request_id="a")
    engine.add_request([3, 4], greedy(2), request_id="b")
    engine.step()
    assert engine.kv_store.num_free == 0
    engine.abort("a")
    assert engine.kv_store.num_free == 1 and engine.has_unfinished()
    outs = engine.step()
    assert [o.request_id for o in outs] == ["b"]
    engine.abort("no-such-request")  # ignored, like vLLM


class TokenBudgetStore(SlotKVStore):
    """A slot store that also caps the tokens held by all running sequences together, so that
    appends get refused and the scheduler must preempt (as a paged store does when its blocks run out)."""

    def __init__(self, model, max_num_seqs: int, max_model_len: int, token_budget: int):
        super().__init__(max_num_seqs, max_model_len, KVCache.for_model(model, max_num_seqs, max_model_len))
        self.token_budget, self.held = token_budget, {}

    def _room(self, seq, num_tokens: int) -> bool:
        others = sum(n for request_id, n in self.held.items() if request_id != seq.request_id)
        return others + seq.num_computed_tokens + num_tokens <= self.token_budget

    def can_allocate(self, seq, num_tokens):
        return super().can_allocate(seq, num_tokens) and self._room(seq, num_tokens)

    def allocate(self, seq, num_tokens):
        self.held[seq.request_id] = num_tokens
        return super().allocate(seq, num_tokens)

    def can_append(self, seq, num_tokens):
        return self._room(seq, num_tokens)

    def append(self, seq, num_tokens):
        self.held[seq.request_id] = seq.num_computed_tokens + num_tokens

    def free(self, seq):
        del self.held[seq.request_id]
        super().free(seq)


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("seed", range(3))
def test_a_store_that_runs_out_preempts_and_every_request_keeps_its_greedy_tokens(model, policy, seed):
    rng = random.Random(seed)
    requests = random_requests(rng, 8)
    longest = max(len(prompt) + max_tokens for prompt, max_tokens in requests)
    store = TokenBudgetStore(model, 6, MAX_MODEL_LEN, token_budget=longest + 20)  # room for about two at a time
    engine = Engine(
        model, policy=policy, max_num_seqs=6, max_num_batched_tokens=200, max_model_len=MAX_MODEL_LEN, kv_store=store
    )
    results = engine.generate([prompt for prompt, _ in requests], [greedy(n) for _, n in requests], progress=False)
    assert engine.num_preemptions > 0, "the budget was meant to force preemptions: the test no longer tests them"
    for (prompt, max_tokens), result in zip(requests, results):
        assert result.token_ids == single_request_greedy(model, prompt, max_tokens), (
            f"request {result.request_id} ({policy}) lost its greedy tokens across a preemption"
        )
    assert store.num_free == 6 and not store.held, "every slot and token comes back"
