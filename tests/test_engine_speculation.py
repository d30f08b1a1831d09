"""Speculative decoding in the engine (week 10), case by case.

Greedy requests get exactly the tokens the engine gives without speculation, with either proposer,
either KV store and either running policy; the corner cases (EOS or max_tokens inside a span, no
guess at all, guesses always right or always wrong) take the steps they should; rejected guesses
leave nothing behind (their blocks are freed and never shared by the prefix cache), through
preemption and abort; and at temperature > 0 rejection sampling keeps the target's distribution,
which a wrong acceptance rule visibly fails.

Where a test needs guesses to be accepted it uses the weights the course trained on Python (byte
tokens, so a prompt is its text's bytes); elsewhere the tiny random-weight model."""

import math
from collections import Counter
from dataclasses import replace

import httpx
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from infer.engine import Engine, SamplingParams, speculation
from infer.engine.kv_store import SlotKVStore
from infer.engine.paged_kv_store import PagedKVStore
from infer.engine.sampler import sampling_probs
from infer.engine.scheduler import Limits, Scheduler, make_policy
from infer.engine.sequence import Sequence
from infer.engine.speculation import DraftModel, PromptLookup, SpeculativeConfig
from infer.kv_cache import KVCache
from infer.model import Transformer
from infer.models import load_model
from infer.serve.metrics import ServerMetrics, read_metrics
from infer.serve.server import EngineSettings, start_server
from infer.speculative import NgramProposer
from tests.engine_helpers import greedy, single_request_greedy
from tests.test_engine_paged import check_blocks
from tests.test_engine_rules import cases, check_rules, run

MAX_MODEL_LEN = 160
CODE = (
    "def add(a, b):\n    return a + b\n\n\ndef add(",
    "import os\nimport sys\n\n\ndef main():\n    ",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = ",
    "for i in range(10):\n    print(i)\nfor j in range(",
    "x = 1\n",
    "    def __repr__(self):\n        return self.",
)
PROMPTS = [list(text.encode()) for text in CODE]


@pytest.fixture(scope="module")
def target():
    return Transformer.from_hf(load_model("tiny", weights="course", quiet=True).model)


@pytest.fixture(scope="module")
def draft():
    return Transformer.from_hf(load_model("tiny-draft", weights="course", quiet=True).model)


@pytest.fixture(scope="module")
def random_model(tiny):
    return Transformer.from_hf(tiny.model)


def config(method: str, k: int, draft=None) -> SpeculativeConfig:
    return SpeculativeConfig(method, k, draft_model=draft if method == "draft_model" else None)


class Oracle:
    """A test double proposer that knows each request's greedy continuation (`truth`, by prompt) and
    guesses it (always right) or the token after it in the vocabulary (always wrong)."""

    def __init__(self, truth: dict[tuple[int, ...], list[int]], right: bool):
        self.truth, self.right = truth, right
        self.asked: list[int] = []  # how many guesses each call asked for, per sequence

    def propose(self, seqs, num_guesses):
        self.asked += num_guesses
        guesses = []
        for seq, n in zip(seqs, num_guesses):
            upcoming = self.truth[tuple(seq.prompt_token_ids)][len(seq.output_token_ids) :]
            guesses.append(upcoming[:n] if self.right else [(upcoming[0] + 1) % 1024] * n)
        return guesses

    def free(self, seq):
        pass


def with_oracle(model, prompt: list[int], max_tokens: int, k: int, right: bool, **kwargs) -> tuple[Engine, Oracle]:
    engine = Engine(model, max_num_seqs=2, max_model_len=MAX_MODEL_LEN, speculative=config("ngram", k), **kwargs)
    engine.proposer = Oracle({tuple(prompt): single_request_greedy(model, prompt, max_tokens)}, right)
    return engine, engine.proposer


def steps_of(engine: Engine, request_id: str) -> list:
    """Step until `request_id` finishes; its outputs, one per step that gave it tokens."""
    outputs = []
    while engine.has_unfinished():
        outputs += [out for out in engine.step() if out.request_id == request_id]
    return outputs


