"""What a benchmark client writes down about one request, and nothing else.

The record is transport-neutral: the same fields come from the in-process `generate()`
baseline (week 03), from the course engine (weeks 05-06) and from an HTTP streaming client
talking to the course server or to vLLM (week 07). Every metric of infer.metrics is computed
from these fields alone, exactly as `vllm bench serve` computes its metrics from what its
client saw.

Times are seconds on one monotonic clock (`time.perf_counter()`); only differences matter.
A *chunk* is one piece of streamed output: one token for `generate()`, possibly several
tokens for a server that batches its stream messages. vLLM measures ITL per chunk too.
"""

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    prompt_len: int  # input tokens, as sent (exact: prompts are token ids)
    send_time: float  # when the client sent the request
    chunk_times: list[float] = field(default_factory=list)  # when each output chunk arrived
    chunk_tokens: list[int] | None = None  # tokens in each chunk; None means one token per chunk
    output_tokens: int | None = None  # as reported by the server (e.g. usage); None: count the chunks' tokens
    error: str | None = None  # why the request failed; None for a request that did not fail
    end_time: float | None = None  # when a failed request gave up; ignored for a successful one

    @property
    def success(self) -> bool:
        """No error and at least one output chunk: vLLM also fails a request that never streamed anything."""
        return self.error is None and len(self.chunk_times) > 0

    @property
    def num_output_tokens(self) -> int:
        if not self.success:
            return 0
        if self.output_tokens is not None:
            return self.output_tokens
        if self.chunk_tokens is not None:
            return sum(self.chunk_tokens)
        return len(self.chunk_times)

    @property
    def finish_time(self) -> float:
        """When the client was done with this request: its last chunk, or when it gave up."""
        if self.success:
            return self.chunk_times[-1]
        candidates = [t for t in (self.end_time, *self.chunk_times[-1:]) if t is not None]
        return max(candidates, default=self.send_time)

    def validate(self, index: int | None = None) -> None:
        """Raise ValueError with a reason if the record cannot be a real measurement."""
        name = "request" if index is None else f"request {index}"
        if self.prompt_len < 0:
            raise ValueError(f"{name}: prompt_len must be >= 0, got {self.prompt_len}")
        if self.send_time < 0:
            raise ValueError(
                f"{name}: send_time is negative ({self.send_time}); times are seconds on a "
                f"monotonic clock such as time.perf_counter()"
            )
        previous, what = self.send_time, "the send time"
        for i, t in enumerate(self.chunk_times):
            if t < previous:
                raise ValueError(
                    f"{name}: chunk {i} arrives at {t:.6f} s, before {what} ({previous:.6f} s): "
                    f"negative time; were the times taken from different clocks?"
                )
            previous, what = t, f"chunk {i}"
        if self.end_time is not None and self.end_time < self.send_time:
            raise ValueError(f"{name}: end_time {self.end_time:.6f} s is before send_time {self.send_time:.6f} s")
        if self.chunk_tokens is not None:
            if len(self.chunk_tokens) != len(self.chunk_times):
                raise ValueError(
                    f"{name}: {len(self.chunk_tokens)} chunk_tokens for {len(self.chunk_times)} chunk_times"
                )
            if any(n < 0 for n in self.chunk_tokens):
                raise ValueError(f"{name}: chunk_tokens must be >= 0, got {self.chunk_tokens}")
        if self.output_tokens is not None and self.output_tokens < 0:
            raise ValueError(f"{name}: output_tokens must be >= 0, got {self.output_tokens}")
