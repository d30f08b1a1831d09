"""The engine loop: add requests, then step until none is left. Each step is three moves:

    work = scheduler.schedule()                # who runs, and how many of their tokens
    tokens = runner.sample(work, runner.forward(work))   # one forward pass over the flat batch, then sampling
    outputs = scheduler.update(work, tokens)   # append tokens, retire the finished, free their slots

With `speculative=SpeculativeConfig(...)` a fourth move comes first: a proposer guesses the next
tokens of every decoding sequence, and the step verifies them (infer.engine.speculation).

With `log_steps=True` the engine keeps a StepRecord of every step (infer.engine.step_record);
`phase_times` sums the wall time of each move over all steps, and `stats()` is what a server's
gauges show.
`add_request`, `step` and `abort` hold one lock, so a server may add and abort requests from
other threads while one background thread calls `step` (week 07).

When a step raises, `on_step_error` decides. "raise" (the default) lets the exception out, so that
a notebook or a test shows the bug where it happened. "fail_requests" (what a server wants) fails
the requests the step concerns, not the engine: those in the step's work (every unfinished one if
scheduling itself raised) finish with reason "error" and the exception's text, their KV room is
freed, and the next step serves everyone else.
"""

import itertools
import logging
import numbers
import threading
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from infer.engine.clock import WallClock
from infer.engine.cuda_graphs import graph_plan
from infer.engine.kv_store import KVStore, SlotKVStore
from infer.engine.model_runner import ModelRunner
from infer.engine.paged_kv_store import PagedKVStore, blocks_like_slots
from infer.engine.phase_times import PhaseTimes
from infer.engine.sampler import Sampler
from infer.engine.scheduler import Limits, Policy, Scheduler, make_policy
from infer.engine.sequence import CompletionResult, RequestOutput, SamplingParams, Sequence
from infer.engine.speculation import SpeculativeConfig, make_proposer, propose
from infer.engine.step_record import StepRecord, step_items

logger = logging.getLogger("infer.engine")
STEP_ERROR_MODES = ("raise", "fail_requests")


@dataclass(frozen=True)
class EngineStats:
    """The engine's state at one moment, as a server's gauges and counters show it (week 07)."""

    num_running: int  # sequences holding KV room
    num_waiting: int
    kv_cache_usage: float  # fraction of the KV store in use
    num_preemptions: int  # since the engine started
    prefix_cache_hit_rate: float  # 0 for a store without prefix caching
    num_steps: int
    phase_seconds: dict[str, float]  # PhaseTimes.seconds: schedule, forward, sample, update (and propose)
    # speculative decoding, since the engine started, under vLLM's names: requests' steps that verified
    # guesses, the guesses verified, and those the target kept
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0


