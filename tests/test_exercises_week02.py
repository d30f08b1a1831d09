"""Lab 02's checks: each refused library function or class fails however it is handed in, naming it;
each rule the lab states fails the cache or function that breaks it, with a message naming the
rule; at grading, a hard-coded answer meets cases it never saw."""

import pytest
import torch

from infer import hf, memory
from infer.course.grading.checks import GRADING_SALT_ENV, LibraryCalls
from infer.course.grading.exercises import week02
from infer.course.grading.exercises.week02 import _write_past_capacity
from infer.engine import Engine, SamplingParams
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.kv_cache import ConcatKVCache, KVCache
from infer.models import MODEL_SPECS
from tests.refusals import CLASS_WRAPPERS, FUNCTION_WRAPPERS, assert_refused, wrapped_class, wrapped_function
from tests.test_check_shortcuts import PreallocatedCache, cached_loop

# ---------------------------------------------------------------- the cache: every library class, every wrapper


@pytest.mark.parametrize("kind", CLASS_WRAPPERS)
def test_the_library_cache_fails_however_it_is_handed_in(tiny, kind):
    assert_refused(week02.grade_kv_cache(wrapped_class(KVCache, kind), tiny.model), KVCache)


def test_a_cache_built_on_the_growing_library_cache_fails_naming_it(tiny):
    def growing(num_layers, max_seqs, max_len, kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        return ConcatKVCache(num_layers)

    assert_refused(week02.grade_kv_cache(growing, tiny.model), ConcatKVCache)
    assert set(week02.REFUSED[week02.CACHE_QID]) == {KVCache, ConcatKVCache}


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
    assert _write_past_capacity(KVCache, week02.CACHE_QID, LibraryCalls()) is None


# ---------------------------------------------------------------- the loop and the memory bill: every refused function


def _via_engine(model, prompt_ids, max_new_tokens, cache):
    engine = Engine(model.model, max_num_seqs=1, max_model_len=prompt_ids.numel() + max_new_tokens)
    (result,) = engine.generate(
        [prompt_ids.reshape(-1).tolist()],
        SamplingParams(max_tokens=max_new_tokens, temperature=0, ignore_eos=True),
        progress=False,
    )
    return torch.tensor(result.token_ids)[None]


def _via_kv_tokens(gpu, weights, reserve, per_token, seq_len):
    config = MODEL_SPECS["qwen2.5-1.5b"].config()  # only to reach the function: the answer is not its business
    return (
        memory.kv_tokens_that_fit(config, "bf16", gpu / 2**30, 0) * 0
        + int((gpu - weights - reserve) // per_token) // seq_len
    )


ADAPTED = [
    ("loop", hf.greedy_generate, lambda model, ids, n, cache: hf.greedy_generate(HF_MODEL[0], ids, n)),
    ("loop", cached_greedy_generate, lambda model, ids, n, cache: cached_greedy_generate(model, ids, n, cache)),
    ("loop", naive_greedy_generate, lambda model, ids, n, cache: naive_greedy_generate(HF_MODEL[0], ids, n)),
    ("loop", Engine, _via_engine),
    ("kv_bytes", memory.kv_token_bytes, lambda *args: memory.kv_token_bytes(*args)),
    (
        "kv_bytes",
        memory.kv_bytes_per_token,
        lambda layers, heads, dim, width: (
            memory.kv_bytes_per_token(MODEL_SPECS["tiny"].config(), "bf16") * 0 + 2 * layers * heads * dim * width
        ),
    ),
    ("concurrency", memory.sequences_that_fit, lambda *args: memory.sequences_that_fit(*args)),
    (
        "concurrency",
        memory.max_concurrent_sequences,
        lambda g, w, r, t, n: (
            memory.max_concurrent_sequences(MODEL_SPECS["tiny"].config(), "bf16", 1, n, 0) * 0
            + max(0, int((g - w - r) // t)) // n
        ),
    ),
    ("concurrency", memory.kv_tokens_that_fit, _via_kv_tokens),
    (
        "concurrency",
        memory.kv_budget_bytes,
        lambda g, w, r, t, n: (
            memory.kv_budget_bytes(MODEL_SPECS["tiny"].config(), "bf16", 1, 0) * 0 + max(0, int((g - w - r) // t)) // n
        ),
    ),
    (
        "concurrency",
        memory.memory_plan,
        lambda g, w, r, t, n: (
            len(str(memory.memory_plan("tiny", MODEL_SPECS["tiny"].config(), "bf16", 24, 1024, 1))) * 0
            + max(0, int((g - w - r) // t)) // n
        ),
    ),
]
HF_MODEL = []  # the check's float32 model, for the adapters that need transformers' model


def grade(check: str, fn, tiny):
    if check == "loop":
        HF_MODEL[:] = [hf.float32_copy(tiny.model)]
        return week02.grade_cached_loop(fn, tiny.model, prompts=2)
    return {"kv_bytes": week02.grade_kv_bytes, "concurrency": week02.grade_concurrency}[check](fn)


def test_every_refused_function_is_adapted_here():
    qids = {"loop": week02.LOOP_QID, "kv_bytes": week02.KV_BYTES_QID, "concurrency": week02.CONCURRENCY_QID}
    adapted = {(check, refused) for check, refused, _ in ADAPTED}
    assert adapted == {(check, refused) for check, qid in qids.items() for refused in week02.REFUSED[qid]}


@pytest.mark.parametrize("check, refused, student", ADAPTED, ids=[f"{c}-{r.__name__}" for c, r, _ in ADAPTED])
def test_a_function_built_on_a_refused_one_fails_naming_it(tiny, check, refused, student):
    assert_refused(grade(check, student, tiny), refused)


@pytest.mark.parametrize("kind", FUNCTION_WRAPPERS)
@pytest.mark.parametrize(
    "check, twin",
    [
        ("loop", cached_greedy_generate),
        ("kv_bytes", memory.kv_token_bytes),
        ("concurrency", memory.sequences_that_fit),
    ],
)
def test_the_twin_fails_however_it_is_wrapped(tiny, check, twin, kind):
    assert_refused(grade(check, wrapped_function(twin, kind), tiny), twin)


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
