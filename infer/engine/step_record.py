"""What one engine step ran: each request's part in it, when it started and ended, and its
shape (the few numbers its cost depends on).

The engine logs one `StepRecord` per step when asked (`Engine(..., log_steps=True)`), and the
simulator logs the same records on its virtual clock, so one record serves the timelines, the
occupancy charts, the step-cost fit and the simulator's validation.
"""

from dataclasses import dataclass

from infer.engine.scheduler import Work


@dataclass(frozen=True)
class StepItem:
    """One request's part in a step: tokens [start, start + num_tokens) of its sequence."""

    request_id: str
    prefill: bool  # prompt tokens (a whole prompt, a chunk, or a recompute), not one decode token
    start: int
    num_tokens: int
    samples: bool  # the step samples this request's next token
    slot: int | None  # its KV slot under the slot store (None under a store of small blocks)


@dataclass(frozen=True)
class StepShape:
    """A step's cost depends on its shape, not on token values (as Vidur keys its operators)."""

    prefill_tokens: int  # rows of prompt through every linear layer
    decode_seqs: int  # one row each through the linears
    decode_kv_tokens: int  # keys the decodes read, summed: decode attention streams the cache
    prefill_attention_pairs: int  # query-key pairs of the prefill chunks: the quadratic term of long prompts
    sampled_rows: int  # rows that go through the output head
    # decodes x the longest decode's keys: the course engine's batched decode attention computes over that
    # rectangle, each shorter sequence masked (infer.paged_attention), so its cost follows this, not the sum
    decode_padded_kv_tokens: int

    @classmethod
    def of(cls, items: tuple[StepItem, ...]) -> "StepShape":
        prefill = [i for i in items if i.prefill]
        decodes = [i for i in items if not i.prefill]
        return cls(
            prefill_tokens=sum(i.num_tokens for i in prefill),
            decode_seqs=len(decodes),
            decode_kv_tokens=sum(i.start + 1 for i in decodes),
            # a chunk of n tokens after `start` cached ones has n*start + n(n+1)/2 pairs
            prefill_attention_pairs=sum(
                i.num_tokens * i.start + i.num_tokens * (i.num_tokens + 1) // 2 for i in prefill
            ),
            sampled_rows=sum(i.samples for i in items),
            decode_padded_kv_tokens=len(decodes) * max((i.start + 1 for i in decodes), default=0),
        )


def step_items(work: list[Work]) -> tuple[StepItem, ...]:
    """The step's items, read before it runs (running it appends tokens and frees the finished)."""
    return tuple(
        StepItem(w.seq.request_id, w.start < w.seq.num_prompt_tokens, w.start, w.num_tokens, w.samples, w.seq.slot)
        for w in work
    )


@dataclass(frozen=True)
class StepRecord:
    index: int
    start: float  # seconds (the engine's clock: perf_counter, or the simulator's virtual time)
    end: float
    items: tuple[StepItem, ...]  # in batch order
    num_running: int  # sequences holding KV room during the step, working in it or not

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1e3

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(item.request_id for item in self.items)

    @property
    def slots(self) -> tuple[int | None, ...]:
        return tuple(item.slot for item in self.items)

    @property
    def num_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(item.num_tokens for item in self.items if item.prefill)

    @property
    def kind(self) -> str:
        """ "prefill" if any request computes prompt tokens, "decode" if all decode, "idle" if none runs."""
        return "idle" if not self.items else "prefill" if any(item.prefill for item in self.items) else "decode"

    @property
    def shape(self) -> StepShape:
        return StepShape.of(self.items)