def draft_slots_all_free(engine: Engine) -> bool:
    proposer = engine.proposer
    return not isinstance(proposer, DraftModel) or (
        not proposer.slots and len(proposer.free_slots) == engine.limits.max_num_seqs
    )


# ------------------------------------------------------------ greedy: the tokens never change


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@pytest.mark.parametrize("kv_store", ["slots", "paged"])
@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_greedy_output_is_the_engines_without_speculation(target, draft, method, kv_store, policy):
    settings = dict(
        policy=policy,
        max_num_seqs=4,
        max_num_batched_tokens=96,  # the longest prompt fits (continuous), and a step cuts guesses now and then
        max_model_len=MAX_MODEL_LEN,
        kv_store=kv_store,
        block_size=8,
    )
    params = [greedy(n) for n in (40, 25, 33, 12, 40, 7)]
    plain = Engine(target, **settings)
    expected = plain.generate(PROMPTS, params, progress=False)
    engine = Engine(target, **settings, speculative=config(method, 4, draft))
    results = engine.generate(PROMPTS, params, progress=False)
    for want, got in zip(expected, results):
        assert got.token_ids == want.token_ids, (
            f"request {got.request_id}: speculation ({method}, {kv_store}, {policy}) changed greedy tokens; a "
            f"greedy target keeps only the guesses equal to its own argmax, so the output cannot change"
        )
    stats = engine.stats()
    assert 0 < stats.num_accepted_tokens <= stats.num_draft_tokens, (
        f"on the course's weights some guesses should be accepted: {stats.num_accepted_tokens} of "
        f"{stats.num_draft_tokens}"
    )
    assert stats.num_draft_tokens == sum(r.num_draft_tokens for r in results), "per-request counts add up"
    assert engine.num_steps < plain.num_steps, "accepted guesses should save target passes"
    assert engine.kv_cache_usage == 0, "KV room leaked"
    assert draft_slots_all_free(engine), "a finished request still holds a draft cache slot"


def test_seeded_sampling_with_speculation_is_reproducible(target):
    params = SamplingParams(max_tokens=30, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True)
    runs = [
        Engine(target, max_model_len=MAX_MODEL_LEN, speculative=config("ngram", 4)).generate(
            PROMPTS[:3], params, progress=False
        )
        for _ in range(2)
    ]
    assert [r.token_ids for r in runs[0]] == [r.token_ids for r in runs[1]], "a seeded request must replay exactly"
    assert sum(r.num_draft_tokens for r in runs[0]) > 0, "the prompts were meant to give n-gram guesses"


@given(case=cases(), method=st.sampled_from(["ngram", "draft_model"]), k=st.integers(1, 4))
def test_the_engines_rules_hold_with_speculation(random_model, case, method, k):
    """test_engine_rules' configurations and request streams (tight pools and budgets, block size 1,
    prefix caching, aborts), with speculation on: the same rules, the same greedy tokens. On random
    weights n-gram guesses are mostly rejected; the target as its own draft is (nearly) always right."""
    engine = case.engine(random_model)
    engine.proposer = (
        PromptLookup(3, 1) if method == "ngram" else DraftModel(random_model, case.max_num_seqs, case.max_model_len)
    )
    engine.num_speculative_tokens = k
    check_rules(case, engine, run(case, engine), random_model)
    assert draft_slots_all_free(engine), "a draft cache slot leaked"


# ------------------------------------------------------------ the corner cases


def test_a_stop_token_inside_the_accepted_span_ends_the_request_there(random_model):
    prompt, k = [3, 1, 4, 1, 5], 4
    truth = single_request_greedy(random_model, prompt, 12)
    stop_at = next((j for j in (3, 2, 1) if truth[j] not in truth[:j]), None)
    assert stop_at is not None, f"the test needs a token among the first guesses that is new: {truth[:5]}"
    params = SamplingParams(max_tokens=12, temperature=0, stop_token_ids=(truth[stop_at],))
    engine, _ = with_oracle(random_model, prompt, 12, k, right=True)
    engine.add_request(prompt, params, request_id="r")
    outputs = steps_of(engine, "r")
    assert [len(out.new_token_ids) for out in outputs] == [1, stop_at], (
        f"the prefill gives token 0; the next step verifies {k} right guesses, and the span must be cut "
        f"at the stop token (index {stop_at}): got {[out.new_token_ids for out in outputs]}"
    )
    assert outputs[1].num_accepted_tokens == k and outputs[-1].finish_reason == "stop"
    plain = Engine(random_model, max_model_len=MAX_MODEL_LEN).generate([prompt], params, progress=False)[0]
    assert [t for out in outputs for t in out.new_token_ids] == plain.token_ids == truth[: stop_at + 1]


