"""Lab 08 code checks: a block allocator with reference counts and a least-recently-freed free
list, the prefix hash chain that finds a new sequence's cached blocks, and who is preempted when
the blocks run out.

- `check_allocator(BlockAllocator)`: the student's allocator and the library's store
  (infer.engine.paged_kv_store.PagedKVStore, prefix caching on) run the same traces of
  allocations, appends and frees side by side: scripted traces, each built so that rules of the
  lab decide its operations (an exact multiple of the block size, a pool that runs out, a shared
  block freed by one of its holders, cached blocks taken back from the free list, one of them at
  its head, exact fits), then random ones. After every operation the student's own state must
  hold the invariants (every block free or held, reference counts equal to the tables holding a
  block, nothing leaked) and equal the library's: the answer, the block tables, and the free list
  in its order. The first difference is reported with the rule behind it.
- `check_block_names(block_name, full_block_names)`: a name depends on its block's tokens, in
  order, and on its parent's name; a sequence's chain names its full blocks only.
- `check_cached_prefix(cached_prefix, block_name)`: the longest run of a prompt's first full
  blocks found in a cache built with the student's own names, stopping at the first miss and
  leaving at least one token to compute (the reference agrees with the library's store:
  tests/test_exercises_week08.py).
- `check_make_room(make_room)`: which running sequences get the blocks their tokens of this step
  need and which are preempted when the pool runs out: the newest running sequence goes first, its
  blocks back to the pool, until the one in need fits or was itself the newest. Scripted states,
  each built so that one rule decides it, then random ones; a wrong answer that a known mistake
  gives is named by that mistake (the reference agrees with the library's scheduler:
  tests/test_exercises_week08.py).

At grading the library code that computes the answers (HIDDEN_AT_GRADING: the library's store and
scheduler, and the check's own references) is not in the student's kernel.
"""

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from infer.course.grading.checks import Verdict, case_rngs, library_verdict
from infer.engine.paged_kv_store import PagedKVStore
from infer.engine.scheduler import Scheduler
from infer.engine.sequence import SamplingParams, Sequence

ALLOCATOR_QID = "08.lab.allocator"
NAMES_QID = "08.lab.block_names"
PREFIX_QID = "08.lab.cached_prefix"
ROOM_QID = "08.lab.make_room"


class _Stop(Exception):
    """The first problem a check finds: the reason its line gives."""


def _blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _run_student(fn: Callable, description: str, *args, on_error: str = ""):
    """`fn(*args)`, the student's code; a problem becomes _Stop."""
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the student's bug (or stub), reported as one line
        if isinstance(exc, NotImplementedError):
            raise _Stop(f"not implemented yet ({exc})" if str(exc) else "not implemented yet") from None
        raise _Stop(f"{description} raised {type(exc).__name__}: {exc}{on_error}") from None


def _what(value) -> str:
    return "None (a missing return?)" if value is None else f"a {type(value).__name__}"


def _handed_in_verdict(qid: str, fn, signature: str) -> Verdict | None:
    """A failing verdict for what is not a function, or is the library's own; None for the student's."""
    if not callable(fn):
        return Verdict(qid, False, f"expected {signature}, got a {type(fn).__name__}")
    return library_verdict(qid, fn)


# ---------------------------------------------------------------- the block allocator


@dataclass(frozen=True)
class Op:
    kind: str  # "allocate", "append" or "free"
    seq_id: str
    tokens: tuple[int, ...] = ()  # allocate: the prompt; append: the tokens the sequence grows by


@dataclass(frozen=True)
class Trace:
    description: str
    num_blocks: int
    block_size: int
    ops: tuple[Op, ...]


def _tokens(first: int, count: int) -> tuple[int, ...]:
    """`count` tokens that no other scripted sequence has, so that they find nothing cached."""
    return tuple(range(first, first + count))


