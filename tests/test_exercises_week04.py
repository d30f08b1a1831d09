"""Lab 04's checks: the library's own function fails, named, even in a partial; each rule of the
tiled pass fails the function that breaks it, with a message naming the rule; at grading, a
hard-coded answer meets cases it never saw."""

import functools
import math

import pytest
import torch

from infer.attention import (
    SoftmaxState,
    block_state,
    flash_attn_package,
    merge_states,
    naive_attention,
    reference_attention,
    sdpa_attention,
    tiled_attention,
)
from infer.attention_io import score_matrix_bytes
from infer.attention_triton import triton_attention
from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week04
from infer.paged_attention import causal_attention
from tests.test_check_shortcuts import merge, tiled

# ---------------------------------------------------------------- the library's own, what the kernel lacks


def test_the_kernel_lacks_every_library_function_that_answers():
    assert set(week04.HIDDEN_AT_GRADING) == {
        merge_states,
        tiled_attention,
        naive_attention,
        reference_attention,
        sdpa_attention,
        flash_attn_package,
        triton_attention,
        causal_attention,
        score_matrix_bytes,
    }


@pytest.mark.parametrize(
    "grade, twin",
    [(week04.grade_merge, merge_states), (week04.grade_score_bytes, score_matrix_bytes)],
    ids=["merge", "score_bytes"],
)
def test_the_library_function_fails_even_in_a_partial(grade, twin):
    line = grade(functools.partial(twin)).line
    name = f"{twin.__module__}.{twin.__qualname__}"
    assert f"course library's own {name}, imported rather than written" in line, line


def test_the_helpers_the_lab_gives_are_allowed():
    assert week04.grade_tiled(tiled).ok and week04.grade_merge(merge).ok
    assert week04.GIVEN[week04.TILED_QID] == (block_state, SoftmaxState)


# ---------------------------------------------------------------- the rule the issue found broken


def strips(q, k, v, causal, block_size, rows=8):
    """Attention tiled over queries only: strips of `rows` query rows, a plain softmax over all keys."""
    out, n = torch.empty_like(q), q.shape[-2]
    for start in range(0, n, rows):
        scores = q[..., start : start + rows, :] @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if causal:
            query_pos = torch.arange(start, min(start + rows, n))[:, None]
            scores = scores.masked_fill(torch.arange(n)[None, :] > query_pos, float("-inf"))
        out[..., start : start + rows, :] = torch.softmax(scores, dim=-1) @ v
    return out


@pytest.mark.parametrize("rows", [1, 8])
def test_strips_of_queries_with_a_plain_softmax_fail_naming_the_rule(rows):
    verdict = week04.grade_tiled(lambda *args: strips(*args, rows=rows))
    assert not verdict.ok and "scores or weights over 1024 keys at once" in verdict.line, verdict.line
    assert "FlashAttention tiles the keys too" in verdict.line


def test_key_blocks_larger_than_block_size_fail():
    verdict = week04.grade_tiled(
        lambda q, k, v, causal, block: (
            tiled(q, k, v, causal, block) if block != 64 else tiled_keys_by(q, k, v, causal, block, 2 * block)
        )
    )
    assert not verdict.ok and "over 128 keys at once" in verdict.line, verdict.line


def tiled_keys_by(q, k, v, causal, block_q, block_k):
    """The tiled pass with key blocks of another size than block_size."""
    n, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    for q_start in range(0, n, block_q):
        q_block = q[..., q_start : q_start + block_q, :]
        rows = q_block.shape[-2]
        state = SoftmaxState(
            torch.full((*q_block.shape[:-1], 1), float("-inf")),
            torch.zeros((*q_block.shape[:-1], 1)),
            torch.zeros_like(q_block),
        )
        for k_start in range(0, n, block_k):
            scores = q_block @ k[..., k_start : k_start + block_k, :].transpose(-2, -1) * scale
            if causal:
                query_pos = torch.arange(q_start, q_start + rows)[:, None]
                key_pos = torch.arange(k_start, k_start + scores.shape[-1])[None, :]
                scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
            state = merge(state, block_state(scores, v[..., k_start : k_start + block_k, :]))
        out[..., q_start : q_start + rows, :] = state.acc / state.sum
    return out


# ---------------------------------------------------------------- grading: cases nobody saw


def test_a_hard_coded_answer_passes_at_home_and_fails_at_grading(monkeypatch):
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    seen = {}

    def recorder(*args):
        seen[args] = args[0] * args[1] * args[2] ** 2 * args[3]
        return seen[args]

    assert week04.grade_score_bytes(recorder).ok
    table = dict(seen)
    assert week04.grade_score_bytes(lambda *args: table.get(args, 0)).ok
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    verdict = week04.grade_score_bytes(lambda *args: table.get(args, 0))
    assert not verdict.ok and "got 0, expected" in verdict.line, verdict.line
