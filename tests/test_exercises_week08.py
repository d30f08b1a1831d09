"""Lab 08's checks: the right allocator, names and cached prefix pass; each wrong implementation
that breaks a rule the lab states fails with a message naming that rule; the library's store,
imported or subclassed, is refused; and the check's references agree with the library's store."""

import random
from collections import deque

import pytest

from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week08
from infer.course.grading.exercises.week08 import (
    grade_allocator,
    grade_block_names,
    grade_cached_prefix,
    library_step,
    random_trace,
    reference_cached_prefix,
)
from infer.engine.paged_kv_store import PagedKVStore
from infer.engine.scheduler import Limits, Scheduler, make_policy
from infer.engine.sequence import SamplingParams, Sequence, Status

STORE = "infer.engine.paged_kv_store.PagedKVStore"

# ---------------------------------------------------------------- the allocator


class Allocator:
    """The lab's allocator, as a student writes it."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free_blocks = deque(range(num_blocks))
        self.ref_counts = [0] * num_blocks
        self.block_tables = {}
        self.num_tokens = {}

    def blocks_for(self, num_tokens):
        return -(-num_tokens // self.block_size)

    def room(self, cached_blocks):
        return len(self.free_blocks) - sum(1 for block in cached_blocks if self.ref_counts[block] == 0)

    def allocate(self, seq_id, num_tokens, cached_blocks=()):
        if self.blocks_for(num_tokens) - len(cached_blocks) > self.room(cached_blocks):
            return False
        for block in cached_blocks:
            self.take(block)
        self.block_tables[seq_id] = list(cached_blocks)
        self.num_tokens[seq_id] = 0
        return self.append(seq_id, num_tokens)

    def take(self, block):
        if self.ref_counts[block] == 0:
            self.free_blocks.remove(block)
        self.ref_counts[block] += 1

    def append(self, seq_id, num_tokens):
        table, total = self.block_tables[seq_id], self.num_tokens[seq_id] + num_tokens
        new = self.blocks_for(total) - len(table)
        if new > len(self.free_blocks):
            return False
        for _ in range(new):
            table.append(self.next_free_block())
            self.ref_counts[table[-1]] = 1
        self.num_tokens[seq_id] = total
        return True

    def next_free_block(self):
        return self.free_blocks.popleft()

    def free(self, seq_id):
        for block in reversed(self.block_tables.pop(seq_id)):
            self.release(block)
        del self.num_tokens[seq_id]

    def release(self, block):
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks.append(block)


class FreesSharedBlocksAtOnce(Allocator):
    def release(self, block):
        self.ref_counts[block] -= 1
        self.free_blocks.append(block)  # even while another table holds it


class HandsOutTheNewestFreeBlock(Allocator):
    def next_free_block(self):
        return self.free_blocks.pop()  # the tail: the block freed last


class FreesToTheHead(Allocator):
    def release(self, block):
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free_blocks.appendleft(block)


class FreesInTableOrder(Allocator):
    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self.release(block)
        del self.num_tokens[seq_id]


class LeavesCachedBlocksOnTheFreeList(Allocator):
    def take(self, block):
        self.ref_counts[block] += 1


class TakesNewBlocksBeforeCachedOnes(Allocator):
    def allocate(self, seq_id, num_tokens, cached_blocks=()):
        if self.blocks_for(num_tokens) - len(cached_blocks) > self.room(cached_blocks):
            return False
        self.block_tables[seq_id], self.num_tokens[seq_id] = [], 0
        new = self.blocks_for(num_tokens) - len(cached_blocks)
        new_blocks = [self.next_free_block() for _ in range(new)]  # may be a cached block at the head
        for block in cached_blocks:
            if block in self.free_blocks:
                self.free_blocks.remove(block)
            self.ref_counts[block] += 1
        for block in new_blocks:
            self.ref_counts[block] += 1
        self.block_tables[seq_id] = list(cached_blocks) + new_blocks
        self.num_tokens[seq_id] = num_tokens
        return True


class CountsCachedBlocksAsRoom(Allocator):
    def room(self, cached_blocks):
        return len(self.free_blocks)


class NeverGivesBlocksBack(Allocator):
    def release(self, block):
        self.ref_counts[block] -= 1


class SetsCountsToOne(Allocator):
    def take(self, block):
        if self.ref_counts[block] == 0:
            self.free_blocks.remove(block)
        self.ref_counts[block] = 1  # whoever else holds it


class StartsWithTheFreeListReversed(Allocator):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.free_blocks.reverse()


class PutsCachedBlocksLast(Allocator):
    def allocate(self, seq_id, num_tokens, cached_blocks=()):
        fits = super().allocate(seq_id, num_tokens, cached_blocks)
        if fits and cached_blocks:
            table = self.block_tables[seq_id]
            table[:] = table[len(cached_blocks) :] + table[: len(cached_blocks)]
        return fits


class TakesWhatItCanWhenShort(Allocator):
    def append(self, seq_id, num_tokens):
        table, total = self.block_tables[seq_id], self.num_tokens[seq_id] + num_tokens
        while len(table) < self.blocks_for(total):
            if not self.free_blocks:
                return False  # with the blocks taken so far still in the table
            table.append(self.next_free_block())
            self.ref_counts[table[-1]] = 1
        self.num_tokens[seq_id] = total
        return True


class OneBlockTooManyOnExactMultiples(Allocator):
    def blocks_for(self, num_tokens):
        return num_tokens // self.block_size + 1


class AppendIgnoresRoomInTheLastBlock(Allocator):
    def append(self, seq_id, num_tokens):
        new = self.blocks_for(num_tokens)
        if new > len(self.free_blocks):
            return False
        for _ in range(new):
            self.block_tables[seq_id].append(self.next_free_block())
            self.ref_counts[self.block_tables[seq_id][-1]] = 1
        self.num_tokens[seq_id] += num_tokens
        return True


def test_the_right_allocator_passes():
    verdict = grade_allocator(Allocator)
    assert verdict.ok, verdict.line
    assert verdict.line == grade_allocator(Allocator).line, "the same line on every run"


def test_grading_runs_unseen_cases_and_prints_the_same_line(monkeypatch):
    home = [
        grade_allocator(Allocator).line,
        grade_block_names(block_name, full_block_names).line,
        grade_cached_prefix(prefix_finder(), block_name).line,
    ]
    monkeypatch.setenv(GRADING_SALT_ENV, "lab 08")
    assert len(week08.allocator_traces(8)) == len(week08.scripted_traces()) + 16, "unseen traces at grading"
    graded = [
        grade_allocator(Allocator).line,
        grade_block_names(block_name, full_block_names).line,
        grade_cached_prefix(prefix_finder(), block_name).line,
    ]
    assert graded == home, "the grader compares the line with the solution's"


@pytest.mark.parametrize(
    "wrong, rule",
    [
        (FreesSharedBlocksAtOnce, "a shared block is freed only when its reference count reaches 0"),
        (HandsOutTheNewestFreeBlock, "new blocks come from the head of the free list, the least recently freed first"),
        (FreesToTheHead, "freed blocks go to the tail, to be handed out last"),
        (FreesInTableOrder, "a sequence gives its blocks back last block first"),
        (LeavesCachedBlocksOnTheFreeList, "leaves it when a sequence takes it"),
        (TakesNewBlocksBeforeCachedOnes, "a cached block leaves the free list as the sequence takes it"),
        (CountsCachedBlocksAsRoom, "are the cached ones this sequence takes, not extra room"),
        (NeverGivesBlocksBack, "is neither free nor in any table: it leaked"),
        (SetsCountsToOne, "its count is the number of tables holding it"),
        (StartsWithTheFreeListReversed, "every block starts free, with count 0, in the order 0 to 7"),
        (PutsCachedBlocksLast, "it starts with the cached blocks, in their order"),
        (TakesWhatItCanWhenShort, "an operation that does not fit changes nothing"),
        (OneBlockTooManyOnExactMultiples, "expected ceil(8 / 4) = 2"),
        (AppendIgnoresRoomInTheLastBlock, "an append takes a new block only when the last one is full"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else "",
)
def test_each_broken_rule_is_named(wrong, rule):
    verdict = grade_allocator(wrong)
    assert not verdict.ok and rule in verdict.reason, verdict.line


def test_an_allocator_that_returns_nothing_is_told_so():
    class ReturnsNothing(Allocator):
        def append(self, seq_id, num_tokens):
            super().append(seq_id, num_tokens)

    verdict = grade_allocator(ReturnsNothing)
    assert not verdict.ok and "returned None; expected True (it fit) or False" in verdict.reason, verdict.line


@pytest.mark.parametrize(
    "borrowed, named",
    [
        (PagedKVStore, STORE),
        (type("Mine", (PagedKVStore,), {}), STORE),
    ],
    ids=["imported", "subclassed"],
)
def test_the_library_store_is_refused_however_it_is_reached(borrowed, named):
    verdict = grade_allocator(borrowed)
    assert not verdict.ok and named in verdict.reason, verdict.line


def test_the_kernel_lacks_the_store_the_scheduler_and_the_checks_references():
    assert set(week08.HIDDEN_AT_GRADING) == {
        PagedKVStore,
        Scheduler,
        library_step,
        week08.reference_full_block_names,
        reference_cached_prefix,
        week08.build_cache,
        week08.reference_make_room,
        week08._make_room,
    }


def test_random_traces_refuse_and_share():
    """The random traces are worth running: the pool runs out and blocks are shared in them."""
    rng = random.Random(1)
    refused = shared = 0
    for number in range(8):
        trace = random_trace(rng, number)
        store, live = PagedKVStore(trace.num_blocks, trace.block_size, enable_prefix_caching=True), {}
        for op in trace.ops:
            step = library_step(store, live, op)
            refused += step.fits is False
            shared += bool(step.cached)
    assert refused and shared, (refused, shared)


# ---------------------------------------------------------------- the names and the cached prefix


def block_name(parent_name, block_tokens):
    return hash((parent_name, tuple(block_tokens)))


def name_without_parent(parent_name, block_tokens):
    return hash(tuple(block_tokens))


def chain(token_ids, block_size, name=block_name, partial_too=False):
    """The names of a sequence's blocks, each from its tokens and the name before it."""
    names, parent = [], None
    last = len(token_ids) if partial_too else len(token_ids) - block_size + 1
    for start in range(0, last, block_size):
        parent = name(parent, token_ids[start : start + block_size])
        names.append(parent)
    return names


