"""Week 02's race: total generation time against the number of output tokens, for four loops.

- the naive loop of week 01 (no cache: every step recomputes the whole sequence),
- the course model with the growing cache (`ConcatKVCache`: torch.cat every step),
- the course model with the preallocated cache (`KVCache`: written in place),
- `transformers`' own greedy `generate()` (its own cache), the reference to beat.

All four produce the same tokens (tests/test_generate.py); only the time differs.
"""

from collections.abc import Callable
from dataclasses import dataclass

import matplotlib.pyplot as plt
import torch

from infer import hf
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.kv_cache import ConcatKVCache, KVCache
from infer.plotting import plot_medians
from infer.timing import Timing, benchmark, cpu_threads

NAIVE, GROWING, PREALLOCATED, GENERATE = (
    "naive loop (week 01)",
    "growing cache (torch.cat)",
    "preallocated cache",
    "transformers generate()",
)


@dataclass(frozen=True)
class SpeedSizes:
    """How big the race is on a profile."""

    prompt_len: int
    output_lens: tuple[int, ...]
    repeats: int


SPEED_SIZES = {
    # The tiny model on two shared cores: some 25-45 s for the whole race, depending on the load.
    "cpu": SpeedSizes(prompt_len=16, output_lens=(16, 32, 64, 128), repeats=3),
    # The 1.5B model on one GPU: long enough for the naive loop's quadratic term to show.
    "gpu": SpeedSizes(prompt_len=256, output_lens=(64, 128, 256, 512), repeats=2),
    # make gpu-check's 10 minutes: the gpu race's prompt, a quarter of its output lengths, one run each.
    "gpu-check": SpeedSizes(prompt_len=256, output_lens=(16, 32, 64, 128), repeats=1),
    # The gpu race's shape, cut down for the gpu-dryrun profile's stand-in run on a CPU.
    "gpu-dryrun": SpeedSizes(prompt_len=16, output_lens=(4, 8, 16, 32), repeats=1),
}


def speed_sizes(profile) -> SpeedSizes:
    if profile.name not in SPEED_SIZES:
        raise ValueError(f"No week 02 sizes for profile {profile.name!r}; known: {', '.join(SPEED_SIZES)}")
    return SPEED_SIZES[profile.name]


def generation_loops(hf_model, model) -> dict[str, Callable[[torch.Tensor, int], torch.Tensor]]:
    """The four loops, each `(prompt_ids [1, n], max_new_tokens) -> new tokens [1, max_new_tokens]`.

    Each cached run gets a fresh cache, as a new request would; allocating it is part of the time."""
    return {
        NAIVE: lambda prompt, n: naive_greedy_generate(hf_model, prompt, n),
        GROWING: lambda prompt, n: cached_greedy_generate(model, prompt, n, ConcatKVCache.for_model(model)),
        PREALLOCATED: lambda prompt, n: cached_greedy_generate(
            model, prompt, n, KVCache.for_model(model, 1, prompt.shape[-1] + n)
        ),
        GENERATE: lambda prompt, n: hf.greedy_generate(hf_model, prompt, n),
    }


def race(
    loops: dict[str, Callable], prompt: torch.Tensor, output_lens, *, repeats: int = 3, progress: bool = True
) -> dict[str, list[Timing]]:
    """Time every loop at every output length: one warm-up per loop, then `repeats` timed runs,
    interleaved across loops so that a slow moment of a shared machine hits all of them alike."""
    from tqdm.auto import tqdm

    for loop in loops.values():  # warm-up: first-call costs (allocations, lazy init) are not part of the race
        loop(prompt, min(output_lens))
    samples = {name: {n: [] for n in output_lens} for name in loops}
    steps = [(r, n, name) for r in range(repeats) for n in output_lens for name in loops]
    for _, n, name in tqdm(steps, desc="generation runs", disable=not progress):
        timing = benchmark(lambda run=loops[name], n=n: run(prompt, n), device=prompt.device, warmup=0, repeats=1)
        samples[name][n].extend(timing.samples_ms)
    return {name: [Timing(tuple(samples[name][n])) for n in output_lens] for name in loops}


def format_race(output_lens, timings: dict[str, list[Timing]]) -> str:
    """Median total times, then the speedups that matter."""
    names = list(timings)
    lines = [f"{'new tokens':>10} | " + " | ".join(f"{name:>25}" for name in names)]
    for i, n in enumerate(output_lens):
        lines.append(f"{n:>10} | " + " | ".join(f"{timings[name][i].median_ms:>22.0f} ms" for name in names))
    lines.append("")
    for i, n in enumerate(output_lens):
        naive, pre = timings[NAIVE][i].median_ms, timings[PREALLOCATED][i].median_ms
        grow, gen = timings[GROWING][i].median_ms, timings[GENERATE][i].median_ms
        lines.append(
            f"{n:>4} new tokens: naive / preallocated = {naive / pre:5.2f}x, naive / growing = "
            f"{naive / grow:5.2f}x, preallocated / generate() = {pre / gen:4.2f}"
        )
    return "\n".join(lines)


def plot_race(ax: plt.Axes, output_lens, timings: dict[str, list[Timing]]) -> None:
    """Total time against output tokens: medians with p10-p90 bars."""
    for (name, series), marker in zip(timings.items(), "osD^"):
        plot_medians(ax, output_lens, series, scale=1e-3, marker=marker, label=name)
    ax.set_xlabel("output tokens generated")
    ax.set_ylabel("total generation time (s, median; bars p10-p90)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)


WRITE_COST_CPU_THREADS = 1  # `cache_write_ms` on a CPU: stamp it (provenance(..., cpu_threads=...))


def cache_write_ms(model, context_lens, *, repeats: int = 15) -> dict[str, list[Timing]]:
    """The time to store ONE new token's K and V in every layer when `context` tokens are already
    cached: the per-step cost of each cache, isolated from the model's arithmetic.

    On a CPU this runs on one thread: a large copy is split across OpenMP threads, and on a
    shared two-core machine a thread that waits for a busy core adds tens of milliseconds that
    have nothing to do with the bytes copied."""
    arch, weight = model.arch, model.embed.weight
    with cpu_threads(WRITE_COST_CPU_THREADS if weight.device.type == "cpu" else None):
        shape = dict(dtype=weight.dtype, device=weight.device)
        timings: dict[str, list[Timing]] = {GROWING: [], PREALLOCATED: []}
        for context in context_lens:
            past = torch.randn(arch.num_kv_heads, context, arch.head_dim, **shape)
            new = torch.randn(arch.num_kv_heads, 1, arch.head_dim, **shape)
            for name, cache in (
                (GROWING, ConcatKVCache.for_model(model)),
                (PREALLOCATED, KVCache.for_model(model, max_seqs=1, max_len=context + 1)),
            ):
                for layer in range(arch.num_layers):
                    cache.write(layer, 0, 0, past, past)

                def one_step(
                    cache=cache, context=context, new=new
                ):  # rewrites position `context`: every repeat sees the same state
                    for layer in range(arch.num_layers):
                        cache.write(layer, 0, context, new, new)

                timings[name].append(benchmark(one_step, device=weight.device, warmup=2, repeats=repeats))
        return timings


def plot_write_cost(ax: plt.Axes, context_lens, timings: dict[str, list[Timing]]) -> None:
    for (name, series), marker in zip(timings.items(), "sD"):
        ax.plot(context_lens, [t.median_ms for t in series], marker=marker, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(list(context_lens), [str(n) for n in context_lens])
    ax.set_xlabel("tokens already in the cache")
    ax.set_ylabel("time to add one token\n(all layers; ms, median)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