def scripted_traces() -> list[Trace]:
    """Each trace holds rules the lab states; the comments give the library's answers."""
    shared = _tokens(500, 8)  # two full blocks of 4, which a, b and c of the third trace start with
    prefix = _tokens(700, 4)  # two full blocks of 2, for the last trace
    return [
        Trace(
            "sequences of 6, 8 (an exact multiple of the block size) and 1 tokens that grow and finish",
            8,
            4,
            (
                Op("allocate", "s1", _tokens(100, 6)),  # [0, 1]
                Op("allocate", "s2", _tokens(200, 8)),  # [2, 3]: 8 tokens fill two blocks, no third
                Op("allocate", "s3", _tokens(300, 1)),  # [4]
                Op("append", "s1", _tokens(106, 2)),  # 8 tokens: still [0, 1], its last block had room
                Op("append", "s1", _tokens(108, 1)),  # 9 tokens: [0, 1, 5]
                Op("free", "s2"),  # free list [6, 7, 3, 2]: to the tail, last block first
                Op("allocate", "s4", _tokens(400, 5)),  # [6, 7]: the least recently freed first
                Op("allocate", "s5", _tokens(450, 4)),  # [3]
                Op("append", "s3", _tokens(301, 3)),  # 4 tokens: still [4]
                Op("append", "s3", _tokens(304, 1)),  # 5 tokens: [4, 2]
                Op("free", "s1"),
                Op("free", "s3"),
                Op("free", "s4"),
                Op("free", "s5"),
            ),
        ),
        Trace(
            "a pool of 5 blocks of 4 that runs out",
            5,
            4,
            (
                Op("allocate", "a", _tokens(100, 9)),  # [0, 1, 2]
                Op("allocate", "b", _tokens(200, 10)),  # needs 3 blocks, 2 are free: False, nothing changes
                Op("append", "a", _tokens(109, 4)),  # 13 tokens: [0, 1, 2, 3]
                Op("append", "a", _tokens(113, 8)),  # 21 tokens need 2 more blocks, 1 is free: False
                Op("append", "a", _tokens(113, 7)),  # 20 tokens: the last free block, an exact fit
                Op("allocate", "c", _tokens(300, 1)),  # no free block: False
                Op("free", "a"),
                Op("allocate", "c", _tokens(300, 20)),  # the whole pool, an exact fit
                Op("free", "c"),
            ),
        ),
        Trace(
            "three sequences that start with the same two full blocks",
            8,
            4,
            (
                Op("allocate", "a", shared + _tokens(100, 3)),  # [0, 1, 2]; blocks 0 and 1 are full and named
                Op("allocate", "b", shared + _tokens(200, 2)),  # cached [0, 1], now in 2 tables; new [3]
                Op("free", "a"),  # block 2 is free; 0 and 1 stay, b holds them
                Op("free", "b"),  # free list [4, 5, 6, 7, 2, 3, 1, 0]
                Op("allocate", "c", shared + _tokens(300, 5)),  # cached [0, 1] leave the free list; new [4, 5]
                Op("append", "c", _tokens(305, 3)),  # 16 tokens: still 4 blocks
                Op("append", "c", _tokens(308, 1)),  # 17 tokens: [0, 1, 4, 5, 6]
                Op("free", "c"),
            ),
        ),
        Trace(
            "a pool of 6 blocks of 2 whose free list holds cached blocks",
            6,
            2,
            (
                Op("allocate", "x", _tokens(100, 2)),  # [0]
                Op("allocate", "a", prefix + _tokens(200, 2)),  # [1, 2, 3]
                Op("free", "a"),  # free list [4, 5, 3, 2, 1]; blocks 1 and 2 still hold the prefix
                # 11 tokens: 6 blocks, 2 of them cached, so 4 new; of the 5 free blocks, 2 are those
                # cached ones: 3 to hand out, False
                Op("allocate", "b", prefix + _tokens(300, 7)),
                Op("allocate", "b", prefix + _tokens(300, 5)),  # 5 blocks: cached [1, 2], new [4, 5, 3], exactly
                Op("free", "x"),
                Op("free", "b"),
            ),
        ),
        Trace(
            "a pool of 3 blocks of 2 whose free list starts with a cached block",
            3,
            2,
            (
                Op("allocate", "a", prefix),  # [0, 1], both full and named
                Op("allocate", "y", _tokens(100, 2)),  # [2]
                Op("free", "a"),  # free list [1, 0]
                Op("free", "y"),  # free list [1, 0, 2]
                Op("allocate", "b", prefix + _tokens(200, 1)),  # cached [0, 1] leave the free list first; new [2]
                Op("free", "b"),
            ),
        ),
    ]


def random_trace(rng: random.Random, number: int) -> Trace:
    """Random allocations (some sharing a prefix), appends and frees in a small pool, run through
    the library's store as they are drawn, so that every operation names a live sequence."""
    block_size, num_blocks = rng.choice((2, 3, 4)), rng.randint(6, 14)
    prefixes = [[rng.randrange(1, 40) for _ in range(rng.randint(block_size, 4 * block_size))] for _ in range(2)]
    store, live, ops = PagedKVStore(num_blocks, block_size, enable_prefix_caching=True), {}, []
    for index in range(rng.randint(20, 40)):
        action = rng.random()
        if action < 0.4 or not live:
            prefix = rng.choice(prefixes)
            prompt = prefix[: rng.randint(0, len(prefix))] + [rng.randrange(1, 40) for _ in range(rng.randint(1, 6))]
            op = Op("allocate", f"r{index}", tuple(prompt))
        elif action < 0.8:
            op = Op("append", rng.choice(list(live)), tuple(rng.randrange(1, 40) for _ in range(rng.randint(1, 5))))
        else:
            op = Op("free", rng.choice(list(live)))
        library_step(store, live, op)
        ops.append(op)
    ops += [Op("free", seq_id) for seq_id in live]
    return Trace(f"random trace {number} ({num_blocks} blocks of {block_size})", num_blocks, block_size, tuple(ops))


def allocator_traces(random_traces: int) -> list[Trace]:
    """The scripted traces, then `random_traces` random ones from each of the check's generators
    (at grading, one more whose traces nobody saw)."""
    rngs = [rng for rng in case_rngs(ALLOCATOR_QID) for _ in range(random_traces)]
    return scripted_traces() + [random_trace(rng, number) for number, rng in enumerate(rngs, 1)]


@dataclass(frozen=True)
class LibraryStep:
    """What the library's store did with one operation (allocate and append; a free is plain)."""

    fits: bool | None = None  # None for a free
    cached: tuple[int, ...] = ()  # allocate: the cached blocks the sequence starts with
    needed: int = 0  # new blocks the operation needs
    room: int = 0  # blocks the free list can hand out for it
    cached_on_free_list: int = 0  # cached blocks that no table held: on the free list, and not room
    num_tokens: int = 0  # the sequence's tokens once it fits


