"""Which requests run in the next step, and how many of their tokens: pure Python over two
queues, testable without a model.

The scheduler holds `waiting` (arrived, or preempted, without KV room; first come first served)
and `running` (holding KV room). Each step, its policy decides how many waiting requests to admit
and what work the step does, as (sequence, number of tokens to compute) items; the scheduler
asks the KV store for room for every item, preempting when there is none, and after the forward
pass `update` appends the sampled tokens and retires what finished.

Policies:
- static: admit a batch into an empty engine only, then run it until its last request ends;
- continuous: admit whenever a slot is free, between decode steps. Prefill-first: a step that
  admits requests runs only their whole prompts, and the running decodes wait for it;
- chunked (week 06): every step spends a token budget on the running sequences first, in the
  order they were admitted (a decode takes one token, a prompt being continued as much as is
  left), and on new prompts last; a prompt may span several steps, so no step is ever a long
  prefill that stalls the decodes.

Speculative decoding (infer.engine.speculation) changes one thing here: a decoding sequence that
carries guesses needs 1 + len(guesses) rows, which the budget counts (a tight budget verifies fewer
guesses), and `update` appends what verification kept, then rolls the sequence back to it.

What can run: every request the engine accepts (`refusal` says None) can be scheduled, under
every policy and store. Its whole context fits the KV store alone, and, for a policy that does
not split prompts, its prompt fits one step's token budget. One case is left: a sequence preempted
on a paged store is recomputed as one prefill of its prompt and the tokens it has produced, which
can be longer than the budget. Such a prefill runs alone, in a step of its own once nothing else
runs: the queue behind it waits (first come, first served), and the running sequences finish or
are preempted in turn, so the engine always drains. (vLLM V0 avoided the case by refusing a
budget smaller than the context without chunked prefill; V1 always chunks.)
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from infer.engine.kv_store import KVStore
from infer.engine.sequence import RequestOutput, Sequence, Status


@dataclass(frozen=True)
class Limits:
    max_num_seqs: int  # sequences running at once (KV slots)
    max_num_batched_tokens: int  # tokens in one forward pass


@dataclass(frozen=True)
class Work:
    """Compute tokens [start, start + num_tokens) of `seq` in this step; positions past its newest
    token hold its guesses (speculative decoding)."""

    seq: Sequence
    start: int
    num_tokens: int

    @property
    def samples(self) -> bool:
        """Does this item reach the sequence's newest token, so that the next one is sampled?"""
        return self.start + self.num_tokens >= self.seq.num_tokens

    @property
    def spec_token_ids(self) -> list[int]:
        """The guesses this item verifies: those of its rows that lie past the newest token."""
        return self.seq.spec_token_ids[: max(0, self.start + self.num_tokens - self.seq.num_tokens)]


# An admission decision: how many of the waiting requests (their prompt lengths, oldest first)
# join now, given how many run and the limits. First come, first served: only a prefix of the queue.
Admission = Callable[[list[int], int, int, int], int]


def admit_continuous(
    waiting_prompt_lens: list[int], num_running: int, max_num_seqs: int, max_num_batched_tokens: int
) -> int:
    """Fill the free slots from the head of the queue, as long as the prompts fit into one step's
    token budget; stop at the first that does not fit, so that nobody overtakes it."""
    free_slots, budget, admitted = max_num_seqs - num_running, max_num_batched_tokens, 0
    for length in waiting_prompt_lens[: max(free_slots, 0)]:
        if length > budget:
            break
        budget -= length
        admitted += 1
    return admitted


def admit_static(
    waiting_prompt_lens: list[int], num_running: int, max_num_seqs: int, max_num_batched_tokens: int
) -> int:
    """A new batch only into an empty engine: whoever arrives later waits for the whole batch."""
    if num_running:
        return 0
    return admit_continuous(waiting_prompt_lens, 0, max_num_seqs, max_num_batched_tokens)


class Policy(Protocol):
    name: str
    splits_prompts: bool  # may a prompt's prefill span several steps? (False: it must fit one step's budget)

    def plan(
        self, waiting: list[Sequence], running: list[Sequence], limits: Limits
    ) -> tuple[int, list[tuple[Sequence, int]]]:
        """How many waiting requests to admit (a prefix of `waiting`), and the step's
        (sequence, tokens to compute) items, which may include the admitted ones."""


class PrefillFirst:
    """Admit by `admission`; a step with newcomers runs their whole prompts and nothing else,
    otherwise every running sequence decodes one token."""

    splits_prompts = False

    def __init__(self, name: str, admission: Admission):
        self.name, self.admission = name, admission

    def plan(self, waiting, running, limits):
        admitted = self.admission(
            [s.num_uncomputed_tokens for s in waiting], len(running), limits.max_num_seqs, limits.max_num_batched_tokens
        )
        if admitted:
            return admitted, [(s, s.num_uncomputed_tokens) for s in waiting[:admitted]]
        spare = limits.max_num_batched_tokens - len(running)  # every decode gets its row; guesses share the rest
        plan = []
        for s in running:
            guesses = min(len(s.spec_token_ids), max(spare, 0))
            spare -= guesses
            plan.append((s, 1 + guesses))
        return 0, plan


