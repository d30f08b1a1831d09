"""What the engine knows about one request: its sampling parameters, its state, and what a step
reports back about it.

A `Sequence` carries its prompt, the tokens generated so far, and `num_computed_tokens`: how many
of its tokens already have their keys and values in the KV cache. Every policy schedules work as
"compute the next n tokens of this sequence", so a whole prompt (prefill), a part of one (a
chunk, week 06) and one decode token are the same kind of item. Under speculative decoding
(infer.engine.speculation) a decoding sequence also carries `spec_token_ids`, a proposer's guesses
at its next tokens: they are computed after its newest token, in the same item, and verified.
"""

import enum
import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    """How to pick a request's tokens; the names and defaults are vLLM's.

    temperature 0 is greedy; top_k 0 and top_p 1.0 switch those filters off; `seed` gives the
    request its own random generator, so its samples do not depend on its batch-mates."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be 0 (disabled) or a positive integer, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def benchmark_params(max_tokens: int) -> SamplingParams:
    """Greedy, EOS ignored: exactly `max_tokens` tokens, as `vllm bench serve --ignore-eos` asks."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


class Status(enum.Enum):
    WAITING = "waiting"  # queued (new, or preempted), holds no KV room
    RUNNING = "running"  # holds KV room; prefilling or decoding
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)  # the KV blocks holding its positions, in order
    finish_reason: str | None = None  # "length", "stop", "abort", or "error" (a step failed for it)
    num_preemptions: int = 0
    spec_token_ids: list[int] = field(default_factory=list)  # guesses to verify in the next step

    @property
    def slot(self) -> int | None:
        """Under the slot store (weeks 05-07) a running sequence holds one block: its slot in the
        week 02 `KVCache`, which the positional cache API addresses as `seq_id`."""
        return self.block_table[0] if len(self.block_table) == 1 else None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        """Tokens still to run through the model before the next one can be sampled: the rest of
        the prompt while prefilling, 1 (the newest token) while decoding, and everything so far
        after a preemption (its KV was dropped: recomputed like a prompt); plus the guesses to verify."""
        return self.num_tokens + len(self.spec_token_ids) - self.num_computed_tokens

    @property
    def is_prefilling(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    def token_ids(self, start: int, stop: int) -> list[int]:
        """Tokens start..stop-1 of prompt + output."""
        prompt = self.prompt_token_ids
        return (
            prompt[start:stop]
            if stop <= len(prompt)
            else prompt[start:] + self.output_token_ids[max(0, start - len(prompt)) : stop - len(prompt)]
        )


@dataclass(frozen=True)
class RequestOutput:
    """What one step did for one request: the tokens it added (zero or one, or up to k + 1 under
    speculative decoding) and whether it ended."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None = None
    error: str | None = None  # why the engine failed this request (finish_reason "error")
    num_draft_tokens: int = 0  # guesses this step verified (speculative decoding)
    num_accepted_tokens: int = 0  # of those, how many the target kept


@dataclass(frozen=True)
class CompletionResult:
    """A request's whole answer, as `Engine.generate` returns it."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    num_draft_tokens: int = 0  # guesses verified over the whole request (speculative decoding)
    num_accepted_tokens: int = 0
