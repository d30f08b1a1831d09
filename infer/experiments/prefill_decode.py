"""Week 01: the two phases of generation, and how long each takes.

- the naive loop itself is `infer.generate.naive_greedy_generate`;
- `prefill_ms` / `decode_step_ms`: the two phases timed apart, with `transformers`' KV cache.
  Prefill processes a whole prompt in one forward pass (logits for its last position only, as
  servers do); a decode step processes one token against the cached keys and values of
  everything before it.
- `sweep_prefill_decode` and the plots: the experiments of the week 01 lecture, sized by profile.
"""

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch

from infer import hf
from infer.generate import naive_greedy_generate
from infer.plotting import plot_medians
from infer.prompts import random_prompt_ids
from infer.timing import Timing, benchmark


def ttft_and_tpot_ms(send_time_s: float, token_times_s: list[float]) -> tuple[float, float]:
    """Time to first token and mean time per output token after it, both in milliseconds.

    TPOT averages over the gaps after the first token, so it needs at least two tokens."""
    if len(token_times_s) < 2:
        raise ValueError(f"TPOT needs at least 2 output tokens, got {len(token_times_s)}")
    ttft_ms = (token_times_s[0] - send_time_s) * 1e3
    tpot_ms = (token_times_s[-1] - token_times_s[0]) * 1e3 / (len(token_times_s) - 1)
    return ttft_ms, tpot_ms


@torch.no_grad()
def prefill(model, prompt_ids: torch.Tensor, cache) -> torch.Tensor:
    """The prefill as servers run it: the whole prompt in one pass, filling `cache`, with logits for
    the last position only ([batch, 1, vocab]). Those logits pick the first output token; the other
    rows would cost a [prompt_len, vocab] product that nobody reads."""
    return hf.forward(model, prompt_ids, cache, last_only=True)


@torch.no_grad()
def prefill_ms(model, prompt_ids: torch.Tensor, *, warmup: int = 1, repeats: int = 5) -> Timing:
    """Time `prefill` into a fresh KV cache: the prefill phase, up to the first token's logits."""
    return benchmark(
        lambda: prefill(model, prompt_ids, hf.new_cache(model)),
        device=prompt_ids.device,
        warmup=warmup,
        repeats=repeats,
    )


@torch.no_grad()
def decode_step_ms(model, context_ids: torch.Tensor, *, warmup: int = 1, repeats: int = 5) -> Timing:
    """One forward pass of a single new token against a cache holding `context_ids`: a decode step."""
    cache = hf.new_cache(model)
    hf.forward(model, context_ids, cache)
    next_token = context_ids[:, -1:]

    def one_step():
        hf.forward(model, next_token, cache)
        cache.crop(-1)  # drop the token just added, so that every repeat sees the same context

    return benchmark(one_step, device=context_ids.device, warmup=warmup, repeats=repeats)


def compare_with_generate(
    model, config, loop=naive_greedy_generate, *, prompt_lens=(5, 17, 40), new_tokens: int = 12, seed: int = 0
) -> str:
    """One line: does `loop` give the tokens of `transformers`' greedy generate() on fresh random prompts?

    Greedy decoding is deterministic, so a correct loop agrees token for token. The comparison runs
    in float32: in bf16 the cached (generate) and uncached (naive) paths round differently, and with
    random weights a near-tie argmax can flip without any bug."""
    fp32_model = hf.float32_copy(model)
    device = next(model.parameters()).device
    for i, length in enumerate(prompt_lens):
        prompt = random_prompt_ids(config, length, seed=seed + i).to(device)
        got, expected = loop(fp32_model, prompt, new_tokens), hf.greedy_generate(fp32_model, prompt, new_tokens)
        if not torch.equal(got, expected):
            differ = (got != expected).nonzero() if got.shape == expected.shape else None
            where = f"first at new token {differ[0, 1].item()}" if differ is not None else f"shape {tuple(got.shape)}"
            return (
                f"differs from transformers' generate() on a {length}-token prompt (seed {seed + i}), {where}: "
                f"{got.tolist()} vs {expected.tolist()}"
            )
    return (
        f"token-identical to transformers' generate() on {len(prompt_lens)} random prompts "
        f"({new_tokens} new tokens each, float32)"
    )


# ---------------------------------------------------------------- the week 01 experiments


@dataclass(frozen=True)
class PhaseSizes:
    """How big week 01's experiments are on a profile: small enough for a laptop CPU, seed-sized on a GPU."""

    sweep_prompt_lens: tuple[int, ...]  # prompt lengths of the prefill/decode sweep
    prefill_repeats: int
    decode_repeats: int
    naive_prompt_len: int  # the naive loop's prompt in the "per-token time grows" experiment
    naive_new_tokens: int


