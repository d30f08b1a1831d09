"""Each lab check catches the shortcut that skips the week's idea, and names it.

Every test hands a check code that gives the right *values* the wrong way (or the library's own
function), and asserts the check fails with a line that says what was skipped. Beside each, the
honest version passes, so a check that fails everything would not go unnoticed."""

import math
import time

import pytest
import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from infer import hf
from infer.attention import SoftmaxState, block_state
from infer.course.grading.exercises import week01, week02, week03, week04
from infer.kv_cache import KVCache
from infer.metrics import request_latencies_ms

# ---------------------------------------------------------------- lab 01: the naive loop


@torch.no_grad()
def naive_loop(model, prompt_ids, max_new_tokens, timestamps=None):
    sequence = prompt_ids
    for _ in range(max_new_tokens):
        next_token = hf.forward(model, sequence)[:, -1].argmax(dim=-1, keepdim=True)
        sequence = torch.cat([sequence, next_token], dim=1)
        if timestamps is not None:
            timestamps.append(time.perf_counter())
    return sequence[:, prompt_ids.shape[1] :]


@torch.no_grad()
def naive_loop_without_timestamps(model, prompt_ids, max_new_tokens, timestamps=None):
    return naive_loop(model, prompt_ids, max_new_tokens)


@torch.no_grad()
def generate_instead_of_a_loop(model, prompt_ids, max_new_tokens, timestamps=None):
    """transformers' own generate(): the right tokens, from a cached loop."""
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=[], pad_token_id=0)
    out = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), generation_config=config)
    return out[:, prompt_ids.shape[1] :]


def test_honest_naive_loop_passes(tiny):
    verdict = week01.grade_naive_loop(naive_loop, tiny.model)
    assert verdict.ok, verdict.line


def test_naive_loop_that_records_no_timestamps_fails(tiny):
    verdict = week01.grade_naive_loop(naive_loop_without_timestamps, tiny.model)
    assert not verdict.ok and "recorded no time" in verdict.line


def test_generate_or_a_cache_in_the_naive_loop_fails(tiny):
    verdict = week01.grade_naive_loop(generate_instead_of_a_loop, tiny.model)
    assert not verdict.ok and "recomputes everything at every step" in verdict.line, verdict.line


def test_library_naive_loop_fails(tiny):
    from infer.generate import naive_greedy_generate

    verdict = week01.grade_naive_loop(naive_greedy_generate, tiny.model)
    assert not verdict.ok and "library's own infer.generate.naive_greedy_generate" in verdict.line


# ---------------------------------------------------------------- lab 02: the cache and the cached loop


