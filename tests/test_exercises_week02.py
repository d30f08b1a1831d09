"""Lab 02's checks: the library's own functions and classes fail, named, however they are handed in
(a partial, a subclass, a copy); each rule the lab states fails the cache or function that breaks
it, with a message naming the rule; at grading, a hard-coded answer meets cases it never saw."""

import functools

import pytest
import torch

from infer import hf, memory
from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.exercises import week02
from infer.course.grading.exercises.week02 import _write_past_capacity
from infer.engine import Engine
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.kv_cache import ConcatKVCache, KVCache
from tests.test_check_shortcuts import PreallocatedCache, cached_loop

# ---------------------------------------------------------------- the cache: the library's own, however handed in


@pytest.mark.parametrize(
    "borrowed",
    [type("Mine", (KVCache,), {}), type("Mine", (), dict(vars(KVCache)))],
    ids=["subclass", "type copy"],
)
def test_the_library_cache_fails_however_it_is_handed_in(tiny, borrowed):
    line = week02.grade_kv_cache(borrowed, tiny.model).line
    assert "course library's own infer.kv_cache.KVCache, imported rather than written" in line, line


def test_the_kernel_lacks_every_library_function_and_class_that_answers():
    assert set(week02.HIDDEN_AT_GRADING) == {
        KVCache,
        ConcatKVCache,
        hf.greedy_generate,
        cached_greedy_generate,
        naive_greedy_generate,
        Engine,
        memory.kv_token_bytes,
        memory.kv_bytes_per_token,
        memory.sequences_that_fit,
        memory.max_concurrent_sequences,
        memory.kv_tokens_that_fit,
        memory.kv_budget_bytes,
        memory.memory_plan,
    }


def test_the_preallocated_cache_written_by_hand_passes(tiny):
    assert week02.grade_kv_cache(PreallocatedCache, tiny.model).ok


# ---------------------------------------------------------------- the cache: one rule, one wrong cache each


class IgnoresDtype(PreallocatedCache):
    """Always float32 on the CPU: the very cache that breaks on a GPU in bf16."""

    def __init__(self, num_layers, max_seqs, max_len, kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        super().__init__(num_layers, max_seqs, max_len, kv_heads, head_dim)


class IgnoresDevice(PreallocatedCache):
    def __init__(self, num_layers, max_seqs, max_len, kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        super().__init__(num_layers, max_seqs, max_len, kv_heads, head_dim, dtype=dtype)


class RefusesAnExactFit(PreallocatedCache):
    def write(self, layer, seq_id, start, k, v):
        if start + k.shape[1] >= self.max_len:  # >= where the slot still has room
            raise IndexError(f"past max_len={self.max_len}")
        super().write(layer, seq_id, start, k, v)


class CacheWithoutCapacityCheck(PreallocatedCache):
    """Relies on torch's shape mismatch instead of checking max_len."""

    def write(self, layer, seq_id, start, k, v):
        end = start + k.shape[1]
        self.k[layer][seq_id, :, start:end] = k
        self.v[layer][seq_id, :, start:end] = v


class ClipsSilently(PreallocatedCache):
    def write(self, layer, seq_id, start, k, v):
        end = min(start + k.shape[1], self.max_len)
        self.k[layer][seq_id, :, start:end] = k[:, : end - start]
        self.v[layer][seq_id, :, start:end] = v[:, : end - start]


@pytest.mark.parametrize(
    "cache, rule",
    [
        (IgnoresDtype, "a cache made with dtype=torch.bfloat16 returned keys of torch.float32: allocate the buffers"),
        (IgnoresDevice, "a cache made with device='meta' returned keys on cpu: allocate the buffers on the device"),
        (RefusesAnExactFit, week02.EXACT_FIT),
        (CacheWithoutCapacityCheck, "which does not name the capacity"),
        (ClipsSilently, "did not raise: a write past capacity must raise an error"),
    ],
    ids=["dtype", "device", "exact fit", "capacity named", "past capacity"],
)
def test_each_rule_of_the_cache_fails_the_cache_that_breaks_it(tiny, cache, rule):
    verdict = week02.grade_kv_cache(cache, tiny.model)
    assert not verdict.ok and rule in verdict.line, verdict.line


def test_the_capacity_check_passes_the_library_cache():
    assert _write_past_capacity(KVCache, week02.CACHE_QID) is None


# ---------------------------------------------------------------- the loop and the memory bill: the library's own


@pytest.mark.parametrize(
    "grade, twin",
    [
        (lambda fn, tiny: week02.grade_cached_loop(fn, tiny.model, prompts=2), cached_greedy_generate),
        (lambda fn, tiny: week02.grade_kv_bytes(fn), memory.kv_token_bytes),
        (lambda fn, tiny: week02.grade_concurrency(fn), memory.sequences_that_fit),
    ],
    ids=["loop", "kv_bytes", "concurrency"],
)
def test_the_library_function_fails_even_in_a_partial(tiny, grade, twin):
    line = grade(functools.partial(twin), tiny).line
    name = f"{twin.__module__}.{twin.__qualname__}"
    assert f"course library's own {name}, imported rather than written" in line, line


def test_the_honest_loop_passes(tiny):
    assert week02.grade_cached_loop(cached_loop, tiny.model, prompts=2).ok


# ---------------------------------------------------------------- the memory bill: its rules


def honest_concurrency(gpu, weights, reserve, per_token, seq_len):
    return max(0, int((gpu - weights - reserve) // per_token)) // seq_len


@pytest.mark.parametrize(
    "wrong, rule",
    [
        (
            lambda g, w, r, t, n: (g - w - r) // t // n,
            "on a card too small for the weights (16 GB card, 15 GB of weights, 2 GB reserve), got -35 sequences: "
            "when nothing is left for the cache, no sequence fits: 0, never fewer",
        ),
        (
            lambda g, w, r, t, n: max(0, int((g - w - r - 1) // t)) // n,
            "on a card whose free memory holds exactly 3 sequences",
        ),
        (lambda g, w, r, t, n: max(0, (g - w - r) / t / n), "a fraction of a sequence cannot run, round down"),
    ],
    ids=["never below zero", "exact fit", "whole sequences"],
)
def test_each_rule_of_the_memory_bill_fails_the_function_that_breaks_it(wrong, rule):
    assert week02.grade_concurrency(honest_concurrency).ok
    verdict = week02.grade_concurrency(wrong)
    assert not verdict.ok and rule in verdict.line, verdict.line


def test_a_hard_coded_answer_passes_at_home_and_fails_at_grading(monkeypatch):
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    seen = {}

    def recorder(*args):
        seen[args] = 2 * args[0] * args[1] * args[2] * args[3]
        return seen[args]

    assert week02.grade_kv_bytes(recorder).ok
    table = dict(seen)
    assert week02.grade_kv_bytes(lambda *args: table.get(args, 0)).ok
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    verdict = week02.grade_kv_bytes(lambda *args: table.get(args, 0))
    assert not verdict.ok and "got 0, expected" in verdict.line, verdict.line