def full_block_names(token_ids, block_size):
    return chain(token_ids, block_size)


def names_with_the_partial_block(token_ids, block_size):
    return chain(token_ids, block_size, partial_too=True)


def prefix_finder(name=block_name, leave_a_token=True, stop_at_a_miss=True):
    def cached_prefix(token_ids, cache, block_size):
        names = chain(token_ids, block_size, name)
        if leave_a_token:
            names = names[: (len(token_ids) - 1) // block_size]
        blocks = []
        for each in names:
            if each in cache:
                blocks.append(cache[each])
            elif stop_at_a_miss:
                break
        return blocks

    return cached_prefix


def test_the_right_names_and_prefix_pass():
    for verdict in (grade_block_names(block_name, full_block_names), grade_cached_prefix(prefix_finder(), block_name)):
        assert verdict.ok, verdict.line


def test_a_name_without_its_parent_is_named():
    verdict = grade_block_names(name_without_parent, full_block_names)
    assert not verdict.ok and "a block's name must depend on its parent's name" in verdict.reason, verdict.line


def test_a_name_for_the_partial_block_is_named():
    verdict = grade_block_names(block_name, names_with_the_partial_block)
    assert not verdict.ok and "a block gets its name once it is full" in verdict.reason, verdict.line


@pytest.mark.parametrize(
    "wrong_name, rule",
    [
        (lambda parent, tokens: random.random(), "a block must get the same name every time"),
        (lambda parent, tokens: hash((parent, tuple(tokens[:-1]))), "a name depends on every token of its block"),
    ],
    ids=["random", "last-token-left-out"],
)
def test_names_that_break_a_rule_are_named(wrong_name, rule):
    verdict = grade_block_names(wrong_name, full_block_names)
    assert not verdict.ok and rule in verdict.reason, verdict.line


def test_a_chain_that_leaves_out_the_last_full_block_is_named():
    def one_short(token_ids, block_size):
        return full_block_names(token_ids[:-1], block_size)  # as if a token were always left to compute

    verdict = grade_block_names(block_name, one_short)
    assert not verdict.ok and "12 tokens fill 3 blocks" in verdict.reason, verdict.line


def test_positions_instead_of_block_ids_are_named():
    def positions(token_ids, cache, block_size):
        return list(range(len(prefix_finder()(token_ids, cache, block_size))))

    verdict = grade_cached_prefix(positions, block_name)
    assert not verdict.ok and "return the cached blocks' ids, the values of the cache" in verdict.reason


def test_a_name_that_ignores_token_order_is_named():
    verdict = grade_block_names(lambda parent, tokens: hash((parent, frozenset(tokens))), full_block_names)
    assert not verdict.ok and "a name depends on the tokens in their order" in verdict.reason, verdict.line


def test_a_fully_cached_prompt_must_leave_a_token_to_compute():
    verdict = grade_cached_prefix(prefix_finder(leave_a_token=False), block_name)
    assert not verdict.ok and "at least one token must be left to compute" in verdict.reason, verdict.line
    assert "a prompt of exactly 3 blocks, all cached" in verdict.reason


def test_the_run_stops_at_a_miss_in_the_middle():
    verdict = grade_cached_prefix(prefix_finder(stop_at_a_miss=False), block_name)
    assert not verdict.ok and "is not cached, so the run stops there" in verdict.reason, verdict.line
    assert "a miss in the middle of a chain" in verdict.reason


def test_the_prefix_check_does_not_depend_on_the_names_being_right():
    """A name without its parent fails the names' check only: the prefix check builds its cache with
    the student's own names."""
    assert grade_cached_prefix(prefix_finder(name_without_parent), name_without_parent).ok


def test_the_reference_prefix_is_the_library_stores():
    """reference_cached_prefix, given the store's own names and cache, finds the blocks the store reuses."""
    rng = random.Random(3)
    for _ in range(20):
        block_size = rng.choice((2, 3, 4))
        store = PagedKVStore(64, block_size, enable_prefix_caching=True)
        base = [rng.randrange(1, 6) for _ in range(6 * block_size)]
        for index in range(12):
            seq = Sequence(str(index), base[: rng.randint(1, len(base))] + [rng.randrange(1, 6)], SamplingParams(), 0.0)
            expected = store._cached_prefix(seq)
            assert (
                reference_cached_prefix(
                    seq.prompt_token_ids, store.cached, block_size, lambda p, t: hash((p, tuple(t)))
                )
                == expected
            )
            store.allocate(seq, seq.num_tokens)
            if rng.random() < 0.5:
                store.free(seq)


# ---------------------------------------------------------------- preemption: who makes room


def make_room(
    running,
    free_blocks,
    block_size,
    *,
    victim_index=-1,
    return_blocks=True,
    count_growth=True,
    exact_fit=True,
    victim_gives_its_step=False,
    one_at_a_time=True,
):
    """A student's make_room, right by default; each keyword breaks one rule the lab states."""
    live, granted, preempted, index = list(running), [], [], 0
    while index < len(live):
        request_id, cached, new = live[index]
        held = -(-cached // block_size)
        needed = -(-(cached + new) // block_size) - held if count_growth else -(-new // block_size)
        while needed > free_blocks or (not exact_fit and needed and needed == free_blocks):
            if not one_at_a_time and len(live) > index + 1:  # every newer one at once, though the first may do
                for victim in reversed(live[index + 1 :]):
                    free_blocks += -(-victim[1] // block_size)
                    preempted.append(victim[0])
                del live[index + 1 :]
                continue
            victim = live.pop(index if victim_index == 0 else -1)
            given_back = victim[1] + (victim[2] if victim_gives_its_step else 0)
            free_blocks += -(-given_back // block_size) if return_blocks else 0
            preempted.append(victim[0])
            if victim[0] == request_id:
                break
        else:
            free_blocks -= needed
            granted.append(request_id)
            index += 1
    return granted, preempted


def test_the_right_make_room_passes():
    verdict = week08.grade_make_room(make_room)
    assert verdict.ok, verdict.line


@pytest.mark.parametrize(
    ("wrong", "rule"),
    [
        (lambda r, f, b: make_room(r, f, b, victim_index=0), "the victim is the newest running sequence"),
        (lambda r, f, b: make_room(r, f, b, return_blocks=False), "blocks go back to the pool"),
        (lambda r, f, b: make_room(r, f, b, count_growth=False), "beyond those"),
        (lambda r, f, b: make_room(r, f, b, exact_fit=False), "needs exactly the blocks that are free fits"),
        (lambda r, f, b: make_room(r, f, b, victim_gives_its_step=True), "never given room"),
        (lambda r, f, b: make_room(r, f, b, one_at_a_time=False), "stop as soon as the one in need fits"),
        (lambda r, f, b: ([request_id for request_id, *_ in r], []), "someone must be preempted"),
        (
            lambda r, f, b: (make_room(r, f, b)[0], make_room(r, f, b)[1][::-1]),
            "the newest running sequence goes first",
        ),
        (lambda r, f, b: make_room(r, f, b)[0], "expected (granted, preempted)"),
        (lambda r, f, b: None, "a missing return"),
    ],
)
def test_a_make_room_that_breaks_a_rule_is_named(wrong, rule):
    verdict = week08.grade_make_room(wrong)
    assert not verdict.ok and rule in verdict.reason, verdict.line


def test_a_make_room_that_knows_only_the_scripted_states_fails_on_the_random_ones():
    scripted = {
        case.running: week08.reference_make_room(case.running, case.free_blocks, case.block_size)
        for case in week08.room_cases([], 0)
    }
    verdict = week08.grade_make_room(lambda r, f, b: scripted.get(tuple(r), ([], [])))
    assert not verdict.ok and "random state" in verdict.reason, verdict.line


def test_the_random_states_preempt():
    cases = week08.room_cases([random.Random(0)], 16)[8:]
    assert sum(bool(week08.reference_make_room(c.running, c.free_blocks, c.block_size)[1]) for c in cases) >= 4


def library_make_room(running, free_blocks, block_size):
    """The library's scheduler on the same state: the sequences running in a store of exactly the
    blocks they hold plus `free_blocks`, each asking for its tokens of this step."""
    store = PagedKVStore(sum(-(-cached // block_size) for _, cached, _ in running) + free_blocks, block_size)
    scheduler = Scheduler(make_policy("chunked"), Limits(len(running), 10**6), store, set(), 10**6)
    plan = []
    for request_id, cached, new in running:
        seq = Sequence(request_id, list(range(cached + new)), SamplingParams(), 0.0)
        store.allocate(seq, cached)
        seq.num_computed_tokens, seq.status = cached, Status.RUNNING
        scheduler.running.append(seq)
        plan.append((seq, new))
    work = scheduler._within_kv_room(0, plan)
    preempted = [seq.request_id for seq in scheduler.waiting][::-1]  # each went to the head of the queue
    return [w.seq.request_id for w in work], preempted


def test_the_reference_make_room_is_the_library_schedulers():
    for case in week08.room_cases([random.Random(seed) for seed in range(4)], 50):
        expected = library_make_room(case.running, case.free_blocks, case.block_size)
        assert week08.reference_make_room(case.running, case.free_blocks, case.block_size) == expected, case
