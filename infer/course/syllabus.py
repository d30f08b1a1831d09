"""The course arc in one table: the home page, the lab generator and the tests read it from here."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Week:
    number: str  # "01": the prefix of every notebook of the week
    slug: str
    title: str
    lecture: str
    lab: str | None  # None: the week has a lecture only

    @property
    def notebook_name(self) -> str:
        return f"{self.number}_{self.slug}.ipynb"


WEEKS = (
    Week("00", "setup", "Setup", "the device found, the profile chosen, versions, what will run where", None),
    Week(
        "01",
        "prefill_decode",
        "Prefill and decode",
        "the naive generate() loop; TTFT and per-token time; arithmetic intensity and a measured roofline",
        "write the naive greedy loop; compute TTFT/TPOT from timestamps; arithmetic intensity",
    ),
    Week(
        "02",
        "kv_cache",
        "The KV cache",
        "why recomputing the prefix is quadratic; a hand-written KV cache; the memory bill",
        "implement the cache and the cached decode loop; bytes per token and max concurrency",
    ),
    Week(
        "03",
        "measuring",
        "Measuring latency and throughput",
        "TTFT, TPOT, ITL, E2EL, throughput, goodput, percentiles; benchmark design",
        "implement the metrics; the sequential generate() baseline over a grid",
    ),
    Week(
        "04",
        "flash_attention",
        "FlashAttention",
        "HBM vs SRAM; tiling and the online softmax; exact, not approximate",
        "naive vs tiled online-softmax attention vs SDPA backends vs flash-attn",
    ),
    Week(
        "05",
        "continuous_batching",
        "Continuous batching",
        "static vs iteration-level batching; throughput vs concurrency",
        "a scheduler and batched model runner that admit requests between decode steps",
    ),
    Week(
        "06",
        "chunked_prefill",
        "Chunked prefill",
        "prefill-first stalls; chunked prefill with a token budget; the TTFT/TPOT trade-off",
        "write the chunked scheduling decision; pick the goodput-best budget from a sweep",
    ),
    Week(
        "07",
        "serving",
        "Serving",
        "an OpenAI-compatible streaming server; vllm serve and vllm bench serve",
        "serve the course engine; benchmark it and vLLM with one client and grid",
    ),
    Week(
        "08",
        "paged_kv",
        "Paged KV cache",
        "block tables, preemption, prefix caching",
        "write the block allocator (reference counts, a least-recently-freed free list), the prefix hash chain "
        "and the choice of whom to preempt",
    ),
    Week(
        "09",
        "kernels",
        "Kernels, graphs and compilation",
        "this machine's roofline and a step's profile; launch overhead; torch.compile; a paged decode kernel",
        "write decode attention over a paged cache, a block at a time; check it in the engine and time it",
    ),
    Week(
        "10",
        "speculative",
        "Speculative decoding",
        "weights the course trains itself; guess and verify; prompt lookup and a draft model; where it stops paying",
        "write the greedy verification step, rejection sampling and the rollback of a paged cache",
    ),
)