def test_max_tokens_limits_the_guesses_and_cuts_a_span(random_model):
    prompt = [2, 7, 1, 8]
    engine, oracle = with_oracle(random_model, prompt, 5, 4, right=True)
    engine.add_request(prompt, greedy(5), request_id="r")
    outputs = steps_of(engine, "r")
    assert oracle.asked == [3], "after the first token, 5 - 1 leaves room for 3 guesses and the target's own token"
    assert [len(out.new_token_ids) for out in outputs] == [1, 4] and outputs[-1].finish_reason == "length"
    # A span longer than max_tokens allows (what a verification could return) is cut where the request ends.
    scheduler = Scheduler(make_policy("continuous"), Limits(1, 64), SlotKVStore(1, 32), set(), 32)
    seq = Sequence("s", [1, 2], SamplingParams(max_tokens=3, temperature=0), 0.0)
    scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [[5]])
    seq.spec_token_ids = [6, 7, 8]
    (out,) = scheduler.update(scheduler.schedule(), [[6, 7, 8, 9]])
    assert out.new_token_ids == [6, 7] and out.finish_reason == "length", (
        f"max_tokens=3 is reached at the span's second token; what follows is dropped: got {out}"
    )
    assert seq.output_token_ids == [5, 6, 7] and not scheduler.running and not seq.block_table


def test_no_ngram_match_means_no_guesses_and_plain_decoding(random_model):
    prompt, n = list(range(300, 340)), 6
    truth = single_request_greedy(random_model, prompt, n)
    lookup = NgramProposer(max_n=3, min_n=3)
    assert all(not lookup.propose(prompt + truth[:i], 4) for i in range(1, n)), (
        f"the test needs a continuation without a repeated 3-gram, got {truth}"
    )
    engine = Engine(
        random_model,
        max_model_len=MAX_MODEL_LEN,
        speculative=SpeculativeConfig("ngram", 4, prompt_lookup_max=3, prompt_lookup_min=3),
    )
    result = engine.generate([prompt], greedy(n), progress=False)[0]
    assert result.token_ids == truth
    assert engine.num_drafts == 0 and result.num_draft_tokens == 0, "no match, no guesses"
    assert engine.runner.num_forwards == n, "one target pass per token, as without speculation"


def test_a_proposer_that_is_always_right_gives_k_plus_one_tokens_a_pass(random_model):
    prompt, n, k = [9, 9, 8], 24, 3
    engine, _ = with_oracle(random_model, prompt, n, k, right=True)
    result = engine.generate([prompt], greedy(n), progress=False)[0]
    assert result.token_ids == single_request_greedy(random_model, prompt, n)
    assert result.num_accepted_tokens == result.num_draft_tokens > 0
    assert engine.runner.num_forwards == 1 + math.ceil((n - 1) / (k + 1)), (
        f"the prefill gives one token, then each pass keeps {k} guesses and adds its own: "
        f"{engine.runner.num_forwards} target passes"
    )


def test_a_proposer_that_is_always_wrong_costs_one_pass_a_token(random_model):
    prompt, n, k = [9, 9, 8], 10, 4
    engine, _ = with_oracle(random_model, prompt, n, k, right=False)
    result = engine.generate([prompt], greedy(n), progress=False)[0]
    assert result.token_ids == single_request_greedy(random_model, prompt, n)
    assert result.num_accepted_tokens == 0 and result.num_draft_tokens == 4 * 5 + 3 + 2 + 1
    assert engine.runner.num_forwards == n, "every pass keeps only the target's own token"


# ------------------------------------------------------------ KV rollback


