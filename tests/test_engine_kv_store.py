"""The slot store never leaks: after any sequence of add, step, finish and abort, every slot is
free again. A property test over random operation sequences (seeded, so a failure replays)."""

import random

import pytest

from infer.engine import SamplingParams
from infer.engine.kv_store import SlotKVStore
from infer.engine.scheduler import Limits, Scheduler, make_policy
from infer.engine.sequence import Sequence, Status


def make_scheduler(policy: str, max_num_seqs: int) -> Scheduler:
    store = SlotKVStore(max_num_seqs, 64)
    return Scheduler(make_policy(policy), Limits(max_num_seqs, 40), store, eos_token_ids={0}, max_model_len=64)


@pytest.mark.parametrize("policy", ["static", "continuous"])
@pytest.mark.parametrize("seed", range(40))
def test_no_slot_leaks_under_random_add_step_finish_abort(policy, seed):
    rng = random.Random(seed)
    max_num_seqs = rng.randint(1, 5)
    scheduler = make_scheduler(policy, max_num_seqs)
    store = scheduler.kv_store
    alive: list[Sequence] = []
    for op in range(rng.randint(20, 120)):
        action = rng.random()
        if action < 0.35:
            params = SamplingParams(max_tokens=rng.randint(1, 8), temperature=0, ignore_eos=rng.random() < 0.5)
            seq = Sequence(f"r{op}", [rng.randrange(1, 9) for _ in range(rng.randint(1, 12))], params, float(op))
            scheduler.add(seq)
            alive.append(seq)
        elif action < 0.85:
            work = scheduler.schedule()
            sampled = [[rng.randrange(0, 9)] for item in work if item.samples]  # token 0 is EOS: some stop early
            scheduler.update(work, sampled)
        elif alive:
            victim = rng.choice(alive)
            if victim.status is not Status.FINISHED:
                scheduler.finish(victim, "abort")
        held = {s.slot for s in scheduler.running}
        assert len(held) == len(scheduler.running) <= max_num_seqs, "two running sequences share a slot"
        assert held.isdisjoint(store.free_slots) and len(held) + store.num_free == max_num_seqs
        assert all(s.slot is None for s in scheduler.waiting)
    for seq in alive:
        if seq.status is not Status.FINISHED:
            scheduler.finish(seq, "abort")
    assert store.num_free == max_num_seqs and store.usage == 0
    assert sorted(store.free_slots) == list(range(max_num_seqs)) and not store.owner


def test_double_free_is_an_error():
    store = SlotKVStore(2, 8)
    seq = Sequence("a", [1], SamplingParams(), 0.0)
    store.allocate(seq, 1)
    assert store.usage == 0.5
    store.free(seq)
    with pytest.raises(RuntimeError, match="does not hold slot"):
        store.free(seq)