PHASE_SIZES = {
    # The tiny model on two cores: the whole sweep takes seconds.
    "cpu": PhaseSizes(
        sweep_prompt_lens=(16, 32, 64, 128, 256, 512, 1024),
        prefill_repeats=5,
        decode_repeats=7,
        naive_prompt_len=128,
        naive_new_tokens=128,
    ),
    # A 1.5B model on one GPU: up to 8192-token prompts, where prefill is clearly compute-bound.
    "gpu": PhaseSizes(
        sweep_prompt_lens=(128, 256, 512, 1024, 2048, 4096, 8192),
        prefill_repeats=10,
        decode_repeats=20,
        naive_prompt_len=1024,
        naive_new_tokens=128,
    ),
    # make gpu-check's 10 minutes: the gpu sweep's range in four steps, fewer repeats, a shorter naive run.
    "gpu-check": PhaseSizes(
        sweep_prompt_lens=(128, 512, 2048, 8192),
        prefill_repeats=3,
        decode_repeats=5,
        naive_prompt_len=1024,
        naive_new_tokens=32,
    ),
    # The gpu sweep's shape (seven doublings) on the dry run's 0.9M Qwen2 in bf16: seconds on a CPU.
    "gpu-dryrun": PhaseSizes(
        sweep_prompt_lens=(4, 8, 16, 32, 64, 128, 256),
        prefill_repeats=2,
        decode_repeats=3,
        naive_prompt_len=64,
        naive_new_tokens=16,
    ),
}


def phase_sizes(profile) -> PhaseSizes:
    """The week 01 sizes for `profile` (an infer.profiles.Profile)."""
    if profile.name not in PHASE_SIZES:
        raise ValueError(f"No week 01 sizes for profile {profile.name!r}; known: {', '.join(PHASE_SIZES)}")
    return PHASE_SIZES[profile.name]


def token_gaps_ms(send_time_s: float, token_times_s: list[float]) -> list[float]:
    """The wait before each output token, in ms: the first is the TTFT, the others the gaps between tokens."""
    if not token_times_s:
        raise ValueError("need at least one token timestamp")
    times = [send_time_s, *token_times_s]
    return [(later - earlier) * 1e3 for earlier, later in zip(times, times[1:])]


@dataclass(frozen=True)
class PhaseTiming:
    """Prefill of a `prompt_len`-token prompt and one decode step after it, timed apart."""

    prompt_len: int
    prefill: Timing
    decode_step: Timing


def sweep_prefill_decode(
    model, config, prompt_lens, *, prefill_repeats: int = 5, decode_repeats: int = 10, progress: bool = True
) -> list[PhaseTiming]:
    """Time prefill and one decode step for each prompt length (exact-length random prompts)."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    rows = []
    for length in tqdm(list(prompt_lens), desc="prompt lengths", disable=not progress):
        prompt = random_prompt_ids(config, length, seed=length).to(device)
        rows.append(
            PhaseTiming(
                length,
                prefill_ms(model, prompt, repeats=prefill_repeats),
                decode_step_ms(model, prompt, repeats=decode_repeats),
            )
        )
    return rows


def format_phase_table(rows: list[PhaseTiming]) -> str:
    """The sweep as a plain-text table: medians with the p10-p90 spread, in ms."""
    lines = [
        f"{'prompt tokens':>13} | {'prefill ms (p10-p90)':>24} | {'decode step ms (p10-p90)':>26} | "
        f"{'prefill / decode':>16}"
    ]
    for row in rows:
        (p_lo, p_hi), (d_lo, d_hi) = row.prefill.spread_ms, row.decode_step.spread_ms
        ratio = row.prefill.median_ms / row.decode_step.median_ms
        lines.append(
            f"{row.prompt_len:>13} | {row.prefill.median_ms:>8.2f} ({p_lo:>6.2f}-{p_hi:>6.2f}) | "
            f"{row.decode_step.median_ms:>10.2f} ({d_lo:>6.2f}-{d_hi:>6.2f}) | {ratio:>15.1f}x"
        )
    return "\n".join(lines)


def plot_phase_sweep(ax: plt.Axes, rows: list[PhaseTiming]) -> None:
    """Prefill time and one decode step's time against prompt length: medians, p10-p90 error bars."""
    lengths = [row.prompt_len for row in rows]
    for label, timings, marker in (
        ("prefill (whole prompt, one pass)", [r.prefill for r in rows], "o"),
        ("one decode step (1 token, KV cache)", [r.decode_step for r in rows], "s"),
    ):
        plot_medians(ax, lengths, timings, marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("time (ms, median; bars: p10-p90)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def robust_line(x, y) -> tuple[float, float]:
    """Slope and intercept of the Theil-Sen line (median of pairwise slopes): one token delayed by
    another process on a shared machine moves it far less than a least-squares fit."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("need at least two distinct x values to fit a line")
    i, j = np.triu_indices(len(x), k=1)
    distinct = x[j] != x[i]
    slope = float(np.median((y[j] - y[i])[distinct] / (x[j] - x[i])[distinct]))
    return slope, float(np.median(y - slope * x))


def plot_naive_token_times(
    ax: plt.Axes, prompt_len: int, gaps_ms: list[float], cached_step: Timing | None = None
) -> None:
    """Each output token's wait in the naive loop against the sequence length it recomputed."""
    lengths = np.arange(prompt_len, prompt_len + len(gaps_ms))  # token i is computed from prompt_len + i tokens
    ax.plot(lengths[1:], gaps_ms[1:], ".", alpha=0.6, label="naive loop: time per output token")
    slope, intercept = robust_line(lengths[1:], gaps_ms[1:])
    ax.plot(
        lengths[1:],
        slope * lengths[1:] + intercept,
        color="C0",
        label=f"trend (median slope): {slope * 100:+.1f} ms per 100 tokens of context",
    )
    if cached_step is not None:
        ax.axhline(
            cached_step.median_ms,
            color="C1",
            linestyle="--",
            label=f"one decode step with a KV cache: {cached_step.median_ms:.1f} ms",
        )
    ax.set_xlabel("sequence length the step recomputes (tokens)")
    ax.set_ylabel("time per output token (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