def chunked_token_counts(
    running_needs: list[int],
    running_prefilling: list[bool],
    waiting_prompt_lens: list[int],
    free_slots: int,
    max_num_batched_tokens: int,
) -> tuple[list[int], list[int]]:
    """vLLM V1's step, over plain numbers: how many tokens each running sequence computes (same
    order, 0 for one left out this step) and how many each admitted waiting request does (a prefix
    of the queue, oldest first).

    The budget goes to the running sequences first, in the order they were admitted, each as much
    as it needs and the budget still holds: one token for a decode, the rest of its prompt for one
    being prefilled. Decodes get no priority over a prompt admitted before them (that is Sarathi-
    Serve's and vLLM V0's order, not V1's). Whatever is left starts new prompts, into free slots
    only. A chunk is cut to the budget that remains, so a prompt may split across steps.
    `running_prefilling` does not change the decision; it says what each need is."""
    budget = max_num_batched_tokens
    running_counts = []
    for need in running_needs:
        running_counts.append(min(need, budget))
        budget -= running_counts[-1]
    new_counts = []
    for need in waiting_prompt_lens[: max(free_slots, 0)]:
        if budget == 0:
            break
        new_counts.append(min(need, budget))
        budget -= new_counts[-1]
    return running_counts, new_counts


# A chunked step's decision over plain numbers, `chunked_token_counts`'s signature (week 06's lab
# writes one and plugs it in as Chunked(decide=...)).
ChunkDecision = Callable[[list[int], list[bool], list[int], int, int], tuple[list[int], list[int]]]


class Chunked:
    """Chunked prefill with a token budget (`max_num_batched_tokens`): decodes never wait for a
    whole prompt, they share each step with a slice of one. The step's items run in the order the
    decision served them: the running sequences as admitted, then the newcomers."""

    name = "chunked"
    splits_prompts = True

    def __init__(self, decide: ChunkDecision = chunked_token_counts):
        self.decide = decide

    def plan(self, waiting, running, limits):
        running_counts, new_counts = self.decide(
            [s.num_uncomputed_tokens for s in running],
            [s.is_prefilling for s in running],
            [s.num_uncomputed_tokens for s in waiting],
            limits.max_num_seqs - len(running),
            limits.max_num_batched_tokens,
        )
        work = [(s, n) for s, n in zip(running, running_counts) if n] + list(zip(waiting, new_counts))
        return len(new_counts), work


POLICY_NAMES = ("static", "continuous", "chunked")


def make_policy(name: str) -> Policy:
    if name == "static":
        return PrefillFirst("static", admit_static)
    if name == "continuous":
        return PrefillFirst("continuous", admit_continuous)
    if name == "chunked":
        return Chunked()
    raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(map(repr, POLICY_NAMES))}")


