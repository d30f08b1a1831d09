"""The paged KV store (week 08): blocks never leak or get lost, whatever the operations; every
policy keeps each request's single-request greedy tokens when blocks run out and sequences are
preempted; prefix caching reuses blocks, skips their prefill and changes no token."""

import random

import pytest

from infer.engine import Engine
from infer.engine.paged_kv_store import PagedKVStore
from infer.engine.scheduler import Limits, Scheduler, make_policy
from infer.engine.sequence import SamplingParams, Sequence, Status
from infer.model import Transformer
from tests.engine_helpers import greedy, single_request_greedy

MAX_MODEL_LEN = 96


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


def check_blocks(store: PagedKVStore, running: list[Sequence]) -> None:
    holders: dict[int, int] = {}
    for seq in running:
        assert len(set(seq.block_table)) == len(seq.block_table), f"{seq.request_id} holds a block twice"
        for block_id in seq.block_table:
            holders[block_id] = holders.get(block_id, 0) + 1
    assert len(set(store.free_blocks)) == len(store.free_blocks), "a block is on the free list twice"
    for block in store.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), (
            f"block {block.block_id}: ref_count {block.ref_count}, held by {holders.get(block.block_id, 0)} sequences"
        )
        assert (block.ref_count == 0) == (block.block_id in store.free_blocks), (
            f"block {block.block_id} is neither free nor owned, or both"
        )


@pytest.mark.parametrize("policy", ["continuous", "chunked"])
@pytest.mark.parametrize("seed", range(30))
def test_blocks_are_free_or_owned_and_counted_under_random_operations(policy, seed):
    rng = random.Random(seed)
    store = PagedKVStore(
        num_blocks=rng.randint(6, 16), block_size=rng.choice([2, 4, 8]), enable_prefix_caching=rng.random() < 0.7
    )
    scheduler = Scheduler(
        make_policy(policy), Limits(rng.randint(1, 5), 40), store, eos_token_ids={0}, max_model_len=MAX_MODEL_LEN
    )
    prefixes = [[rng.randrange(1, 9) for _ in range(rng.randint(4, 16))] for _ in range(3)]  # shared beginnings
    alive: list[Sequence] = []
    for op in range(rng.randint(30, 150)):
        action = rng.random()
        if action < 0.3:
            prompt = rng.choice(prefixes)[: rng.randint(1, 16)] + [
                rng.randrange(1, 9) for _ in range(rng.randint(0, 6))
            ]
            seq = Sequence(f"r{op}", prompt, SamplingParams(max_tokens=rng.randint(1, 10), temperature=0), float(op))
            if store.fits(seq.num_tokens + seq.params.max_tokens):
                scheduler.add(seq)
                alive.append(seq)
        elif action < 0.85:
            if not scheduler.has_unfinished():
                continue
            work = scheduler.schedule()
            scheduler.update(work, [[rng.randrange(0, 9)] for item in work if item.samples])  # token 0 is EOS
        elif alive:
            victim = rng.choice(alive)
            if victim.status is not Status.FINISHED:
                scheduler.finish(victim, "abort")
        check_blocks(store, scheduler.running)
        assert all(not s.block_table for s in scheduler.waiting), "a waiting (or preempted) sequence holds blocks"
    for seq in alive:
        if seq.status is not Status.FINISHED:
            scheduler.finish(seq, "abort")
    assert store.usage == 0 and sorted(store.free_blocks) == list(range(len(store.blocks))), "blocks leaked"


def random_requests(rng: random.Random, count: int) -> list[tuple[list[int], int]]:
    return [([rng.randrange(256) for _ in range(rng.randint(1, 40))], rng.randint(1, 24)) for _ in range(count)]


@pytest.mark.parametrize("policy", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("seed", range(3))
def test_a_small_pool_preempts_and_every_request_keeps_its_greedy_tokens(model, policy, seed):
    rng = random.Random(seed)
    requests = random_requests(rng, 10)
    longest = max(len(p) + n for p, n in requests)
    engine = Engine(
        model,
        policy=policy,
        max_num_seqs=8,
        max_num_batched_tokens=128,
        max_model_len=MAX_MODEL_LEN,
        kv_store="paged",
        num_kv_blocks=-(-longest // 4) + 6,
        block_size=4,
    )  # room for one, and a bit
    results = engine.generate([p for p, _ in requests], [greedy(n) for _, n in requests], progress=False)
    assert engine.num_preemptions > 0, "the pool was meant to be too small: the test no longer tests preemption"
    for (prompt, max_tokens), result in zip(requests, results):
        assert result.token_ids == single_request_greedy(model, prompt, max_tokens), (
            f"request {result.request_id} ({policy}) lost its greedy tokens across a preemption"
        )
    assert engine.kv_store.usage == 0, "every block comes back"


def test_prefix_caching_skips_the_shared_prefill_and_changes_no_token(model):
    rng = random.Random(5)
    system_prompt = [rng.randrange(256) for _ in range(40)]
    prompts = [system_prompt + [rng.randrange(256) for _ in range(rng.randint(1, 6))] for _ in range(4)]
    engine = Engine(
        model,
        policy="chunked",
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=MAX_MODEL_LEN,
        kv_store="paged",
        block_size=8,
        enable_prefix_caching=True,
        log_steps=True,
    )
    first = engine.generate(prompts[:1], greedy(5), progress=False)  # fills the cache with the system prompt
    computed_before = sum(step.num_prefill_tokens for step in engine.step_log)
    rest = engine.generate(prompts[1:], greedy(5), progress=False)
    computed_after = sum(step.num_prefill_tokens for step in engine.step_log) - computed_before
    for prompt, result in zip(prompts, first + rest):
        assert result.token_ids == single_request_greedy(model, prompt, 5), "a prefix hit changed the tokens"
    shared_blocks = len(system_prompt) // 8
    assert computed_after == sum(len(p) for p in prompts[1:]) - 3 * shared_blocks * 8, (
        "each later request should compute only what follows the 5 cached blocks of the system prompt"
    )
    assert engine.kv_store.hit_rate > 0.5


def test_the_paged_store_refuses_what_can_never_fit(model):
    engine = Engine(model, max_num_seqs=2, max_model_len=MAX_MODEL_LEN, kv_store="paged", num_kv_blocks=3, block_size=4)
    with pytest.raises(ValueError, match="can never fit"):
        engine.add_request([1] * 10, greedy(5))  # 15 tokens, 12 positions in the whole pool
    with pytest.raises(ValueError, match="unknown kv_store"):
        Engine(model, kv_store="pages")
