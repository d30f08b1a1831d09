"""A scheduler on paper: run a policy over a scripted trace without any model, one step at a
time, and see who holds which slot in every step.

Each request of a trace arrives before a given step and wants `output_len` tokens; the model is
replaced by "every sampled token is 1". Counting steps is enough to compare policies (how many
steps static batching needs, how many slot-steps stay idle) before timing anything, and the lab
checks an admission decision on such traces.
"""

from dataclasses import dataclass

from infer.engine.kv_store import SlotKVStore
from infer.engine.scheduler import Limits, Policy, Scheduler, make_policy
from infer.engine.sequence import SamplingParams, Sequence


@dataclass(frozen=True)
class TraceRequest:
    arrival_step: int  # it joins the waiting queue just before this step
    prompt_len: int
    output_len: int


@dataclass(frozen=True)
class TraceStep:
    kind: str  # "prefill" (a step that admitted requests and ran only their prompts) or "decode"
    requests: tuple[int, ...]  # indices into the trace, in batch order
    slots: tuple[int, ...]  # their KV slots, same order
    held: int  # slots held by running requests during the step, working or stalled


@dataclass(frozen=True)
class TraceRun:
    steps: list[TraceStep]
    first_token_step: list[int]  # per request
    finish_step: list[int]
    max_num_seqs: int

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def idle_slot_steps(self) -> int:
        """Slot-steps in which a slot held no request at all."""
        return sum(self.max_num_seqs - step.held for step in self.steps)

    def occupancy(self) -> list[list[int]]:
        """[slot][step]: the request computed in that slot at that step, or -1."""
        grid = [[-1] * self.num_steps for _ in range(self.max_num_seqs)]
        for index, step in enumerate(self.steps):
            for request, slot in zip(step.requests, step.slots):
                grid[slot][index] = request
        return grid


def run_trace(trace: list[TraceRequest], policy: str | Policy, max_num_seqs: int,
              max_num_batched_tokens: int, max_steps: int = 100_000) -> TraceRun:
    """Step the scheduler over `trace` until every request has finished."""
    policy = make_policy(policy) if isinstance(policy, str) else policy
    max_len = max(r.prompt_len + r.output_len for r in trace)
    store = SlotKVStore(max_num_seqs, max_len)
    scheduler = Scheduler(policy, Limits(max_num_seqs, max_num_batched_tokens), store, set(), max_len)
    sequences = [Sequence(str(i), [1] * r.prompt_len, SamplingParams(max_tokens=r.output_len, ignore_eos=True), r.arrival_step)
                 for i, r in enumerate(trace)]
    arrivals = sorted(range(len(trace)), key=lambda i: (trace[i].arrival_step, i))
    first_token, finish = [-1] * len(trace), [-1] * len(trace)
    steps: list[TraceStep] = []
    while arrivals or scheduler.has_unfinished():
        if len(steps) >= max_steps:
            raise RuntimeError(f"the trace did not finish within {max_steps} steps: does the policy ever admit?")
        while arrivals and trace[arrivals[0]].arrival_step <= len(steps):
            scheduler.add(sequences[arrivals.pop(0)])
        work = scheduler.schedule()
        held = len(scheduler.running)
        if work:
            kind = "prefill" if any(w.seq.is_prefilling for w in work) else "decode"
            steps.append(TraceStep(kind, tuple(int(w.seq.request_id) for w in work),
                                   tuple(w.seq.slot for w in work), held))
        else:
            steps.append(TraceStep("idle", (), (), held))
        for out in scheduler.update(work, [1] * sum(w.samples for w in work)):
            index = int(out.request_id)
            if first_token[index] < 0:
                first_token[index] = len(steps) - 1
            if out.finished:
                finish[index] = len(steps) - 1
    return TraceRun(steps, first_token, finish, max_num_seqs)