class Scheduler:
    def __init__(
        self,
        policy: Policy,
        limits: Limits,
        kv_store: KVStore,
        eos_token_ids: set[int],
        max_model_len: int,
        *,
        on_release: Callable[[Sequence], None] | None = None,
    ):
        """on_release: called with every sequence that gives back its KV room (finished, aborted or
        preempted), for state kept beside it (a draft model's cache slot)."""
        self.policy, self.limits, self.kv_store = policy, limits, kv_store
        self.eos_token_ids, self.max_model_len = eos_token_ids, max_model_len
        self.on_release = on_release
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: the newest last
        self.num_preemptions = 0

    def refusal(self, prompt_len: int, max_tokens: int) -> str | None:
        """Why a request could never run in this engine, or None: the one rule that the engine's
        add-time check applies and that `schedule` relies on."""
        if prompt_len + max_tokens > self.max_model_len:
            return (
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {prompt_len + max_tokens} tokens ({prompt_len} in the prompt, "
                f"{max_tokens} for the completion). Please reduce the prompt or max_tokens."
            )
        if not self.kv_store.fits(prompt_len + max_tokens):
            return (
                f"{prompt_len} prompt + {max_tokens} output tokens can never fit in this "
                f"engine's KV store, even alone: give it more room, or ask for fewer tokens"
            )
        if prompt_len > self.limits.max_num_batched_tokens and not self.policy.splits_prompts:
            return (
                f"the prompt has {prompt_len} tokens, more than max_num_batched_tokens="
                f"{self.limits.max_num_batched_tokens}: policy {self.policy.name!r} prefills a "
                f"whole prompt in one step (a chunked policy would split it)"
            )
        return None

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[Work]:
        """The step's work: what the policy plans, within the KV room the store has.

        Running sequences first, oldest first: each gets room for its tokens, and when the store
        has none, the newest running sequence is preempted (its room freed, itself back at the
        head of the queue, to be recomputed) until it fits. Then, if nobody was preempted, the
        admitted requests in queue order, as long as each gets its room (nobody overtakes). A
        plan whose newcomers found no room leaves the step to the running sequences. When nothing
        runs and the policy admits nobody, the head of the queue is a recompute longer than the
        budget: it runs alone (see the module's docstring)."""
        work = self._within_kv_room(*self.policy.plan(list(self.waiting), list(self.running), self.limits))
        if not work and self.running:
            work = self._within_kv_room(*self.policy.plan([], list(self.running), self.limits))
        if not work and self.waiting and not self.running:
            head = self.waiting[0]
            work = self._within_kv_room(1, [(head, head.num_uncomputed_tokens)])
            if not work:
                raise RuntimeError(
                    f"request {head.request_id!r} ({head.num_uncomputed_tokens} tokens to compute) does not "
                    f"fit an empty KV store, which the add-time check (Scheduler.refusal) should have refused"
                )
        return work

    def _within_kv_room(self, num_admitted: int, plan: list[tuple[Sequence, int]]) -> list[Work]:
        free_slots = self.limits.max_num_seqs - len(self.running)
        if num_admitted > free_slots:
            raise RuntimeError(
                f"policy {self.policy.name!r} admitted {num_admitted} requests with {free_slots} free "
                f"of max_num_seqs={self.limits.max_num_seqs}"
            )
        tokens = {id(seq): n for seq, n in plan}  # what the policy asks of each sequence
        newcomers = list(self.waiting)[:num_admitted]
        preempted = False
        for seq in list(self.running):
            if seq.status is not Status.RUNNING or id(seq) not in tokens:
                continue  # preempted a moment ago, or not in this step
            while not self.kv_store.can_append(seq, tokens[id(seq)]):
                victim = self.running[-1]
                self.preempt(victim)
                tokens.pop(id(victim), None)
                preempted = True
                if victim is seq:
                    break
            if seq.status is Status.RUNNING:
                self.kv_store.append(seq, tokens[id(seq)])
        for seq in newcomers:
            if preempted or not self.kv_store.can_allocate(seq, tokens[id(seq)]):
                break  # vLLM admits nobody in a step that preempts; and nobody overtakes the head
            self.waiting.popleft()
            cached = self.kv_store.allocate(seq, tokens[id(seq)])
            seq.num_computed_tokens = cached
            tokens[id(seq)] = min(tokens[id(seq)], seq.num_tokens - cached)
            seq.status = Status.RUNNING
            self.running.append(seq)
        return [
            Work(seq, seq.num_computed_tokens, tokens[id(seq)])
            for seq, _ in plan
            if id(seq) in tokens and seq.status is Status.RUNNING
        ]

    def preempt(self, seq: Sequence) -> None:
        """Preemption by recompute, as vLLM V1 does by default: drop the sequence's KV and send it
        back to the head of the queue; its prompt and the tokens it has produced are computed
        again when it is readmitted, and it goes on from there."""
        self.running.remove(seq)
        self._release(seq)
        seq.status, seq.num_computed_tokens = Status.WAITING, 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)

    def update(self, work: list[Work], sampled: list[list[int]]) -> list[RequestOutput]:
        """Account for a finished step: `sampled` holds, for each item that samples (in order), the
        tokens it adds: its sampled token, or under speculative decoding the guesses verification kept
        and the target's own token after them."""
        per_item = iter(sampled)
        outputs = []
        for item in work:
            seq, guesses = item.seq, item.spec_token_ids
            seq.spec_token_ids = []
            seq.num_computed_tokens = item.start + item.num_tokens
            if not item.samples:
                continue  # a prefill chunk with more of its prompt to come (week 06)
            tokens = next(per_item)
            num_accepted = len(tokens) - 1
            seq.num_computed_tokens -= len(guesses) - num_accepted  # the rejected guesses' K/V are not its own
            new_tokens, reason = [], None
            for token in tokens:  # EOS or max_tokens inside the span: the tokens after it are dropped
                seq.output_token_ids.append(token)
                new_tokens.append(token)
                reason = self.finish_reason(seq, token)
                if reason is not None:
                    break
            if reason is not None:
                self.finish(seq, reason)
            elif guesses:
                self.kv_store.roll_back(seq)
            outputs.append(
                RequestOutput(
                    seq.request_id,
                    new_tokens,
                    reason is not None,
                    reason,
                    num_draft_tokens=len(guesses),
                    num_accepted_tokens=num_accepted,
                )
            )
        return outputs

    def finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire `seq` from whichever queue holds it, and give back its KV room."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
            self._release(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    def _release(self, seq: Sequence) -> None:
        self.kv_store.free(seq)
        seq.spec_token_ids = []
        if self.on_release is not None:
            self.on_release(seq)
