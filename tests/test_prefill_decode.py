"""Week 01 library: the naive loop, TTFT/TPOT, the phase timers and the sweep helpers.

Fast and deterministic on a CPU: the tiny model with random weights, short prompts, few repeats.
No test asserts an absolute time; timings are checked for shape and consistency only."""

import math

import pytest
import torch

from infer import hf
from infer.experiments import prefill_decode as pd
from infer.generate import naive_greedy_generate
from infer.profiles import PROFILES
from infer.prompts import random_prompt_ids
from infer.timing import Timing

# `tiny` (the cpu profile's random-weight model, loaded once per session) comes from conftest.py.


@pytest.mark.parametrize("seed, length", [(0, 1), (1, 5), (2, 13), (3, 31), (4, 64)])
def test_naive_greedy_generate_matches_transformers_generate(tiny, seed, length):
    prompt = random_prompt_ids(tiny.config, length, seed=seed)
    got = naive_greedy_generate(tiny.model, prompt, 10)
    expected = hf.greedy_generate(tiny.model, prompt, 10)
    assert got.shape == (1, 10), (
        f"naive_greedy_generate must return only the 10 new tokens as [1, 10], got {tuple(got.shape)}"
    )
    assert torch.equal(got, expected), (
        f"naive loop and transformers' generate() disagree on a {length}-token prompt (seed {seed}): "
        f"{got.tolist()} vs {expected.tolist()}; the loop must take the argmax of the LAST position's logits"
    )


def test_naive_greedy_generate_records_one_increasing_timestamp_per_token(tiny):
    prompt = random_prompt_ids(tiny.config, 8)
    stamps: list[float] = []
    naive_greedy_generate(tiny.model, prompt, 5, timestamps=stamps)
    assert len(stamps) == 5, f"expected one timestamp per new token (5), got {len(stamps)}"
    assert stamps == sorted(stamps), "token timestamps must be non-decreasing"


def test_compare_with_generate_agrees_for_the_naive_loop_and_names_an_off_by_one(tiny):
    line = pd.compare_with_generate(tiny.model, tiny.config)
    assert line.startswith("token-identical") and "3 random prompts" in line, f"the naive loop must agree: {line}"

    def shifted(model, prompt_ids, max_new_tokens):  # drops the first new token: a classic slicing bug
        return naive_greedy_generate(model, prompt_ids, max_new_tokens + 1)[:, 1:]

    bad = pd.compare_with_generate(tiny.model, tiny.config, shifted)
    assert bad.startswith("differs") and "first at new token 0" in bad, f"an off-by-one loop must be named: {bad}"


def test_ttft_and_tpot_on_hand_computed_timestamps():
    ttft, tpot = pd.ttft_and_tpot_ms(10.0, [10.25, 10.27, 10.29, 10.31])
    assert math.isclose(ttft, 250.0, rel_tol=1e-9), f"TTFT = first token - send time = 250 ms, got {ttft}"
    assert math.isclose(tpot, 20.0, rel_tol=1e-9), f"TPOT = (last - first) / (N - 1) = 60 ms / 3 = 20 ms, got {tpot}"
    ttft, tpot = pd.ttft_and_tpot_ms(0.0, [1.0, 1.5])
    assert (ttft, tpot) == pytest.approx((1000.0, 500.0)), "two tokens: one gap, TPOT is that gap"


@pytest.mark.parametrize("times", [[], [0.5]])
def test_ttft_and_tpot_refuses_fewer_than_two_tokens(times):
    with pytest.raises(ValueError, match="at least 2"):
        pd.ttft_and_tpot_ms(0.0, times)


def test_token_gaps_start_with_ttft_then_inter_token_gaps():
    gaps = pd.token_gaps_ms(1.0, [1.1, 1.15, 1.35])
    assert gaps == pytest.approx([100.0, 50.0, 200.0]), f"expected [TTFT, gap, gap] = [100, 50, 200] ms, got {gaps}"
    with pytest.raises(ValueError):
        pd.token_gaps_ms(0.0, [])


def test_prefill_fills_the_cache_and_computes_only_the_last_rows_logits(tiny):
    prompt = random_prompt_ids(tiny.config, 20, seed=5)
    cache = hf.new_cache(tiny.model)
    logits = pd.prefill(tiny.model, prompt, cache)
    assert logits.shape == (1, 1, tiny.config.vocab_size), (
        f"a server's prefill computes the logits of the last position only, got shape {tuple(logits.shape)}"
    )
    assert cache.get_seq_length() == 20, "the prefill must leave every prompt token's K/V in the cache"
    torch.testing.assert_close(logits[:, 0], hf.forward(tiny.model, prompt)[:, -1], rtol=1e-4, atol=1e-4)