class Engine:
    on_step_error = "raise"  # see the module's docstring

    def __init__(
        self,
        model,
        policy: str | Policy = "continuous",
        max_num_seqs: int = 32,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 2048,
        *,
        kv_store: str | KVStore = "slots",
        num_kv_blocks: int | None = None,
        block_size: int = 16,
        enable_prefix_caching: bool = False,
        log_steps: bool = False,
        on_step_error: str = "raise",
        speculative: SpeculativeConfig | None = None,
        decode_attention="auto",
        cuda_graphs: bool | type = False,
    ):
        """kv_store: "slots" (one slot of max_model_len per sequence, weeks 05-07), "paged" (week 08:
        `num_kv_blocks` blocks of `block_size` positions, by default as much memory as the slots
        would take; optionally with prefix caching), or a store of your own. on_step_error: "raise"
        or "fail_requests" (see the module's docstring). speculative: speculative decoding (week 10),
        or None; its proposer is `self.proposer`, which a proposer of your own may replace.
        decode_attention: "auto" (the fastest kernels this machine has), "sdpa" (the decodes' blocks
        gathered, then PyTorch's attention), "in_place" (week 09's compiled CPU kernel, float32),
        "triton" or "flash-attn" (GPU kernels that read the blocks where they lie; see
        infer.engine.attention_backends), or a decode attention function of your own with the
        kernels' signature (lab 09). cuda_graphs: replay decode steps from CUDA graphs captured now
        (infer.engine.cuda_graphs; a CUDA device), or a graph class of your own (EagerReplay tests
        the replay logic on a CPU). `self.startup_line` names the kernels and graphs in use."""
        if on_step_error not in STEP_ERROR_MODES:
            raise ValueError(
                f"unknown on_step_error {on_step_error!r}; valid: {', '.join(map(repr, STEP_ERROR_MODES))}"
            )
        self.on_step_error = on_step_error
        self.model = model
        graphs = graph_plan(cuda_graphs, model, max_num_seqs, max_model_len)
        spare_blocks = 0 if graphs is None else 1  # where the graphs' padding rows write
        if kv_store == "slots":
            kv_store = SlotKVStore.for_model(model, max_num_seqs, max_model_len, spare_blocks)
        elif kv_store == "paged":
            num_kv_blocks = num_kv_blocks or blocks_like_slots(max_num_seqs, max_model_len, block_size)
            kv_store = PagedKVStore.for_model(
                model, num_kv_blocks, block_size, spare_blocks, enable_prefix_caching=enable_prefix_caching
            )
        elif isinstance(kv_store, str):
            raise ValueError(f"unknown kv_store {kv_store!r}; valid: 'slots', 'paged', or a KVStore object")
        sampler = Sampler(model.embed.weight.device)
        eos = model.config.eos_token_id
        eos_ids = set() if eos is None else set(eos) if isinstance(eos, (list, tuple)) else {eos}
        self.assemble(
            policy,
            Limits(max_num_seqs, max_num_batched_tokens),
            max_model_len,
            kv_store,
            sampler,
            ModelRunner(model, kv_store, sampler, decode_attention, graphs),
            eos_ids,
            model.arch.vocab_size,
            WallClock(),
            log_steps,
        )
        if speculative is not None:
            draft = speculative.draft_model
            if draft is not None and draft.arch.vocab_size != model.arch.vocab_size:
                raise ValueError(
                    f"the draft model's vocabulary ({draft.arch.vocab_size} tokens) is not the target's "
                    f"({model.arch.vocab_size}): its guesses would be other tokens' ids"
                )
            self.proposer = make_proposer(speculative, max_num_seqs, max_model_len)
            self.num_speculative_tokens = speculative.num_speculative_tokens
        self.startup_line = f"{self.runner.attention.line}; {graphs.line if graphs else 'no CUDA graphs (eager steps)'}"
        logger.info("engine: %s", self.startup_line)

    def assemble(
        self,
        policy: str | Policy,
        limits: Limits,
        max_model_len: int,
        kv_store: KVStore,
        sampler: Sampler,
        runner,
        eos_ids: set[int],
        vocab_size: int,
        clock,
        log_steps: bool,
    ) -> None:
        """The parts every engine has; the simulator assembles the same ones around a cost model."""
        for name, value in (
            ("max_num_seqs", limits.max_num_seqs),
            ("max_num_batched_tokens", limits.max_num_batched_tokens),
            ("max_model_len", max_model_len),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.limits, self.max_model_len, self.kv_store, self.vocab_size = limits, max_model_len, kv_store, vocab_size
        self.scheduler = Scheduler(self.policy, limits, kv_store, eos_ids, max_model_len, on_release=self._released)
        self.proposer, self.num_speculative_tokens = None, 0  # speculative decoding: off
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.sampler, self.runner, self.clock = sampler, runner, clock
        self.requests: dict[str, Sequence] = {}  # unfinished requests by id
        self.ids = (str(i) for i in itertools.count())
        self.lock = threading.RLock()
        self.step_log: list[StepRecord] | None = [] if log_steps else None
        self.num_steps = 0
        self.phase_times = PhaseTimes()

    # ------------------------------------------------------------ requests in

    def add_request(
        self,
        prompt_token_ids: Seq[int] | torch.Tensor,
        params: SamplingParams | None = None,
        *,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queue one request and return its id; bad input raises ValueError and changes nothing."""
        params = params or SamplingParams()
        prompt = self._checked_prompt(prompt_token_ids)
        params.validate()
        with self.lock:
            request_id = self._new_request_id(request_id)
            refusal = self.scheduler.refusal(len(prompt), params.max_tokens)  # the rule schedule() relies on
            if refusal is not None:
                raise ValueError(refusal)
            seq = Sequence(request_id, prompt, params, self.clock.now() if arrival_time is None else arrival_time)
            self.requests[request_id] = seq
            self.sampler.add(request_id, params)
            self.scheduler.add(seq)
        return request_id

    def _checked_prompt(self, prompt_token_ids) -> list[int]:
        if isinstance(prompt_token_ids, torch.Tensor):
            if prompt_token_ids.dim() > 1 and prompt_token_ids.shape[0] != 1:
                raise ValueError(f"one prompt per request: got a tensor of shape {tuple(prompt_token_ids.shape)}")
            prompt_token_ids = prompt_token_ids.reshape(-1).tolist()
        prompt = list(prompt_token_ids)
        if not prompt:
            raise ValueError("the prompt is empty: a request needs at least one prompt token")
        not_ids = [t for t in prompt if isinstance(t, bool) or not isinstance(t, numbers.Integral)]
        if not_ids:
            raise ValueError(f"token ids must be integers, got {not_ids[0]!r} ({type(not_ids[0]).__name__})")
        prompt = [int(t) for t in prompt]  # numpy and torch integers become plain ints
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(
                f"token id {bad[0]!r} is out of vocabulary: ids must be integers in "
                f"[0, {self.vocab_size}) (vocab_size={self.vocab_size})"
            )
        return prompt

    def _new_request_id(self, request_id: str | None) -> str:
        if request_id is None:
            request_id = next(i for i in self.ids if i not in self.requests)
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use by an unfinished request")
        return request_id

    def abort(self, request_id: str) -> None:
        """Drop an unfinished request and free its KV room at once; unknown or finished ids are ignored."""
        with self.lock:
            seq = self.requests.pop(request_id, None)
            if seq is not None:
                self.scheduler.finish(seq, "abort")
                self.sampler.remove(request_id)

    def has_unfinished(self) -> bool:
        with self.lock:
            return self.scheduler.has_unfinished()

    # What a server's gauges show (week 07).
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def kv_cache_usage(self) -> float:
        return self.kv_store.usage

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_preemptions

    @property
    def prefix_cache_hit_rate(self) -> float:
        return getattr(self.kv_store, "hit_rate", 0.0)  # 0 for a store without prefix caching

    def stats(self) -> EngineStats:
        with self.lock:
            return EngineStats(
                self.num_running,
                self.num_waiting,
                self.kv_cache_usage,
                self.num_preemptions,
                self.prefix_cache_hit_rate,
                self.num_steps,
                dict(self.phase_times.seconds),
                self.num_drafts,
                self.num_draft_tokens,
                self.num_accepted_tokens,
            )

    def _released(self, seq: Sequence) -> None:
        """The scheduler let `seq` go (finished, aborted or preempted): so does the proposer."""
        if self.proposer is not None:
            self.proposer.free(seq)

    # ------------------------------------------------------------ the loop

    def step(self) -> list[RequestOutput]:
        """Run one step; return what it produced, one output per request that got a token or failed."""
        timed = self.phase_times
        with self.lock:
            start = self.clock.now()
            try:
                if self.proposer is not None:
                    with timed("propose"):
                        propose(self.proposer, self.scheduler.running, self.num_speculative_tokens)
                with timed("schedule"):
                    work = self.scheduler.schedule()
            except Exception as exc:  # the queues may be half updated: fail everyone they hold
                return self._fail([*self.scheduler.running, *self.scheduler.waiting], exc, "scheduling")
            if not work:
                return []
            items = step_items(work) if self.step_log is not None else ()  # before update changes the sequences
            num_running = len(self.scheduler.running)
            try:
                with timed("forward"):
                    logits = self.runner.forward(work)
                with timed("sample"):
                    tokens = self.runner.sample(work, logits)  # the tokens on the host: the device is synchronized
                with timed("update"):
                    outputs = self.scheduler.update(work, tokens)
            except Exception as exc:
                return self._fail([item.seq for item in work], exc, "running")
            for out in outputs:
                if out.finished:
                    del self.requests[out.request_id]
                    self.sampler.remove(out.request_id)
                if out.num_draft_tokens:
                    self.num_drafts += 1
                    self.num_draft_tokens += out.num_draft_tokens
                    self.num_accepted_tokens += out.num_accepted_tokens
            if self.step_log is not None:
                self.step_log.append(StepRecord(self.num_steps, start, self.clock.now(), items, num_running))
            self.num_steps += 1
            return outputs

    def _fail(self, seqs: list[Sequence], exc: Exception, phase: str) -> list[RequestOutput]:
        """Finish `seqs` with reason "error" and free their KV room; the engine goes on."""
        if self.on_step_error == "raise":
            raise exc
        error = f"the engine failed while {phase} a step: {type(exc).__name__}: {exc}"
        logger.exception("%s; failing %d request(s), the engine goes on", error, len(seqs))
        outputs = []
        for seq in seqs:
            if self.requests.pop(seq.request_id, None) is None:
                continue  # a request twice in the step's work: failed already
            self.scheduler.finish(seq, "error")
            self.sampler.remove(seq.request_id)
            outputs.append(RequestOutput(seq.request_id, [], True, "error", error))
        return outputs

    def generate(
        self,
        prompts: Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
        *,
        progress: bool = True,
    ) -> list[CompletionResult]:
        """Offline batch generation: queue every prompt, step until all finish, return results in input order."""
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(
                f"{len(params_list)} SamplingParams for {len(prompts)} prompts: give one, or one per prompt"
            )
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, params_list)]
        prompt_ids = {rid: self.requests[rid].prompt_token_ids for rid in ids}
        tokens = {rid: [] for rid in ids}
        drafted, accepted = dict.fromkeys(ids, 0), dict.fromkeys(ids, 0)
        reasons = {}
        with tqdm(total=len(ids), desc=f"engine ({self.policy.name})", unit="req", disable=not progress) as bar:
            while len(reasons) < len(ids):
                for out in self.step():
                    if out.request_id in tokens:
                        tokens[out.request_id] += out.new_token_ids
                        drafted[out.request_id] += out.num_draft_tokens
                        accepted[out.request_id] += out.num_accepted_tokens
                        if out.finished:
                            reasons[out.request_id] = out.finish_reason
                            bar.update(1)
        return [
            CompletionResult(rid, prompt_ids[rid], tokens[rid], reasons[rid], drafted[rid], accepted[rid])
            for rid in ids
        ]