def library_step(store: PagedKVStore, live: dict[str, Sequence], op: Op) -> LibraryStep:
    """Apply `op` to the library's store as the engine's scheduler would (ask, then act); `live`
    holds its sequences."""
    if op.kind == "free":
        store.free(live.pop(op.seq_id))
        return LibraryStep()
    if op.kind == "allocate":
        seq = Sequence(op.seq_id, list(op.tokens), SamplingParams(max_tokens=1), 0.0)
        cached = tuple(store._cached_prefix(seq))
        idle = sum(1 for block in cached if store.blocks[block].ref_count == 0)
        step = LibraryStep(
            fits=store.can_allocate(seq, seq.num_tokens),
            cached=cached,
            needed=_blocks_for(seq.num_tokens, store.block_size) - len(cached),
            room=len(store.free_blocks) - idle,
            cached_on_free_list=idle,
            num_tokens=seq.num_tokens,
        )
        if step.fits:
            store.allocate(seq, seq.num_tokens)
            seq.num_computed_tokens = seq.num_tokens
            live[op.seq_id] = seq
        return step
    seq = live[op.seq_id]
    total = seq.num_tokens + len(op.tokens)
    step = LibraryStep(
        fits=store.can_append(seq, len(op.tokens)),
        needed=_blocks_for(total, store.block_size) - len(seq.block_table),
        room=len(store.free_blocks),
        num_tokens=total,
    )
    if step.fits:
        seq.output_token_ids += op.tokens  # the tokens are there before the step that computes them
        store.append(seq, len(op.tokens))
        seq.num_computed_tokens = seq.num_tokens
    return step


@dataclass(frozen=True)
class AllocatorState:
    free: list[int]  # head first
    ref_counts: list[int]
    tables: dict[str, list[int]]  # sequences that hold blocks


def _student_state(allocator, num_blocks: int) -> AllocatorState:
    try:
        counts = allocator.ref_counts
        return AllocatorState(
            list(allocator.free_blocks),
            [counts.get(block, 0) if isinstance(counts, dict) else counts[block] for block in range(num_blocks)],
            {seq_id: list(table) for seq_id, table in allocator.block_tables.items() if len(table)},
        )
    except AttributeError as exc:
        raise _Stop(f"{exc}: the allocator keeps free_blocks, ref_counts and block_tables, as the lab says") from None
    except (IndexError, KeyError, TypeError) as exc:
        raise _Stop(
            f"reading the allocator's state raised {type(exc).__name__}: {exc} (free_blocks: block ids, the next "
            f"to hand out first; ref_counts[block]: a count for every block; block_tables: {{seq_id: block ids}})"
        ) from None


def _library_state(store: PagedKVStore, live: dict[str, Sequence]) -> AllocatorState:
    return AllocatorState(
        list(store.free_blocks),
        [block.ref_count for block in store.blocks],
        {seq_id: list(seq.block_table) for seq_id, seq in live.items()},
    )


def _student_step(allocator, op: Op, cached: tuple[int, ...]):
    if op.kind == "allocate":
        return allocator.allocate(op.seq_id, len(op.tokens), list(cached))
    if op.kind == "append":
        return allocator.append(op.seq_id, len(op.tokens))
    return allocator.free(op.seq_id)


def _op_text(op: Op, cached: tuple[int, ...]) -> str:
    if op.kind == "allocate":
        return f"allocate({op.seq_id!r}, {len(op.tokens)}{f', cached_blocks={list(cached)}' if cached else ''})"
    if op.kind == "append":
        return f"append({op.seq_id!r}, {len(op.tokens)})"
    return f"free({op.seq_id!r})"


def _room_text(step: LibraryStep) -> str:
    text = f"it needs {_plural(step.needed, 'new block')} and the free list can hand out {step.room}"
    if step.cached_on_free_list:
        text += (
            f" ({step.cached_on_free_list} of the {step.room + step.cached_on_free_list} blocks on it are the "
            f"cached ones this sequence takes, not extra room)"
        )
    return text


def _answer_problem(op: Op, step: LibraryStep, got) -> str | None:
    if op.kind == "free":
        return None
    if not isinstance(got, bool):
        return f"returned {got!r}; expected True (it fit) or False (it did not, and nothing changed)"
    if got == step.fits:
        return None
    if got:
        return f"returned True, but {_room_text(step)}: an operation that does not fit returns False"
    return f"returned False, but {_room_text(step)}: it fits"


def _changed_on_refusal(before: AllocatorState, after: AllocatorState, step: LibraryStep) -> str | None:
    changed = [
        what
        for what, old, new in (
            ("the free list", before.free, after.free),
            ("the reference counts", before.ref_counts, after.ref_counts),
            ("the block tables", before.tables, after.tables),
        )
        if old != new
    ]
    if not changed:
        return None
    return (
        f"returned False, yet changed {_listed(changed)}: an operation that does not fit changes nothing, so "
        f"find out whether it fits before taking any block; here {_room_text(step)}"
    )


def _first_repeat(values: list[int]) -> int | None:
    return next((value for value, count in Counter(values).items() if count > 1), None)


