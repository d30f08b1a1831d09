"""One engine step through block tables (infer.paged_attention.PagedKV) gives the same logits as
running each sequence on its own through a positional cache: whether a sequence's keys sit in one
long slot or in small blocks scattered over the cache, and whatever else shares the step."""

import random

import torch

from infer.kv_cache import ConcatKVCache, KVCache
from infer.model import Transformer
from infer.paged_attention import PagedKV, SeqRun

# float32 through 4 layers: BLAS kernels block sums differently for different batch sizes
RTOL, ATOL = 1e-4, 1e-4

PROMPT_LENS = [5, 17, 1, 30, 9]
# one step: decodes of sequences 0, 1, 3 and 4, a new prompt (sequence 5), and a chunk of sequence 2 after its 1 token
STEP = [(0, 1, 5), (1, 1, 17), (5, 7, 0), (3, 1, 30), (2, 4, 1), (4, 1, 9)]  # (sequence, tokens, first position)


def _runs(parts) -> list[SeqRun]:
    runs, row = [], 0
    for seq, n, start in parts:
        runs.append(SeqRun(seq, row, start, n))
        row += n
    return runs


def _step_through_block_tables(
    model, cache: KVCache, tables: list[list[int]], prompts, step_tokens, step=STEP
) -> torch.Tensor:
    """Prefill every prompt, then run `step` in one forward, all through block tables."""
    for seq, prompt in enumerate(prompts):
        run = SeqRun(seq, 0, 0, len(prompt))
        model(prompt, torch.arange(len(prompt)), PagedKV.for_runs(cache, [run], [tables[seq]]))
    runs = _runs(step)
    positions = torch.cat([torch.arange(r.start, r.end) for r in runs])
    return model(step_tokens, positions, PagedKV.for_runs(cache, runs, [tables[r.seq_id] for r in runs]))


def _step_one_sequence_at_a_time(model, prompts, step_tokens, step=STEP) -> torch.Tensor:
    alone = KVCache.for_model(model, len(PROMPT_LENS) + 1, 64)
    for seq, prompt in enumerate(prompts):
        model(prompt, torch.arange(len(prompt)), alone, torch.full_like(prompt, seq))
    pieces = step_tokens.split([n for _, n, _ in step])
    return torch.cat(
        [
            model(t, torch.arange(start, start + n), alone, torch.full_like(t, seq))
            for (seq, n, start), t in zip(step, pieces)
        ]
    )


def _inputs():
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 250, (n,), generator=g) for n in PROMPT_LENS]
    step_tokens = torch.randint(0, 250, (sum(n for _, n, _ in STEP),), generator=g)
    return prompts, step_tokens


@torch.no_grad()
def test_a_step_through_slots_matches_each_sequence_alone(tiny):
    model = Transformer.from_hf(tiny.model)
    prompts, step_tokens = _inputs()
    slots = KVCache.for_model(model, len(PROMPT_LENS) + 1, 64)  # the slot store's layout: block s is slot s
    together = _step_through_block_tables(
        model, slots, [[s] for s in range(len(PROMPT_LENS) + 1)], prompts, step_tokens
    )
    torch.testing.assert_close(
        together, _step_one_sequence_at_a_time(model, prompts, step_tokens), rtol=RTOL, atol=ATOL
    )


@torch.no_grad()
def test_decodes_in_side_by_side_slots_read_in_place_match_each_sequence_alone(tiny):
    model = Transformer.from_hf(tiny.model)
    prompts, _ = _inputs()
    decodes = [(3, 1, 30), (0, 1, 5), (4, 1, 9), (1, 1, 17), (2, 1, 1)]  # slots 0-4, out of order: read in place
    step_tokens = torch.tensor([11, 12, 13, 14, 15])
    slots = KVCache.for_model(model, len(PROMPT_LENS) + 1, 64)
    runs = _runs(decodes)
    assert PagedKV.for_runs(slots, runs, [[r.seq_id] for r in runs]).first_decode_block == 0, (
        "expected the in-place path"
    )
    together = _step_through_block_tables(model, slots, [[s] for s in range(6)], prompts, step_tokens, decodes)
    torch.testing.assert_close(
        together, _step_one_sequence_at_a_time(model, prompts, step_tokens, decodes), rtol=RTOL, atol=ATOL
    )


@torch.no_grad()
def test_a_step_through_small_scattered_blocks_matches_each_sequence_alone(tiny):
    model = Transformer.from_hf(tiny.model)
    prompts, step_tokens = _inputs()
    block_size, num_blocks = 4, 40
    cache = KVCache.for_model(model, num_blocks, block_size)  # 40 blocks of 4 positions
    free = list(range(num_blocks))
    random.Random(1).shuffle(free)  # a sequence's blocks are anywhere in the cache, in any order
    needs = [-(-(PROMPT_LENS[s] + 1) // block_size) for s in range(5)] + [-(-7 // block_size)]
    needs[2] = -(-5 // block_size)  # sequence 2 grows to 5 positions this step
    tables = [[free.pop() for _ in range(n)] for n in needs]
    together = _step_through_block_tables(model, cache, tables, prompts, step_tokens)
    torch.testing.assert_close(
        together, _step_one_sequence_at_a_time(model, prompts, step_tokens), rtol=RTOL, atol=ATOL
    )


@torch.no_grad()
def test_a_block_table_too_short_for_its_positions_is_refused(tiny):
    model = Transformer.from_hf(tiny.model)
    cache = KVCache.for_model(model, 4, 4)
    try:
        PagedKV.for_runs(cache, [SeqRun(0, 0, 0, 6)], [[2]])  # 6 positions, one block of 4
    except ValueError as error:
        assert "too little room" in str(error)
    else:
        raise AssertionError("a run past its block table's room must be refused, not written elsewhere")


@torch.no_grad()
def test_the_growing_cache_still_serves_several_sequences(tiny):
    model = Transformer.from_hf(tiny.model)
    prompts = [torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6])]
    fixed, growing = KVCache.for_model(model, 2, 16), ConcatKVCache.for_model(model)
    for slot, p in enumerate(prompts):
        for cache in (fixed, growing):
            model(p, torch.arange(len(p)), cache, torch.full_like(p, slot))
    step = (torch.tensor([7, 8]), torch.tensor([5, 3]), torch.tensor([0, 1]))
    torch.testing.assert_close(
        model(*step[:2], growing, step[2]), model(*step[:2], fixed, step[2]), rtol=RTOL, atol=ATOL
    )