class PreallocatedCache:
    def __init__(self, num_layers, max_seqs, max_len, kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        shape = (max_seqs, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_len = max_len

    def write(self, layer, seq_id, start, k, v):
        end = start + k.shape[1]
        if end > self.max_len:
            raise IndexError(f"past max_len={self.max_len}")
        self.k[layer][seq_id, :, start:end] = k
        self.v[layer][seq_id, :, start:end] = v

    def read(self, layer, seq_id, end):
        return self.k[layer][seq_id, :, :end], self.v[layer][seq_id, :, :end]


class CatCache(PreallocatedCache):
    """Right values, grown by torch.cat: every write copies everything stored so far."""

    def __init__(self, num_layers, max_seqs, max_len, kv_heads, head_dim, dtype=torch.float32, device="cpu"):
        self.held = {}
        self.max_len = max_len

    def write(self, layer, seq_id, start, k, v):
        if start + k.shape[1] > self.max_len:
            raise IndexError(f"past max_len={self.max_len}")
        old_k, old_v = self.held.get((layer, seq_id), (k[:, :0], v[:, :0]))
        self.held[layer, seq_id] = torch.cat([old_k[:, :start], k], dim=1), torch.cat([old_v[:, :start], v], dim=1)

    def read(self, layer, seq_id, end):
        k, v = self.held[layer, seq_id]
        return k[:, :end], v[:, :end]


class CopyingCache(PreallocatedCache):
    """Preallocated, but read() hands out fresh copies: storage that moves from write to write."""

    def read(self, layer, seq_id, end):
        return self.k[layer][seq_id, :, :end].clone(), self.v[layer][seq_id, :, :end].clone()


def test_preallocated_cache_passes(tiny):
    verdict = week02.grade_kv_cache(PreallocatedCache, tiny.model)
    assert verdict.ok, verdict.line


def test_cache_grown_by_torch_cat_fails(tiny):
    verdict = week02.grade_kv_cache(CatCache, tiny.model)
    assert not verdict.ok and "aten::cat, as torch.cat does" in verdict.line, verdict.line


def test_cache_whose_storage_moves_fails(tiny):
    verdict = week02.grade_kv_cache(CopyingCache, tiny.model)
    assert not verdict.ok and "moved to new memory between two writes" in verdict.line, verdict.line


@pytest.mark.parametrize("borrowed", [KVCache, type("Mine", (KVCache,), {})], ids=["imported", "subclassed"])
def test_library_cache_fails(tiny, borrowed):
    verdict = week02.grade_kv_cache(borrowed, tiny.model)
    assert not verdict.ok and "library's own infer.kv_cache.KVCache" in verdict.line, verdict.line


@torch.no_grad()
def cached_loop(model, prompt_ids, max_new_tokens, cache):
    prompt = prompt_ids.reshape(-1)
    n = prompt.shape[0]
    token = model(prompt, torch.arange(n), cache)[-1].argmax().reshape(1)
    tokens = [token]
    for i in range(1, max_new_tokens):
        token = model(token, torch.tensor([n + i - 1]), cache)[-1].argmax().reshape(1)
        tokens.append(token)
    return torch.cat(tokens)[None]


@torch.no_grad()
def recomputing_loop(model, prompt_ids, max_new_tokens, cache):
    """Right tokens, but every step runs the whole sequence again: the cache saves nothing."""
    sequence = prompt_ids.reshape(-1)
    for _ in range(max_new_tokens):
        token = model(sequence, torch.arange(sequence.shape[0]), cache)[-1].argmax().reshape(1)
        sequence = torch.cat([sequence, token])
    return sequence[prompt_ids.shape[1] :][None]


def test_cached_loop_passes(tiny):
    verdict = week02.grade_cached_loop(cached_loop, tiny.model)
    assert verdict.ok, verdict.line


def test_cached_loop_that_recomputes_fails(tiny):
    verdict = week02.grade_cached_loop(recomputing_loop, tiny.model)
    assert not verdict.ok and "one new token per decode step" in verdict.line, verdict.line


def test_library_cached_loop_fails(tiny):
    from infer.generate import cached_greedy_generate

    verdict = week02.grade_cached_loop(cached_greedy_generate, tiny.model)
    assert not verdict.ok and "library's own infer.generate.cached_greedy_generate" in verdict.line


# ---------------------------------------------------------------- lab 03: latencies and goodput


def latencies(record):
    """Written by hand, as the lab asks: the library's own is refused."""
    ttft = (record.chunk_times[0] - record.send_time) * 1e3
    e2el = (record.chunk_times[-1] - record.send_time) * 1e3
    n = record.num_output_tokens
    return ttft, (e2el - ttft) / (n - 1) if n > 1 else None, e2el


def _goodput(records, slo_ms, meets):
    duration = max(r.finish_time for r in records) - min(r.send_time for r in records)
    good = 0
    for record in records:
        if record.success:
            ttft, tpot, e2el = latencies(record)
            observed = {"ttft": ttft, "tpot": tpot or 0.0, "e2el": e2el}
            good += all(meets(observed[key], limit) for key, limit in slo_ms.items())
    return good / duration


def test_goodput_with_less_or_equal_passes():
    verdict = week03.grade_goodput(lambda records, slo: _goodput(records, slo, lambda value, limit: value <= limit))
    assert verdict.ok, verdict.line


def test_goodput_with_strictly_less_fails_and_says_so():
    verdict = week03.grade_goodput(lambda records, slo: _goodput(records, slo, lambda value, limit: value < limit))
    assert not verdict.ok and "compare with <=, not <" in verdict.line, verdict.line


def test_library_latencies_fail():
    verdict = week03.grade_latencies(request_latencies_ms)
    assert not verdict.ok and "library's own infer.metrics.request_latencies_ms" in verdict.line


# ---------------------------------------------------------------- lab 04: tiled attention


def merge(a, b):
    new_max = torch.maximum(a.max, b.max)
    scale_a, scale_b = torch.exp(a.max - new_max), torch.exp(b.max - new_max)
    return SoftmaxState(new_max, scale_a * a.sum + scale_b * b.sum, scale_a * a.acc + scale_b * b.acc)


def tiled(q, k, v, causal, block_size, mask=lambda key_pos, query_pos: key_pos > query_pos):
    n, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    out = torch.empty_like(q)
    for q_start in range(0, n, block_size):
        q_block = q[..., q_start : q_start + block_size, :]
        rows = q_block.shape[-2]
        state = SoftmaxState(
            torch.full((*q_block.shape[:-1], 1), float("-inf")),
            torch.zeros((*q_block.shape[:-1], 1)),
            torch.zeros_like(q_block),
        )
        for k_start in range(0, n, block_size):
            k_block, v_block = k[..., k_start : k_start + block_size, :], v[..., k_start : k_start + block_size, :]
            scores = q_block @ k_block.transpose(-2, -1) * scale
            if causal:
                query_pos = torch.arange(q_start, q_start + rows)[:, None]
                key_pos = torch.arange(k_start, k_start + k_block.shape[-2])[None, :]
                scores = scores.masked_fill(mask(key_pos, query_pos), float("-inf"))
            state = merge(state, block_state(scores, v_block))
        out[..., q_start : q_start + rows, :] = state.acc / state.sum
    return out


def sdpa(q, k, v, causal, block_size):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def whole_matrix(q, k, v, causal, block_size):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def strip_of_scores(q, k, v, causal, block_size):
    """Query blocks, but every key at once: a [block, N] strip of scores per step, not tiles."""
    out = torch.empty_like(q)
    for start in range(0, q.shape[-2], block_size):
        out[..., start : start + block_size, :] = (
            whole_matrix(q, k, v, False, block_size)[..., start : start + block_size, :]
            if not causal
            else _causal_rows(q, k, v, start, block_size)
        )
    return out


def _causal_rows(q, k, v, start, block_size):
    rows = q[..., start : start + block_size, :]
    scores = rows @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    query_pos = torch.arange(start, start + rows.shape[-2])[:, None]
    scores = scores.masked_fill(torch.arange(k.shape[-2])[None, :] > query_pos, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def test_tiled_attention_passes():
    verdict = week04.grade_tiled(tiled)
    assert verdict.ok, verdict.line


def test_sdpa_in_place_of_tiling_fails():
    verdict = week04.grade_tiled(sdpa)
    assert not verdict.ok and "calls scaled_dot_product_attention" in verdict.line, verdict.line


@pytest.mark.parametrize("shortcut, shape", [(whole_matrix, "1024, 1024]"), (strip_of_scores, "64, 1024]")])
def test_large_score_tensors_fail(shortcut, shape):
    verdict = week04.grade_tiled(shortcut)
    assert not verdict.ok and "built a tensor of shape" in verdict.line and f"{shape} (aten::" in verdict.line, (
        verdict.line
    )


def test_mask_that_hides_the_diagonal_names_the_nan():
    verdict = week04.grade_tiled(
        lambda q, k, v, causal, block: tiled(q, k, v, causal, block, mask=lambda key, query: key >= query)
    )
    assert not verdict.ok and "the output contains NaN" in verdict.line and "relative error nan" not in verdict.line


def test_library_merge_fails():
    from infer.attention import merge_states

    verdict = week04.grade_merge(merge_states)
    assert not verdict.ok and "library's own infer.attention.merge_states" in verdict.line


# ---------------------------------------------------------------- every check: one line, the same every run


@pytest.mark.parametrize(
    "grade, wrong",
    [
        (week01.grade_ttft_tpot, lambda send, times: ((times[0] - send) * 1e3, (times[-1] - send) / len(times) * 1e3)),
        (week01.grade_intensity, lambda m, k, n, b: m * k * n / (b * (m * k + k * n + m * n))),
        (week03.grade_latencies, lambda record: latencies(record)[:2] + (latencies(record)[2] / 1e3,)),
        (week04.grade_merge, lambda a, b: SoftmaxState(torch.maximum(a.max, b.max), a.sum + b.sum, a.acc + b.acc)),
        (week04.grade_score_bytes, lambda batch, heads, n, width: batch * heads * n * width),
    ],
    ids=["ttft_tpot", "intensity", "latencies", "merge", "score_bytes"],
)
def test_a_wrong_function_fails_with_the_same_line_twice(grade, wrong):
    first, second = grade(wrong), grade(wrong)
    assert not first.ok and first.line == second.line


# ---------------------------------------------------------------- lab 03: a message that blames the right thing


def _metrics_counting_failed_prompts(records):
    from tests.test_exercises_week03 import metrics

    result = metrics(records)
    duration = result["duration"]
    output = sum(r.num_output_tokens for r in records if r.success)
    result["total_token_throughput"] = (sum(r.prompt_len for r in records) + output) / duration
    return result


def test_failed_prompt_tokens_are_named_not_the_duration():
    verdict = week03.grade_serving_metrics(_metrics_counting_failed_prompts)
    assert not verdict.ok and "your total counts the prompt tokens of failed requests too" in verdict.line, verdict.line
    assert "duration" not in verdict.line.split("(", 1)[1], verdict.line


def test_an_honest_function_that_uses_other_library_helpers_passes():
    verdict = week04.grade_merge(merge)  # merge() itself runs no library code; block_state in tiled() is allowed
    assert verdict.ok, verdict.line


# ---------------------------------------------------------------- every lab says what it refuses


@pytest.mark.parametrize("week", ["01", "02", "03", "04", "05", "07"])
def test_each_lab_introduction_names_what_it_refuses_and_what_it_gives(week):
    import importlib

    import nbformat

    from infer.course.grading.checks import library_origin
    from tests.notebook_files import REPO_ROOT

    module = importlib.import_module(f"infer.course.grading.exercises.week{week}")
    (solution,) = (REPO_ROOT / "solutions").glob(f"{week}_*.ipynb")
    introduction = nbformat.read(solution, as_version=4).cells[0].source
    introduction = " ".join(introduction.split())
    named = [library_origin(f) for f in module.HIDDEN_AT_GRADING]
    named += [library_origin(f) for given in getattr(module, "GIVEN", {}).values() for f in given]
    missing = [name for name in named if f"`{name}`" not in introduction]
    assert not missing, f"lab {week}'s introduction does not name {missing}"


# ---------------------------------------------------------------- at grading, the same ✅ line


def _honest_checks(tiny):
    from infer.course.grading.exercises import week05, week07
    from infer.model import Transformer
    from tests.test_exercises_week02 import honest_concurrency
    from tests.test_exercises_week03 import goodput, metrics
    from tests.test_exercises_week05 import flat_step, written_admit
    from tests.test_exercises_week07 import stream_timing

    course_model = Transformer.from_hf(tiny.model)
    return [
        lambda: week01.grade_naive_loop(naive_loop, tiny.model, prompts=2),
        lambda: week01.grade_ttft_tpot(lambda s, t: ((t[0] - s) * 1e3, (t[-1] - t[0]) / (len(t) - 1) * 1e3)),
        lambda: week01.grade_intensity(lambda m, k, n, b: 2 * m * k * n / (b * (m * k + k * n + m * n))),
        lambda: week02.grade_kv_cache(PreallocatedCache, tiny.model),
        lambda: week02.grade_cached_loop(cached_loop, tiny.model, prompts=2),
        lambda: week02.grade_kv_bytes(lambda layers, heads, dim, b: 2 * layers * heads * dim * b),
        lambda: week02.grade_concurrency(honest_concurrency),
        lambda: week03.grade_latencies(latencies),
        lambda: week03.grade_serving_metrics(metrics),
        lambda: week03.grade_goodput(goodput),
        lambda: week04.grade_merge(merge),
        lambda: week04.grade_tiled(tiled),
        lambda: week04.grade_score_bytes(lambda batch, heads, n, b: batch * heads * n * n * b),
        lambda: week05.grade_admission(written_admit),
        lambda: week05.grade_step_forward(flat_step, course_model),
        lambda: week07.grade_stream_timing(stream_timing),
    ]


def test_an_honest_function_prints_the_same_line_at_home_and_at_grading(tiny, monkeypatch):
    """The grader compares each check's line with the solution's, run at home: the cases nobody saw
    must not change a passing line (a count of cases in it, say)."""
    from infer.course.grading.checks import GRADING_SALT_ENV

    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    at_home = [grade() for grade in _honest_checks(tiny)]
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    at_grading = [grade() for grade in _honest_checks(tiny)]
    for home, graded in zip(at_home, at_grading):
        assert home.ok and graded.line == home.line, (home.line, graded.line)