def _invariant_problem(state: AllocatorState, op: Op, cached: tuple[int, ...]) -> str | None:
    """What breaks the invariants in `state`: every block is free or held (not both, not neither),
    and a block's reference count is the number of tables holding it."""
    num_blocks = len(state.ref_counts)
    unknown = [b for b in state.free + [b for t in state.tables.values() for b in t] if b not in range(num_blocks)]
    if unknown:
        return f"block {unknown[0]!r} does not exist (the blocks are 0 to {num_blocks - 1})"
    for seq_id, table in state.tables.items():
        twice = _first_repeat(table)
        if twice is not None and twice in cached:
            return (
                f"{seq_id!r} holds block {twice} twice: a cached block leaves the free list as the sequence takes "
                f"it, before new blocks are taken from the head"
            )
        if twice is not None:
            return f"{seq_id!r} holds block {twice} twice"
    twice = _first_repeat(state.free)
    if twice is not None:
        return f"block {twice} is on the free list twice"
    holders = Counter(block for table in state.tables.values() for block in table)
    free = set(state.free)
    for block in range(num_blocks):
        if block in free and holders[block]:
            if op.kind == "free":
                return (
                    f"block {block} went back to the free list while {_plural(holders[block], 'other table')} "
                    f"still {'holds' if holders[block] == 1 else 'hold'} it: a shared block is freed only when its "
                    f"reference count reaches 0"
                )
            if block in cached:
                return (
                    f"cached block {block} is in the table of {op.seq_id!r} and still on the free list: a cached block "
                    f"that no table held waits on the free list, and leaves it when a sequence takes it"
                )
            return f"block {block} is on the free list and in a block table: a block is either free or held"
        if state.ref_counts[block] != holders[block]:
            return (
                f"block {block} has reference count {state.ref_counts[block]}, but "
                f"{_plural(holders[block], 'block table')} hold it: its count is the number of tables holding it"
            )
        if block not in free and not holders[block]:
            return (
                f"block {block} is neither free nor in any table: it leaked (a block that no table holds goes "
                f"back to the free list)"
            )
    return None


def _table_problem(
    op: Op, step: LibraryStep, before: AllocatorState, after: AllocatorState, expected: AllocatorState, block_size: int
) -> str | None:
    if op.kind != "free" and step.fits:
        got, wanted = after.tables.get(op.seq_id, []), expected.tables[op.seq_id]
        if got != wanted:
            if len(got) != len(wanted):
                why = ": an append takes a new block only when the last one is full" if op.kind == "append" else ""
                return (
                    f"{op.seq_id!r} holds {_plural(len(got), 'block')} for its {step.num_tokens} tokens, expected "
                    f"ceil({step.num_tokens} / {block_size}) = {len(wanted)}{why}"
                )
            if got[: len(step.cached)] != list(step.cached):
                return f"its table is {got}, expected {wanted}: it starts with the cached blocks, in their order"
            first_new = len(wanted) - step.needed
            newest = (
                f" (block {got[first_new]} came from the tail, where the block freed last goes)"
                if step.needed and before.free and got[first_new] == before.free[-1]
                else ""
            )
            return (
                f"its table is {got}, expected {wanted}: new blocks come from the head of the free list, the least "
                f"recently freed first{newest}"
            )
    for seq_id in sorted(set(after.tables) | set(expected.tables)):
        got, wanted = after.tables.get(seq_id, []), expected.tables.get(seq_id, [])
        if got != wanted:
            if not wanted:
                return f"{seq_id!r} still holds blocks {got}: free lets go of every block of the sequence"
            return f"the table of {seq_id!r} is {got}, expected {wanted}"
    return None


def _free_list_problem(op: Op, before: AllocatorState, after: AllocatorState, expected: AllocatorState) -> str | None:
    if after.free == expected.free:
        return None
    shown = f"the free list is {after.free} (head first), expected {expected.free}"
    released = [block for block in expected.free if block not in before.free]  # in the library's order
    if op.kind == "free" and released and sorted(after.free) == sorted(expected.free):
        if set(after.free[: len(released)]) == set(released):
            return f"{shown}: freed blocks go to the tail, to be handed out last (the least recently freed first)"
        if after.free[-len(released) :] == released[::-1]:
            return (
                f"{shown}: a sequence gives its blocks back last block first, so that a cached prefix loses its "
                f"tail before its head"
            )
    return shown


def _replay(allocator_class, trace: Trace) -> None:
    """Run `trace` through the student's allocator and the library's store; _Stop at the first
    difference."""
    where = f"on {trace.description}"
    allocator = _run_student(
        allocator_class,
        f"{where}, BlockAllocator({trace.num_blocks}, {trace.block_size})",
        trace.num_blocks,
        trace.block_size,
    )
    store, live = PagedKVStore(trace.num_blocks, trace.block_size, enable_prefix_caching=True), {}
    state, expected = _student_state(allocator, trace.num_blocks), _library_state(store, live)
    if (state.free, state.ref_counts) != (expected.free, expected.ref_counts):
        raise _Stop(
            f"{where}, a new BlockAllocator({trace.num_blocks}, {trace.block_size}) has free list {state.free} and "
            f"reference counts {state.ref_counts}: every block starts free, with count 0, in the order "
            f"0 to {trace.num_blocks - 1}"
        )
    for number, op in enumerate(trace.ops, 1):
        before = _student_state(allocator, trace.num_blocks)
        step = library_step(store, live, op)
        text = f"{where}, operation {number}, {_op_text(op, step.cached)}"
        if_it_raises = f": {_room_text(step)}, so it returns False and changes nothing" if step.fits is False else ""
        got = _run_student(_student_step, text, allocator, op, step.cached, on_error=if_it_raises)
        after, expected = _student_state(allocator, trace.num_blocks), _library_state(store, live)
        problem = (
            _answer_problem(op, step, got)
            or (_changed_on_refusal(before, after, step) if step.fits is False else None)
            or _invariant_problem(after, op, step.cached)
            or _table_problem(op, step, before, after, expected, trace.block_size)
            or _free_list_problem(op, before, after, expected)
        )
        if problem:
            raise _Stop(f"{text}: {problem}")


