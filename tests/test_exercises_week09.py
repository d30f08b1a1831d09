"""Lab 09's check (infer/course/grading/exercises/week09.py): block-by-block decode attention passes;
a gather of whole sequences, a missing mask and the course's own kernel fail, each with its reason."""

import math

import pytest
import torch

from infer.course.grading.checks import OpWatch, is_view_op
from infer.course.grading.exercises.week09 import grade_paged_decode, reference_paged_decode
from infer.cpu_kernels import KernelUnavailable, in_place_decode_attention


def block_by_block(q, k_cache, v_cache, block_tables, lengths, scale):
    batch, heads, head_dim = q.shape
    kv_heads, block_size = k_cache.shape[1], k_cache.shape[2]
    queries = q.view(batch, kv_heads, heads // kv_heads, head_dim)
    best = torch.full((*queries.shape[:-1], 1), float("-inf"))
    total, weighted = torch.zeros_like(best), torch.zeros_like(queries)
    for column in range(math.ceil(int(lengths.max()) / block_size)):
        blocks = block_tables[:, column]
        scores = torch.einsum("bkgd,bksd->bkgs", queries, k_cache[blocks]) * scale
        visible = (column * block_size + torch.arange(block_size))[None, :] < lengths[:, None]
        scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
        new_best = torch.maximum(best, scores.amax(dim=-1, keepdim=True))
        weights, rescale = torch.exp(scores - new_best), torch.exp(best - new_best)
        total = total * rescale + weights.sum(dim=-1, keepdim=True)
        weighted = weighted * rescale + torch.einsum("bkgs,bksd->bkgd", weights, v_cache[blocks])
        best = new_best
    return (weighted / total).reshape(batch, heads, head_dim)


def test_block_by_block_attention_passes():
    verdict = grade_paged_decode(block_by_block)
    assert verdict.ok, verdict.line


def test_gathering_whole_sequences_fails_however_it_is_done():
    library = grade_paged_decode(reference_paged_decode)
    assert not library.ok and "the course library's own" in library.line, library.line
    everything = grade_paged_decode(lambda *args: reference_paged_decode(*args))  # the same, wrapped
    assert not everything.ok and "as large as a sequence's keys" in everything.line, everything.line

    def one_sequence_at_a_time(q, k_cache, v_cache, block_tables, lengths, scale):
        return torch.cat(
            [reference_paged_decode(q[b : b + 1], k_cache, v_cache, block_tables[b : b + 1], lengths[b : b + 1], scale)
             for b in range(q.shape[0])]
        )  # fmt: skip

    per_sequence = grade_paged_decode(one_sequence_at_a_time)
    assert not per_sequence.ok and "as large as a sequence's keys" in per_sequence.line, per_sequence.line


def test_a_missing_mask_is_caught_on_values():
    def unmasked(q, k_cache, v_cache, block_tables, lengths, scale):
        return block_by_block(q, k_cache, v_cache, block_tables, torch.full_like(lengths, int(lengths.max())), scale)

    verdict = grade_paged_decode(unmasked)
    assert not verdict.ok and "differs from the gathered attention" in verdict.line, verdict.line


def test_the_course_kernel_is_not_an_answer():
    try:
        kernel = in_place_decode_attention()
    except KernelUnavailable as why:
        pytest.skip(f"the in-place decode kernel cannot be built here: {why}")
    verdict = grade_paged_decode(kernel)
    assert not verdict.ok and "compiled kernel" in verdict.line, verdict.line


def test_views_of_a_large_input_are_not_counted_as_built():
    assert is_view_op("aten::slice.Tensor") and is_view_op("aten::alias") and not is_view_op("aten::index_select")
    cache = torch.randn(64, 2, 16, 32)
    with OpWatch() as watch:
        cache[:, :, :8].transpose(1, 2)
        cache.index_select(0, torch.tensor([1, 2]))
    assert watch.first_larger_than(1000, ignore_views=True) == ("aten::index_select", (2, 2, 16, 32))
    assert watch.first_larger_than(1000)[0] != "aten::index_select", "without ignore_views the slice counts first"


def test_the_scale_given_is_the_scale_used():
    def own_scale(q, k_cache, v_cache, block_tables, lengths, scale):
        return block_by_block(q, k_cache, v_cache, block_tables, lengths, q.shape[-1] ** -0.5)

    verdict = grade_paged_decode(own_scale)
    assert not verdict.ok and "multiply them by the `scale` given" in verdict.line, verdict.line


def test_part_a_names_a_unit_slip():
    from infer.course.grading.checks import grade_answer

    assert "(seconds?)" in grade_answer("09.q1", 2.138e-3).line
    assert "(milliseconds?)" in grade_answer("09.q3", 2.9 / 312).line
    assert "(microseconds?)" in grade_answer("09.q4", 311 * 5).line