def test_rejected_guesses_give_back_the_blocks_they_took_and_are_never_named():
    store = PagedKVStore(num_blocks=8, block_size=4, enable_prefix_caching=True)
    scheduler = Scheduler(make_policy("chunked"), Limits(2, 64), store, set(), 64)
    seq = Sequence("a", [1, 2, 3, 4, 5, 6, 7], SamplingParams(max_tokens=20, temperature=0), 0.0)
    scheduler.add(seq)
    scheduler.update(scheduler.schedule(), [[8]])  # positions 0..6 in 2 blocks; token 8 is sampled
    seq.spec_token_ids = [9, 10, 11, 12, 13]  # positions 8..12: two more blocks
    work = scheduler.schedule()
    assert [(w.start, w.num_tokens) for w in work] == [(7, 6)] and len(seq.block_table) == 4
    assert [store.blocks[b].prefix_hash is not None for b in seq.block_table] == [True, True, False, False], (
        "only the blocks full of the sequence's own tokens (positions 0..7) may be named; the guesses' are not"
    )
    scheduler.update(work, [[9, 99]])  # the first guess kept, then the target's own 99
    assert seq.output_token_ids == [8, 9, 99] and seq.num_computed_tokens == 9
    assert len(seq.block_table) == 3, "positions 0..8 need 3 blocks: the 4th held only rejected guesses"
    assert store.usage == 3 / 8, f"the freed block goes back to the pool: usage {store.usage}"
    check_blocks(store, scheduler.running)
    scheduler.finish(seq, "abort")
    assert store.usage == 0