def grade_allocator(allocator_class, random_traces: int = 8) -> Verdict:
    qid = ALLOCATOR_QID
    refused = _handed_in_verdict(qid, allocator_class, "a class BlockAllocator(num_blocks, block_size)")
    if refused:
        return refused
    traces = allocator_traces(random_traces)
    try:
        for trace in traces:
            _replay(allocator_class, trace)
    except _Stop as stop:
        return Verdict(qid, False, str(stop))
    return Verdict(
        qid,
        True,
        "scripted and random traces of allocations, appends and frees: the library's answers, block tables and "
        "free list order; every block free or held, counted right, none leaked",
    )


def check_allocator(allocator_class, random_traces: int = 8) -> None:
    print(grade_allocator(allocator_class, random_traces).line)


# ---------------------------------------------------------------- naming full blocks


def reference_full_block_names(token_ids, block_size: int, block_name: Callable) -> list:
    """The names of a sequence's full blocks, each from its tokens and the name before it."""
    names, parent = [], None
    for index in range(len(token_ids) // block_size):
        parent = block_name(parent, list(token_ids[index * block_size : (index + 1) * block_size]))
        names.append(parent)
    return names


def _named(block_name: Callable, parent, tokens: list[int], parent_text: str):
    call = f"block_name({parent_text}, {tokens})"
    name = _run_student(block_name, call, parent, list(tokens))
    if name is None:
        raise _Stop(f"{call} returned None (a missing return?): expected a name, such as a hash")
    try:
        hash(name)
    except TypeError:
        raise _Stop(
            f"{call} returned a {type(name).__name__}, which cannot be a dict key: return a hash, of a tuple"
        ) from None
    return name


FIRST, CHANGED_LAST, SWAPPED, OTHER = [5, 9, 2, 7], [5, 9, 2, 8], [9, 5, 2, 7], [3, 3, 1, 4]
PARENT_RULE = (
    "a block's name must depend on its parent's name: the same tokens after another prefix have other keys and "
    "values, so a name stands for the whole prefix up to its block"
)


def _names_problem(block_name: Callable) -> str | None:
    first = _named(block_name, None, FIRST, "None")
    if _named(block_name, None, FIRST, "None") != first:
        return f"block_name(None, {FIRST}) gave two different names: a block must get the same name every time"
    if _named(block_name, None, CHANGED_LAST, "None") == first:
        return f"{FIRST} and {CHANGED_LAST} get the same name: a name depends on every token of its block"
    if _named(block_name, None, SWAPPED, "None") == first:
        return f"{FIRST} and {SWAPPED} get the same name: a name depends on the tokens in their order"
    other = _named(block_name, None, OTHER, "None")
    after_first = _named(block_name, first, CHANGED_LAST, f"the name of {FIRST}")
    if _named(block_name, other, CHANGED_LAST, f"the name of {OTHER}") == after_first:
        return f"{CHANGED_LAST} gets the same name after {FIRST} and after {OTHER}: {PARENT_RULE}"
    if _named(block_name, None, CHANGED_LAST, "None") == after_first:
        return f"{CHANGED_LAST} gets the same name as a first block and after {FIRST}: {PARENT_RULE}"
    return None


def _distinct_names_problem(block_name: Callable, rng: random.Random) -> str | None:
    """Random blocks after random parents: different ones must get different names."""
    seen, parents = {}, [None]
    for _ in range(60):
        parent = rng.choice(parents)
        tokens = [rng.randrange(1, 6) for _ in range(rng.choice((2, 3, 4)))]
        key = (parents.index(parent), tuple(tokens))
        name = _named(block_name, parent, tokens, "a name")
        if name in seen and seen[name] != key:
            return f"two different blocks (tokens or parents) got the same name: {PARENT_RULE}"
        seen[name] = key
        parents.append(name)
    return None


def _chain_cases(rngs: list[random.Random]) -> list[tuple[str, list[int], int]]:
    """(description, tokens, block size): the edges first, then 8 random sequences per generator."""
    cases = [
        ("12 tokens in blocks of 4 (an exact multiple)", list(range(11, 23)), 4),
        ("a prompt of 3 tokens, shorter than a block of 4", [11, 12, 13], 4),
        ("10 tokens in blocks of 4", list(range(11, 21)), 4),
        ("the same 12 tokens in blocks of 1", list(range(11, 23)), 1),
    ]
    for number, rng in enumerate([rng for rng in rngs for _ in range(8)], 1):
        block_size = rng.choice((2, 3, 4, 16))
        tokens = [rng.randrange(1, 50) for _ in range(rng.randint(1, 5 * block_size))]
        cases.append((f"random sequence {number} ({len(tokens)} tokens in blocks of {block_size})", tokens, block_size))
    return cases


def _chain_problem(got, expected: list, tokens: list[int], block_size: int) -> str | None:
    if not isinstance(got, (list, tuple)):
        return f"returned {_what(got)}; expected a list of names"
    got = list(got)
    if len(got) != len(expected):
        full = len(tokens) // block_size
        if len(tokens) % block_size and len(got) == full + 1:
            if full == 0:
                return "got 1 name, expected none: a block gets its name once it is full, and this one is not"
            return (
                f"got {len(got)} names, expected {full}: only full blocks are named ({len(tokens)} // {block_size} = "
                f"{full}); the last block is still filling, so no other sequence can share it"
            )
        return f"got {_plural(len(got), 'name')}, expected {len(expected)}: {len(tokens)} tokens fill {full} blocks"
    for index, (name, wanted) in enumerate(zip(got, expected)):
        if name != wanted:
            parent = "None" if index == 0 else f"name {index - 1}"
            return (
                f"name {index} is not block_name({parent}, tokens {index * block_size}-{(index + 1) * block_size - 1}):"
                f" each name comes from its block's tokens and the name before it"
            )
    return None


def grade_block_names(block_name, full_block_names) -> Verdict:
    qid = NAMES_QID
    refused = _handed_in_verdict(
        qid, block_name, "a function block_name(parent_name, block_tokens)"
    ) or _handed_in_verdict(qid, full_block_names, "a function full_block_names(token_ids, block_size)")
    if refused:
        return refused
    rngs = case_rngs(qid)
    try:
        problem = _names_problem(block_name) or next(
            filter(None, (_distinct_names_problem(block_name, rng) for rng in rngs)), None
        )
        if problem:
            return Verdict(qid, False, problem)
        cases = _chain_cases(rngs)
        for description, tokens, block_size in cases:
            got = _run_student(full_block_names, f"on {description}, full_block_names", list(tokens), block_size)
            expected = _run_student(
                reference_full_block_names, f"on {description}, your block_name", tokens, block_size, block_name
            )
            problem = _chain_problem(got, expected, tokens, block_size)
            if problem:
                return Verdict(qid, False, f"on {description}, {problem}")
    except _Stop as stop:
        return Verdict(qid, False, str(stop))
    return Verdict(
        qid,
        True,
        "names depend on every token, in order, and on the parent's name; full blocks only are named, on "
        "sequences that fill their blocks exactly, end in a partial block, or are shorter than one",
    )


def check_block_names(block_name, full_block_names) -> None:
    print(grade_block_names(block_name, full_block_names).line)


# ---------------------------------------------------------------- the longest cached prefix


def reference_cached_prefix(token_ids, cache: dict, block_size: int, block_name: Callable) -> list[int]:
    """The blocks of the longest run of the sequence's first full blocks found in `cache` (name ->
    block id), leaving at least one token to compute: the step that computes it gives the next token."""
    blocks, parent = [], None
    for index in range((len(token_ids) - 1) // block_size):
        parent = block_name(parent, list(token_ids[index * block_size : (index + 1) * block_size]))
        if parent not in cache:
            break
        blocks.append(cache[parent])
    return blocks


FIRST_BLOCK_ID = 100  # block ids that are not positions, so that positions returned instead show


@dataclass(frozen=True)
class PrefixCase:
    description: str
    prompt: tuple[int, ...]
    block_size: int
    earlier: tuple[tuple[int, ...], ...]  # sequences served before, whose full blocks the cache names
    evicted: tuple[int, ...] = ()  # block ids handed out again since: their names are gone


def build_cache(case: PrefixCase, block_name: Callable) -> dict:
    """{name: block id} of the earlier sequences' full blocks, as a store would hold them: a block
    shared by several sequences is one block; evicted blocks are gone."""
    cache, next_id = {}, FIRST_BLOCK_ID
    for tokens in case.earlier:
        for name in reference_full_block_names(tokens, case.block_size, block_name):
            if name not in cache:
                cache[name], next_id = next_id, next_id + 1
    return {name: block for name, block in cache.items() if block not in case.evicted}


P1, P2, P3, P4 = (5, 9, 2, 7), (8, 1, 6, 3), (4, 4, 0, 2), (7, 7, 1, 5)


def prefix_cases(rngs: list[random.Random], random_cases: int) -> list[PrefixCase]:
    """Scripted cases (blocks of 4; the comments give the answer), then `random_cases` random ones
    per generator."""
    cases = [
        PrefixCase("a prompt of exactly 3 blocks, all cached", P1 + P2 + P3, 4, (P1 + P2 + P3,)),  # [100, 101]
        PrefixCase("a prompt one token past 3 cached blocks", P1 + P2 + P3 + (9,), 4, (P1 + P2 + P3,)),  # 100-102
        PrefixCase("a prompt of 3 tokens, shorter than a block", P1[:3], 4, (P1 + P2,)),  # []
        PrefixCase(
            "a miss in the middle of a chain (its second block was evicted)",
            P1 + P2 + P3 + P4 + (3,),
            4,
            (P1 + P2 + P3 + P4,),
            evicted=(101,),
        ),  # [100]
        PrefixCase("cached tokens after another prefix", P2 + P3 + (6,), 4, (P1 + P2 + P3,)),  # []
        PrefixCase(
            "a prompt that parts from a cached one inside its second block", P1 + (8, 1, 9, 9) + P3, 4, (P1 + P2 + P3,)
        ),  # [100]
        PrefixCase(
            "two cached sequences that share their first block", P1 + P4 + P3 + (2,), 4, (P1 + P2 + P3, P1 + P4)
        ),  # [100, 103]
        PrefixCase("an empty cache", P1 + P2 + (1,), 4, ()),  # []
    ]
    for number, rng in enumerate([rng for rng in rngs for _ in range(random_cases)], 1):
        block_size = rng.choice((2, 3, 4))
        bases = [tuple(rng.randrange(1, 9) for _ in range(5 * block_size)) for _ in range(2)]

        def drawn(rng=rng, bases=bases, block_size=block_size) -> tuple[int, ...]:
            base = rng.choice(bases)
            return base[: rng.randint(0, len(base))] + tuple(
                rng.randrange(1, 9) for _ in range(rng.randint(1, block_size))
            )

        earlier = tuple(drawn() for _ in range(rng.randint(1, 4)))
        evicted = tuple(rng.sample(range(FIRST_BLOCK_ID, FIRST_BLOCK_ID + 12), rng.randint(0, 2)))
        cases.append(
            PrefixCase(f"random prompt {number} (blocks of {block_size})", drawn(), block_size, earlier, evicted)
        )
    return cases


def _prefix_problem(got, expected: list[int], case: PrefixCase, cache: dict) -> str | None:
    if not isinstance(got, (list, tuple)):
        return f"returned {_what(got)}; expected a list of block ids"
    got = list(got)
    if got == expected:
        return None
    shown = f"got {got}, expected {expected}"
    if any(block not in cache.values() for block in got):
        return f"{shown}: return the cached blocks' ids, the values of the cache"
    limit = (len(case.prompt) - 1) // case.block_size
    if len(got) > len(expected) and got[: len(expected)] == expected:
        if len(expected) == limit:
            return (
                f"{shown}: at least one token must be left to compute (the step that computes the last prompt "
                f"token gives the first output token), so only the first ({len(case.prompt)} - 1) // "
                f"{case.block_size} = {limit} blocks are looked up"
            )
        return (
            f"{shown}: block {len(expected)} is not cached, so the run stops there; the blocks after it hold keys "
            f"and values computed after it, of no use without it"
        )
    if len(got) < len(expected) and expected[: len(got)] == got:
        return f"{shown}: the run goes on as long as the next block's name is in the cache"
    return shown


def grade_cached_prefix(cached_prefix, block_name, random_cases: int = 16) -> Verdict:
    qid = PREFIX_QID
    refused = _handed_in_verdict(
        qid, cached_prefix, "a function cached_prefix(token_ids, cache, block_size)"
    ) or _handed_in_verdict(qid, block_name, "your function block_name(parent_name, block_tokens) from Part C")
    if refused:
        return refused
    try:
        _named(block_name, None, FIRST, "None")
    except _Stop as stop:
        return Verdict(qid, False, f"this check names blocks with your block_name from Part C: {stop}")
    cases = prefix_cases(case_rngs(qid), random_cases)
    try:
        for case in cases:
            where = f"on {case.description}"
            cache = _run_student(build_cache, f"{where}, your block_name", case, block_name)
            expected = _run_student(
                reference_cached_prefix, f"{where}, your block_name", case.prompt, cache, case.block_size, block_name
            )
            got = _run_student(
                cached_prefix,
                f"{where}, cached_prefix",
                list(case.prompt),
                dict(cache),
                case.block_size,
            )
            problem = _prefix_problem(got, expected, case, cache)
            if problem:
                return Verdict(qid, False, f"{where} ({len(case.prompt)} tokens), {problem}")
    except _Stop as stop:
        return Verdict(qid, False, str(stop))
    return Verdict(
        qid,
        True,
        "the longest cached run of scripted and random prompts, among them an exact multiple of the block size, "
        "a prompt shorter than a block and a miss in the middle of a chain, with a token left to compute",
    )


def check_cached_prefix(cached_prefix, block_name) -> None:
    print(grade_cached_prefix(cached_prefix, block_name).line)


# ---------------------------------------------------------------- preemption: who makes room


@dataclass(frozen=True)
class RoomCase:
    description: str
    running: tuple[tuple[str, int, int], ...]  # (request id, tokens in the cache, tokens this step), oldest first
    free_blocks: int
    block_size: int


def _make_room(running, free_blocks: int, block_size: int, mistake: str | None = None) -> tuple[list, list]:
    """The scheduler's rule, or (for naming a wrong answer) the rule with one known mistake in it."""
    live, granted, preempted, index = list(running), [], [], 0
    while index < len(live):
        request_id, cached, new = live[index]
        if mistake == "new tokens' blocks":
            needed = _blocks_for(new, block_size)
        else:
            needed = _blocks_for(cached + new, block_size) - _blocks_for(cached, block_size)
        while needed > free_blocks or (mistake == "no exact fit" and 0 < needed == free_blocks):
            victim = live.pop(index if mistake == "itself first" else -1)
            if mistake == "victim's step counted":
                free_blocks += _blocks_for(victim[1] + victim[2], block_size)
            elif mistake != "victim's blocks kept":
                free_blocks += _blocks_for(victim[1], block_size)
            preempted.append(victim[0])
            if victim[0] == request_id:
                break
        else:
            free_blocks -= needed
            granted.append(request_id)
            index += 1
    return granted, preempted


def reference_make_room(running, free_blocks: int, block_size: int) -> tuple[list, list]:
    """Oldest first, each running sequence takes the blocks its tokens of this step need beyond
    those it holds; when the pool has too few, the newest running sequence is preempted (its blocks
    back to the pool) until it fits, or until the one preempted is itself. Returns the ids that got
    their room, in order, and the ids preempted, in the order they were."""
    return _make_room(running, free_blocks, block_size)


MISTAKES = {
    "no exact fit": "a sequence that needs exactly the blocks that are free fits: preempt only when fewer are free "
    "than it needs",
    "itself first": "a sequence short of blocks preempted itself, but the victim is the newest running sequence "
    "(the last of `running`): the oldest keep their place, as vLLM keeps the requests that came first",
    "victim's blocks kept": "a preempted sequence's blocks go back to the pool: that is what preempting it is for",
    "victim's step counted": "a preempted sequence gives back the blocks it holds, ceil(n / block_size) for its n "
    "cached tokens: its tokens of this step were never given room",
    "new tokens' blocks": "a sequence with n tokens cached holds ceil(n / block_size) blocks; it needs only what "
    "n + k tokens take beyond those (none, while the new tokens fit in its last block)",
}


def room_cases(rngs: list[random.Random], random_cases: int) -> list[RoomCase]:
    """Scripted states (blocks of 4 unless said; the comments give the answer), then `random_cases`
    random ones per generator."""
    cases = [
        RoomCase("an exact fit: the last free block", (("A", 4, 1),), 1, 4),  # [A], []
        RoomCase("a new token that fits in the last block, with no block free", (("A", 6, 1),), 0, 4),  # [A], []
        RoomCase("room for everyone", (("A", 5, 1), ("B", 8, 1), ("C", 3, 1)), 1, 4),  # all granted
        RoomCase("the newest needs a block and none is free", (("A", 5, 1), ("B", 4, 1)), 0, 4),  # [A], [B]
        RoomCase("the oldest needs a block and none is free", (("A", 8, 1), ("B", 3, 1), ("C", 6, 1)), 0, 4),
        # [A, B], [C]
        RoomCase("one victim is not enough", (("A", 4, 8), ("B", 2, 1), ("C", 1, 1)), 0, 4),  # [A], [C, B]
        RoomCase(
            "a sequence that preempts every newer one and then itself", (("A", 3, 1), ("B", 4, 9), ("C", 2, 1)), 0, 4
        ),  # [A], [C, B]
        RoomCase("a victim's blocks serve the sequences after it too", (("A", 4, 1), ("B", 4, 1), ("C", 8, 1)), 0, 4),
        # [A, B], [C]
        RoomCase("a prompt chunk, blocks of 16", (("A", 16, 1), ("B", 30, 40)), 2, 16),  # [A], [B]
        RoomCase(
            "a victim whose own step would cross into a new block", (("A", 4, 5), ("B", 2, 1), ("C", 4, 1)), 0, 4
        ),  # [A], [C, B]: C gives back the one block it holds
    ]
    for number, rng in enumerate([rng for rng in rngs for _ in range(random_cases)], 1):
        block_size = rng.choice((2, 4, 16))
        running = tuple(
            (
                chr(ord("A") + i),
                rng.randint(1, 5 * block_size),
                1 if rng.random() < 0.7 else rng.randint(2, 3 * block_size),
            )
            for i in range(rng.randint(2, 7))
        )
        cases.append(
            RoomCase(f"random state {number} (blocks of {block_size})", running, rng.randint(0, 3), block_size)
        )
    return cases


def _room_problem(got, expected: tuple[list, list], case: RoomCase) -> str | None:
    if not (isinstance(got, (list, tuple)) and len(got) == 2 and all(isinstance(g, (list, tuple)) for g in got)):
        return f"returned {_what(got)}; expected (granted, preempted): two lists of request ids"
    got = (list(got[0]), list(got[1]))
    if got == expected:
        return None
    shown = f"got granted {got[0]}, preempted {got[1]}; expected granted {expected[0]}, preempted {expected[1]}"
    for mistake, rule in MISTAKES.items():
        if got == _make_room(case.running, case.free_blocks, case.block_size, mistake):
            return f"{shown}: {rule}"
    if expected[1] and not got[1]:
        return f"{shown}: this step's tokens need more blocks than the pool has free, so someone must be preempted"
    if len(got[1]) > len(expected[1]) and got[1][: len(expected[1])] == expected[1]:
        return f"{shown}: preempt one sequence at a time, and stop as soon as the one in need fits"
    if set(got[1]) == set(expected[1]):
        return f"{shown}: the newest running sequence goes first, then the next newest"
    return shown


def grade_make_room(make_room, random_cases: int = 16) -> Verdict:
    qid = ROOM_QID
    refused = _handed_in_verdict(qid, make_room, "a function make_room(running, free_blocks, block_size)")
    if refused:
        return refused
    try:
        for case in room_cases(case_rngs(qid), random_cases):
            state = f"{list(case.running)} with {_plural(case.free_blocks, 'free block')}"
            got = _run_student(
                make_room,
                f"on {case.description}, make_room",
                [tuple(r) for r in case.running],
                case.free_blocks,
                case.block_size,
            )
            problem = _room_problem(got, reference_make_room(case.running, case.free_blocks, case.block_size), case)
            if problem:
                return Verdict(qid, False, f"on {case.description}, {state}: {problem}")
    except _Stop as stop:
        return Verdict(qid, False, str(stop))
    return Verdict(
        qid,
        True,
        "who gets room and who is preempted, on scripted and random states, among them an exact fit, a token that "
        "fits in the last block, a victim that is not enough and a sequence that preempts itself",
    )


def check_make_room(make_room) -> None:
    print(grade_make_room(make_room).line)


# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (
    PagedKVStore,
    Scheduler,
    library_step,
    reference_full_block_names,
    reference_cached_prefix,
    build_cache,
    reference_make_room,
    _make_room,
)
