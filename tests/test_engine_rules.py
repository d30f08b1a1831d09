"""The engine's scheduling rules, over every configuration it accepts (hypothesis draws them):
policy, KV store, token budget, max_num_seqs, pool and block size, prefix caching; and request
streams of any prompt and output lengths, arrival steps, aborts and shared prefixes.

After every generated run:
- a request is refused at add time exactly when it can never run (its context is over
  max_model_len or the KV store, or its prompt is over the budget of a policy that does not split
  prompts), with a message that names that limit; every other request is accepted;
- no exception escapes `step()` (the engine raises on a bug by default), and the engine drains;
- every accepted request that was not aborted finishes with exactly its tokens, and a sample of
  them with the greedy tokens of a single-request run;
- the store is whole again (every block free or cached and unowned; every slot free), nothing is
  running or waiting, and the preemption count equals the sum of the sequences' own.

`make test` runs a bounded profile (100 examples, under a minute, the same ones every time);
`pytest tests/test_engine_rules.py --hypothesis-profile=long` runs 1,000 new ones (tests/conftest.py). A failure prints
a shrunk example as the test's arguments, and `Case(...)` repeats it in a test of its own.
"""

import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infer.engine import Engine
from infer.engine.sequence import Sequence
from infer.model import Transformer
from tests.engine_helpers import greedy, single_request_greedy

MAX_MODEL_LEN = 64
VOCAB = 200
MAX_STEPS = 5_000  # far more than any drawn run needs: more means the engine stopped draining
SAMPLED = 2  # requests per run whose tokens are compared with a single-request run


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    max_tokens: int
    arrival_step: int
    abort_step: int | None  # aborted when the loop reaches this step, if still unfinished


@dataclass(frozen=True)
class Case:
    policy: str
    kv_store: str
    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_kv_blocks: int
    enable_prefix_caching: bool
    requests: tuple[Request, ...]
    max_model_len: int = MAX_MODEL_LEN

    def engine(self, model) -> Engine:
        paged = self.kv_store == "paged"
        return Engine(
            model,
            self.policy,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            kv_store=self.kv_store,
            num_kv_blocks=self.num_kv_blocks if paged else None,
            block_size=self.block_size,
            enable_prefix_caching=self.enable_prefix_caching and paged,
        )

    def refusal_limit(self, request: Request) -> str | None:
        """The limit a request breaks, computed here from the configuration, not by the engine."""
        context = len(request.prompt) + request.max_tokens
        if context > self.max_model_len:
            return "maximum context length"
        if self.kv_store == "paged" and math.ceil(context / self.block_size) > self.num_kv_blocks:
            return "KV store"
        if len(request.prompt) > self.max_num_batched_tokens and self.policy != "chunked":
            return "max_num_batched_tokens"
        return None


@st.composite
def cases(draw) -> Case:
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    prefixes = draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24), min_size=1, max_size=3))
    requests = []
    for _ in range(draw(st.integers(1, 10))):
        shared = draw(st.sampled_from(prefixes))[: draw(st.integers(0, 24))]
        own = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0 if shared else 1, max_size=40))
        arrival = draw(st.integers(0, 10))
        abort = draw(st.one_of(st.none(), st.integers(arrival, arrival + 40)))
        requests.append(Request(tuple(shared + own), draw(st.integers(1, 40)), arrival, abort))
    # Half the pools hold the longest request and a little more, so that sequences get preempted;
    # half the budgets fit the longest prompt and a little more, so that a recompute may not.
    longest = max(len(r.prompt) + r.max_tokens for r in requests)
    tight_pool = math.ceil(min(longest, MAX_MODEL_LEN) / block_size) + draw(st.integers(0, 3))
    tight_budget = max(len(r.prompt) for r in requests) + draw(st.integers(0, 8))
    return Case(
        policy=draw(st.sampled_from(["continuous", "chunked", "static"])),
        kv_store=draw(st.sampled_from(["paged", "slots"])),
        max_num_batched_tokens=draw(st.one_of(st.just(tight_budget), st.integers(4, 64))),
        max_num_seqs=draw(st.integers(1, 8)),
        block_size=block_size,
        num_kv_blocks=draw(
            st.one_of(st.just(tight_pool), st.integers(1, 2 * math.ceil(MAX_MODEL_LEN / block_size) + 4))
        ),
        enable_prefix_caching=draw(st.booleans()),
        requests=tuple(requests),
    )