def hashes_of(store: PagedKVStore, tokens: list[int]) -> set[int]:
    """The names of every full block of `tokens`, as the store names them."""
    seq, parent, names = Sequence("x", tokens, SamplingParams(), 0.0), None, set()
    for index in range(len(tokens) // store.block_size):
        parent = store._prefix_hash(parent, seq, index)
        names.add(parent)
    return names


def test_a_prefix_cache_hit_on_speculated_blocks_and_no_rejected_guess_ever_named(target):
    engine = Engine(
        target,
        policy="chunked",
        max_num_seqs=2,
        max_num_batched_tokens=64,
        max_model_len=MAX_MODEL_LEN,
        kv_store="paged",
        block_size=4,
        enable_prefix_caching=True,
        speculative=config("ngram", 8),  # 8 guesses span two blocks past the newest token
    )
    store = engine.kv_store
    first = PROMPTS[0]
    truth = single_request_greedy(target, first, 40)
    real = hashes_of(store, first + truth)
    engine.add_request(first, greedy(40), request_id="first")
    while engine.has_unfinished():
        engine.step()
        wrong = [b.block_id for b in store.blocks if b.prefix_hash is not None and b.prefix_hash not in real]
        assert not wrong, f"blocks {wrong} were named (shareable) but do not hold real tokens: a guess was hashed"
    assert engine.num_draft_tokens > engine.num_accepted_tokens > 0, "the test needs both kept and rejected guesses"
    second = first + truth[:24]  # a prompt that starts with the first request's speculated output
    hits_before = store.hit_tokens
    result = engine.generate([second], greedy(10), progress=False)[0]
    assert store.hit_tokens - hits_before > len(first), (
        "the second prompt should hit blocks that the first request filled while speculating"
    )
    assert result.token_ids == single_request_greedy(target, second, 10), (
        "a cache hit on blocks filled while speculating changed the tokens"
    )


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_a_preemption_mid_speculation_changes_no_token(target, draft, method):
    params = [greedy(n) for n in (40, 36, 30, 40, 24, 40)]
    longest = max(len(p) + n.max_tokens for p, n in zip(PROMPTS, params))
    engine = Engine(
        target,
        policy="chunked",
        max_num_seqs=6,
        max_num_batched_tokens=128,
        max_model_len=MAX_MODEL_LEN,
        kv_store="paged",
        num_kv_blocks=-(-longest // 4) + 8,  # room for one, and a bit
        block_size=4,
        speculative=config(method, 4, draft),
    )
    speculating_victims = []
    preempt = engine.scheduler.preempt

    def watched_preempt(seq):
        speculating_victims.append(bool(seq.spec_token_ids))
        preempt(seq)

    engine.scheduler.preempt = watched_preempt
    results = engine.generate(PROMPTS, params, progress=False)
    assert any(speculating_victims), (
        f"the pool was meant to preempt a sequence holding guesses: {len(speculating_victims)} preemptions, none so"
    )
    for prompt, sp, result in zip(PROMPTS, params, results):
        assert result.token_ids == single_request_greedy(target, prompt, sp.max_tokens), (
            f"request {result.request_id} ({method}) lost its greedy tokens across a preemption mid-speculation"
        )
    assert engine.kv_cache_usage == 0, "every block comes back"
    assert draft_slots_all_free(engine), "a preempted or finished request still holds a draft slot"


def test_aborting_a_speculating_request_frees_its_blocks_and_draft_slot(target, draft):
    engine = Engine(
        target,
        policy="chunked",
        max_num_seqs=2,
        max_model_len=MAX_MODEL_LEN,
        kv_store="paged",
        block_size=4,
        speculative=config("draft_model", 4, draft),
    )
    engine.add_request(PROMPTS[0], greedy(40), request_id="keep")
    engine.add_request(PROMPTS[1], greedy(40), request_id="drop")
    for _ in range(4):
        engine.step()
    drop = engine.requests["drop"]
    assert "drop" in engine.proposer.slots and drop.num_computed_tokens > len(PROMPTS[1]), (
        "the request was meant to be decoding with guesses from the draft"
    )
    held = set(drop.block_table) - set(engine.requests["keep"].block_table)
    engine.abort("drop")
    assert held <= set(engine.kv_store.free_blocks), "the aborted request's blocks go back to the pool"
    assert "drop" not in engine.proposer.slots and len(engine.proposer.free_slots) == 1, "its draft slot is freed"
    check_blocks(engine.kv_store, engine.scheduler.running)
    kept = steps_of(engine, "keep")
    assert engine.kv_cache_usage == 0 and draft_slots_all_free(engine)
    assert kept[-1].finish_reason == "length"


# ------------------------------------------------------------ temperature > 0: the target's distribution

DRAWS = 2000
PROMPT = [11, 22, 33, 44, 55]
SAMPLED = SamplingParams(max_tokens=3, temperature=1.0, top_k=4, ignore_eos=True)  # 4 tokens per position


def probs_after(model, tokens: list[int]) -> torch.Tensor:
    cache = KVCache.for_model(model, 1, len(tokens))
    logits = model(torch.tensor(tokens), torch.arange(len(tokens)), cache, logits_rows=torch.tensor([len(tokens) - 1]))
    return sampling_probs(logits[0], SAMPLED)


class GuessLikeliest:
    """Guesses the target's likeliest second token given the first: accepted often, rejected often."""

    def __init__(self, guess: dict[int, int]):
        self.guess = guess

    def propose(self, seqs, num_guesses):
        return [[self.guess[seq.output_token_ids[0]]] for seq in seqs]

    def free(self, seq):
        pass


@torch.no_grad()
def first_two_tokens_chi_square(model) -> tuple[float, int]:
    """Pearson's chi-square of the engine's first two sampled tokens (the second one verified by
    rejection sampling) over DRAWS seeded requests, against the target's own joint distribution;
    and its degrees of freedom."""
    p1 = probs_after(model, PROMPT)
    firsts = p1.nonzero().flatten().tolist()
    p2 = {t: probs_after(model, PROMPT + [t]) for t in firsts}
    engine = Engine(
        model, max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=16, speculative=config("ngram", 1)
    )
    engine.proposer = GuessLikeliest({t: int(p2[t].argmax()) for t in firsts})
    params = [replace(SAMPLED, seed=i) for i in range(DRAWS)]
    results = engine.generate([PROMPT] * DRAWS, params, progress=False)
    assert engine.num_draft_tokens == DRAWS and 0 < engine.num_accepted_tokens < DRAWS, (
        "every request verifies one guess at its second token, and some must be rejected"
    )
    counts = Counter((r.token_ids[0], r.token_ids[1]) for r in results)
    expected = {(a, b): DRAWS * float(p1[a] * p2[a][b]) for a in firsts for b in p2[a].nonzero().flatten().tolist()}
    assert set(counts) <= set(expected), f"pairs the target gives probability 0: {set(counts) - set(expected)}"
    assert min(expected.values()) >= 5, "too few draws per cell for a chi-square test"
    chi_square = sum((counts[cell] - e) ** 2 / e for cell, e in expected.items())
    return chi_square, len(expected) - 1


def chi_square_bound(dof: int) -> float:
    """Mean + 4 standard deviations of a chi-square with `dof` degrees of freedom: a correct sampler
    exceeds it about once in 500 seeds (this test's seeds are fixed, so it does not flake)."""
    return dof + 4 * math.sqrt(2 * dof)


def test_rejection_sampling_keeps_the_targets_distribution(random_model):
    chi_square, dof = first_two_tokens_chi_square(random_model)
    assert chi_square < chi_square_bound(dof), (
        f"the first two tokens are not distributed as the target's (chi-square {chi_square:.1f} with {dof} degrees "
        f"of freedom, bound {chi_square_bound(dof):.1f}): accept a guess x with probability p(x), and on a "
        f"rejection draw from p without x"
    )


def resample_from_p(probs, guesses, generator=None):
    """A classic mistake: on a rejection, draw from p itself rather than from max(0, p - q)."""
    kept = []
    for p, guess in zip(probs, guesses):
        if torch.rand((), generator=generator) < p[guess]:
            kept.append(guess)
            continue
        return kept + [int(torch.multinomial(p, 1, generator=generator)[0])]
    return kept + [int(torch.multinomial(probs[len(guesses)], 1, generator=generator)[0])]


def test_the_distribution_check_catches_a_wrong_acceptance_rule(random_model, monkeypatch):
    monkeypatch.setattr(speculation, "accept_sampled", resample_from_p)
    chi_square, dof = first_two_tokens_chi_square(random_model)
    assert chi_square > 3 * chi_square_bound(dof), (
        f"drawing from p after a rejection favours the guess; the check should see it (chi-square {chi_square:.1f})"
    )


# ------------------------------------------------------------ what a server shows


def test_stats_and_metrics_count_drafts_under_vllms_names(target):
    engine = Engine(target, max_model_len=MAX_MODEL_LEN, speculative=config("ngram", 3))
    results = engine.generate(PROMPTS[:3], greedy(30), progress=False)
    stats = engine.stats()
    assert stats.num_draft_tokens == sum(r.num_draft_tokens for r in results) > 0
    assert stats.num_accepted_tokens == sum(r.num_accepted_tokens for r in results) > 0
    assert 0 < stats.num_drafts <= stats.num_draft_tokens and stats.phase_seconds["propose"] > 0
    metrics = ServerMetrics("tiny")
    metrics.attach(engine.stats, lambda: True)
    values = read_metrics(metrics.render().decode())
    assert values["infer:spec_decode_num_drafts_total"] == stats.num_drafts
    assert values["infer:spec_decode_num_draft_tokens_total"] == stats.num_draft_tokens
    assert values["infer:spec_decode_num_accepted_tokens_total"] == stats.num_accepted_tokens


def test_a_server_speculates_in_its_engine_core_and_shows_the_counters():
    settings = EngineSettings(max_num_seqs=4, max_model_len=MAX_MODEL_LEN, speculative=config("ngram", 4))
    course = load_model("tiny", weights="course", quiet=True)
    with start_server(course, settings, model_name="tiny") as server:  # the config crosses to the core process
        body = {"prompt": PROMPTS[0], "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).json()
        stats = server.served.engine.stats()
        values = read_metrics(httpx.get(f"{server.url}/metrics").text)
    assert reply["usage"]["completion_tokens"] == 40
    assert values["infer:spec_decode_num_draft_tokens_total"] == stats.num_draft_tokens > 0
    assert values["infer:spec_decode_num_accepted_tokens_total"] == stats.num_accepted_tokens > 0


def test_a_bad_speculative_config_is_refused(random_model):
    with pytest.raises(ValueError, match="unknown speculative method"):
        SpeculativeConfig("eagle", 3)
    with pytest.raises(ValueError, match="positive integer"):
        SpeculativeConfig("ngram", 0)
    with pytest.raises(ValueError, match="needs a draft_model"):
        SpeculativeConfig("draft_model", 3)