def test_prefill_ms_returns_the_requested_number_of_positive_samples(tiny):
    timing = pd.prefill_ms(tiny.model, random_prompt_ids(tiny.config, 16), warmup=0, repeats=3)
    assert isinstance(timing, Timing) and len(timing.samples_ms) == 3, (
        "prefill_ms must return a Timing with `repeats` samples"
    )
    assert all(ms > 0 for ms in timing.samples_ms), (
        f"every sample must be a positive time in ms, got {timing.samples_ms}"
    )


def test_decode_step_ms_leaves_the_cache_at_the_context_length(tiny, monkeypatch):
    caches = []
    real_new_cache = hf.new_cache

    def recording_new_cache(model):
        caches.append(real_new_cache(model))
        return caches[-1]

    monkeypatch.setattr(pd.hf, "new_cache", recording_new_cache)
    context = random_prompt_ids(tiny.config, 12)
    timing = pd.decode_step_ms(tiny.model, context, warmup=2, repeats=4)
    assert len(timing.samples_ms) == 4
    assert len(caches) == 1, f"decode_step_ms should fill one cache and reuse it, made {len(caches)}"
    assert caches[0].get_seq_length() == 12, (
        f"after 6 decode steps the cache must still hold exactly the 12 context tokens, holds "
        f"{caches[0].get_seq_length()}: each step must crop the token it added, or later repeats time a longer context"
    )


def test_phase_sizes_cover_every_profile_and_grow_from_cpu_to_gpu():
    for name, profile in PROFILES.items():
        sizes = pd.phase_sizes(profile)
        assert list(sizes.sweep_prompt_lens) == sorted(set(sizes.sweep_prompt_lens)), f"{name}: lengths must increase"
    assert max(pd.phase_sizes(PROFILES["gpu"]).sweep_prompt_lens) >= 8192, (
        "the GPU sweep should reach 8192-token prompts"
    )
    assert max(pd.phase_sizes(PROFILES["cpu"]).sweep_prompt_lens) <= 1024, (
        "the CPU sweep must stay small (<= 1024 tokens)"
    )


def test_sweep_table_and_plot(tiny):
    rows = pd.sweep_prefill_decode(tiny.model, tiny.config, (4, 8), prefill_repeats=2, decode_repeats=2, progress=False)
    assert [r.prompt_len for r in rows] == [4, 8], "one row per prompt length, in order"
    table = pd.format_phase_table(rows)
    assert len(table.splitlines()) == 3 and "prefill" in table, f"a header and one line per length, got:\n{table}"
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    pd.plot_phase_sweep(ax, rows)
    assert "tokens" in ax.get_xlabel() and "ms" in ax.get_ylabel(), "axes must be labelled with units"
    plt.close(fig)


def test_robust_line_ignores_one_outlier():
    x = list(range(10))
    y = [2 * v + 1 for v in x]
    y[5] = 500.0  # one token delayed by another process
    slope, intercept = pd.robust_line(x, y)
    assert slope == pytest.approx(2.0) and intercept == pytest.approx(1.0), (
        f"expected y = 2x + 1, got {slope}x + {intercept}"
    )


def test_request_latency_split_hand_computed():
    from infer.course.widgets import request_latency_split_ms

    row = pd.PhaseTiming(100, Timing((40.0,)), Timing((5.0,)))
    split = request_latency_split_ms(row, 11)
    assert list(split.values()) == [40.0, 50.0], (
        f"prefill 40 ms, then 10 more decode steps of 5 ms = 50 ms; got {split}"
    )
    with pytest.raises(ValueError):
        request_latency_split_ms(row, 0)


def test_phase_split_explorer_draws_its_initial_state():
    import matplotlib.pyplot as plt

    from infer.course.widgets import phase_split_explorer

    rows = [pd.PhaseTiming(n, Timing((n / 10,)), Timing((2.0,))) for n in (16, 64, 256)]
    widget = phase_split_explorer(rows, initial_prompt_len=64, initial_output_tokens=8)
    prompt_slider, output_slider = widget.children[:2]
    assert (prompt_slider.value, output_slider.value) == (64, 8), "the sliders must start at the requested values"
    assert list(prompt_slider.options) == [16, 64, 256], "the prompt slider offers exactly the measured lengths"
    plt.close("all")