@dataclass
class Run:
    refused: dict[int, str]  # request index -> the engine's message
    accepted: dict[int, Sequence]  # request index -> its sequence, kept after it finishes
    tokens: dict[int, list[int]]
    reasons: dict[int, str]


def run(case: Case, engine: Engine) -> Run:
    """Drive the engine step by step: arrivals and aborts at their steps, until it drains."""
    result = Run({}, {}, {}, {})
    ids: dict[str, int] = {}
    last_arrival = max(r.arrival_step for r in case.requests)
    for step in range(MAX_STEPS):
        for index, request in enumerate(case.requests):
            if request.arrival_step == step:
                try:
                    request_id = engine.add_request(list(request.prompt), greedy(request.max_tokens))
                except ValueError as refusal:
                    result.refused[index] = str(refusal)
                    continue
                ids[request_id] = index
                result.accepted[index] = engine.requests[request_id]
                result.tokens[index] = []
            elif request.abort_step == step and index in result.accepted and index not in result.reasons:
                engine.abort(result.accepted[index].request_id)
                result.reasons[index] = "abort"
        for out in engine.step():
            index = ids[out.request_id]
            result.tokens[index] += out.new_token_ids
            if out.finished:
                result.reasons[index] = out.finish_reason
        if step >= last_arrival and not engine.has_unfinished():
            return result
    pytest.fail(
        f"the engine did not drain in {MAX_STEPS} steps: {engine.num_running} running, {engine.num_waiting} waiting"
    )


def check_rules(case: Case, engine: Engine, result: Run, model) -> None:
    for index, request in enumerate(case.requests):
        limit = case.refusal_limit(request)
        if limit is None:
            assert index not in result.refused, f"request {index} could run but was refused: {result.refused[index]}"
        else:
            assert index in result.refused, f"request {index} breaks the {limit} limit but was accepted"
            assert limit in result.refused[index], (
                f"request {index}'s refusal does not name the {limit}: {result.refused[index]}"
            )
    finished = [i for i in result.accepted if result.reasons[i] != "abort"]
    for index in finished:
        request = case.requests[index]
        assert result.reasons[index] == "length" and len(result.tokens[index]) == request.max_tokens, (
            f"request {index} ended with {result.reasons[index]!r} after {len(result.tokens[index])} of "
            f"{request.max_tokens} tokens"
        )
    for index in finished[:SAMPLED]:
        request = case.requests[index]
        expected = single_request_greedy(model, list(request.prompt), request.max_tokens)
        assert result.tokens[index] == expected, f"request {index}'s greedy tokens differ from a single-request run"
    assert not engine.scheduler.running and not engine.scheduler.waiting and not engine.requests
    store = engine.kv_store
    if case.kv_store == "paged":
        assert all(b.ref_count == 0 for b in store.blocks), "a block is still owned after every request ended"
        assert sorted(store.free_blocks) == list(range(len(store.blocks))), "blocks leaked: free + cached != the pool"
    else:
        assert store.num_free == case.max_num_seqs, "a KV slot leaked"
    assert engine.num_preemptions == sum(s.num_preemptions for s in result.accepted.values()), (
        "the engine's preemption count disagrees with its sequences' records"
    )


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


@given(case=cases())
def test_every_accepted_request_runs_and_every_refusal_names_its_limit(model, case):
    engine = case.engine(model)
    check_rules(case, engine, run(case, engine), model)


SIX_REQUESTS = Case(  # issue 29: 1 x 200, 5 x 500, then 503s until a restart (continuous, budget 256)
    policy="continuous",
    kv_store="paged",
    max_num_batched_tokens=256,
    max_num_seqs=32,
    block_size=16,
    num_kv_blocks=40,
    enable_prefix_caching=False,
    requests=tuple(Request(tuple((7 * i + j) % VOCAB for j in range(200)), 128, 0, None) for i in range(6)),
    max_model_len=2048,
)


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
def test_a_recompute_longer_than_the_budget_runs_alone_and_everyone_finishes(model, policy):
    """Six requests of 200 + 128 tokens in 40 blocks of 16: preempted sequences come back as prefills
    of up to 327 tokens, over the budget of 256, which a prefill-first policy never admits beside others."""
    case = Case(**{**SIX_REQUESTS.__dict__, "policy": policy})
    engine = case.engine(model)
    result = run(case, engine)
    if policy != "static":
        assert engine.num_preemptions > 0, "the pool was meant to be too small: the test no longer tests preemption"
    check_rules(case, engine, result, model)
