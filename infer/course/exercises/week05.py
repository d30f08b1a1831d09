"""Lab 05 code checks: the continuous admission decision, and one engine step as one forward.

- `check_admission(admit)`: the student's decision goes into the engine's prefill-first policy
  and runs scripted arrival traces (infer.engine.simulator.run_trace: no model, steps only); every step's batch
  must match the reference. A mismatch is diagnosed by replaying the trace with the usual wrong
  decisions (static batching, no token budget, slots ignored, a short prompt overtaking the head
  of the queue) and naming the one that behaves like the student's.
- `check_step_forward(step_forward, model)`: the student's step drives a real engine (the
  profile's model) over requests that arrive while others decode. A step must call the model
  exactly once, ask for logits of the sampling rows only, and every request's tokens must equal
  greedy generation by the library's engine run in lockstep on the same schedule (the same
  batches, so the same arithmetic in any dtype; tests/test_engine.py shows that engine equal to
  single-request greedy in float32).
"""

import random

from infer.course.checks import LibraryCalls, Verdict, case_rng, library_call_verdict, library_verdict, same_tokens
from infer.engine import Engine, SamplingParams
from infer.engine.model_runner import flatten
from infer.engine.scheduler import PrefillFirst, admit_continuous
from infer.engine.simulator import TraceRequest, run_trace

ADMISSION_QID = "05.lab.admission"
STEP_QID = "05.lab.step_forward"


# ---------------------------------------------------------------- admission


def _admit_ignoring_budget(lens, num_running, max_num_seqs, budget):
    return min(len(lens), max(max_num_seqs - num_running, 0))


# The mistakes are written out as a student would write them: none calls the library's answer.
def _admit_fitting_prefix(lens, free_slots, budget):
    taken = 0
    for length in lens[: max(free_slots, 0)]:
        if length > budget:
            break
        budget -= length
        taken += 1
    return taken


def _admit_only_into_an_empty_engine(lens, num_running, max_num_seqs, budget):
    return 0 if num_running else _admit_fitting_prefix(lens, max_num_seqs, budget)


def _admit_ignoring_slots(lens, num_running, max_num_seqs, budget):
    return _admit_fitting_prefix(lens, len(lens), budget)


def _admit_skipping_ahead(lens, num_running, max_num_seqs, budget):
    # admits a later prompt that fits although the head does not; as a count of a prefix it
    # over-admits, which is how such a function shows up in the engine
    free, taken = max_num_seqs - num_running, 0
    for length in lens:
        if taken < free and length <= budget:
            budget -= length
            taken += 1
    return taken


def _admit_one_at_a_time(lens, num_running, max_num_seqs, budget):
    return min(1, _admit_fitting_prefix(lens, max_num_seqs - num_running, budget))


KNOWN_MISTAKES = (
    (_admit_only_into_an_empty_engine, "it admits only into an empty engine: that is static batching, not continuous"),
    (
        _admit_ignoring_budget,
        "it ignores max_num_batched_tokens: the admitted prompts must fit into one step's token budget",
    ),
    (_admit_ignoring_slots, "it ignores the free slots: at most max_num_seqs - num_running requests can join"),
    (
        _admit_skipping_ahead,
        "a prompt that fits was admitted past one that does not: first come, first served "
        "stops at the first prompt that does not fit",
    ),
    (_admit_one_at_a_time, "it admits one request per step: admit every waiting request that fits"),
)


def admission_traces(rng: random.Random) -> list[tuple[str, list[TraceRequest], int, int]]:
    """(description, trace, max_num_seqs, max_num_batched_tokens): scripted cases first, then random ones."""
    cases = [
        (
            "8 requests at step 0, 4 slots, outputs of 2-10 tokens",
            [TraceRequest(0, 16, n) for n in (3, 10, 2, 7, 5, 5, 9, 1)],
            4,
            512,
        ),
        (
            "a long request running while short ones arrive one by one",
            [TraceRequest(0, 8, 30)] + [TraceRequest(2 + 3 * i, 8, 2) for i in range(6)],
            3,
            512,
        ),
        (
            "a token budget of 100 with prompts of 60, 30, 50 and 10 tokens",
            [TraceRequest(0, n, 4) for n in (60, 30, 50, 10)] + [TraceRequest(1, 20, 3)],
            4,
            100,
        ),
    ]
    for i in range(6):
        slots = rng.randint(1, 6)
        trace = [
            TraceRequest(rng.randint(0, 25), rng.randint(1, 80), rng.randint(1, 14)) for _ in range(rng.randint(4, 14))
        ]
        cases.append((f"random trace {i + 1} ({len(trace)} requests, {slots} slots, budget 128)", trace, slots, 128))
    return cases


def _batches(admit, trace, max_num_seqs, budget) -> list[tuple[str, tuple[int, ...]]]:
    return run_trace(trace, PrefillFirst("continuous", admit), max_num_seqs, budget).batches()


def _safe_batches(admit, trace, max_num_seqs, budget):
    try:
        return _batches(admit, trace, max_num_seqs, budget)
    except Exception:  # noqa: BLE001 - a mistake may break the engine's invariants; that is a difference too
        return None


def grade_admission(student_admit) -> Verdict:
    qid = ADMISSION_QID
    if not callable(student_admit):
        return Verdict(
            qid,
            False,
            f"expected a function admit(waiting_prompt_lens, num_running, max_num_seqs, "
            f"max_num_batched_tokens), got {type(student_admit).__name__}",
        )
    borrowed = library_verdict(qid, student_admit)
    if borrowed:
        return borrowed
    rng = case_rng(qid)
    cases = admission_traces(rng)
    for description, trace, slots, budget in cases:
        expected = _batches(admit_continuous, trace, slots, budget)
        try:
            with LibraryCalls(admit_continuous) as calls:
                got = _batches(student_admit, trace, slots, budget)
        except NotImplementedError as exc:
            return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
        except Exception as exc:  # noqa: BLE001 - the student's bug, as one line
            reason = next(
                (why for wrong, why in KNOWN_MISTAKES if _safe_batches(wrong, trace, slots, budget) is None), None
            )
            return Verdict(
                qid,
                False,
                f"on {description}, the engine failed: {type(exc).__name__}: {exc}"
                + (f" ({reason})" if reason else ""),
            )
        if calls.seen:
            return library_call_verdict(qid, admit_continuous)
        if got != expected:
            step = next(
                i for i, (g, e) in enumerate(zip(got + [None] * len(expected), expected + [None] * len(got))) if g != e
            )

            def shown(batches, step=step) -> str:
                return "nothing" if step >= len(batches) else f"{batches[step][0]} of requests {list(batches[step][1])}"

            why = next(
                (reason for wrong, reason in KNOWN_MISTAKES if _safe_batches(wrong, trace, slots, budget) == got),
                "see the admission rules above",
            )
            return Verdict(
                qid, False, f"on {description}, step {step} runs {shown(got)}, expected {shown(expected)}: {why}"
            )
    return Verdict(qid, True, f"every step of {len(cases)} arrival traces matches continuous batching")


def check_admission(student_admit) -> None:
    print(grade_admission(student_admit).line)


# ---------------------------------------------------------------- one step, one forward


class CountingModel:
    """Stands in for the model: forwards every call, and notes how many calls each step made and
    how many logits rows each call asked for."""

    def __init__(self, model):
        self.model = model
        self.calls: list[tuple[int, int]] = []  # (tokens in the flat batch, logits rows returned)

    def __call__(self, token_ids, positions, cache, seq_ids=None, logits_rows=None):
        logits = self.model(token_ids, positions, cache, seq_ids, logits_rows=logits_rows)
        self.calls.append((int(token_ids.shape[0]), int(logits.shape[0])))
        return logits

    forward = __call__

    def __getattr__(self, name):
        return getattr(self.model, name)


def _requests(rng: random.Random, count: int) -> list[tuple[list[int], int, int]]:
    """(prompt, max_tokens, arrival step) for each request."""
    return [
        ([rng.randrange(1, 250) for _ in range(rng.randint(1, 24))], rng.randint(1, 10), rng.randint(0, 12))
        for _ in range(count)
    ]


def grade_step_forward(student_step, model, requests: int = 8) -> Verdict:
    qid = STEP_QID
    if not callable(student_step):
        return Verdict(
            qid, False, f"expected a function step_forward(model, cache, work), got {type(student_step).__name__}"
        )
    borrowed = library_verdict(qid, student_step)
    if borrowed:
        return borrowed
    rng = case_rng(qid)
    cases = _requests(rng, requests)
    engine, reference = (
        Engine(model, policy="continuous", max_num_seqs=3, max_num_batched_tokens=64, max_model_len=40)
        for _ in range(2)
    )
    expected: dict[str, list[int]] = {}
    counting = CountingModel(model)
    got: dict[str, list[int]] = {}
    step = forwards = 0
    while step <= max(arrival for _, _, arrival in cases) or engine.has_unfinished():
        for index, (prompt, max_tokens, arrival) in enumerate(cases):
            if arrival == step:
                for each in (engine, reference):
                    each.add_request(
                        prompt,
                        SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True),
                        request_id=str(index),
                    )
        for out in reference.step():
            expected.setdefault(out.request_id, []).extend(out.new_token_ids)
        work = engine.scheduler.schedule()
        step += 1
        if not work:
            continue
        counting.calls.clear()
        forwards += 1
        try:
            with LibraryCalls(flatten) as calls:
                tokens = student_step(counting, engine.kv_store.cache, work)
        except NotImplementedError as exc:
            return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
        except Exception as exc:  # noqa: BLE001
            return Verdict(
                qid, False, f"in step {step - 1} ({len(work)} sequences), raised {type(exc).__name__}: {exc}"
            )
        if calls.seen:
            return library_call_verdict(qid, flatten)
        sampling = sum(item.samples for item in work)
        if len(counting.calls) != 1:
            return Verdict(
                qid,
                False,
                f"step {step - 1} with {len(work)} sequences called the model "
                f"{len(counting.calls)} times: a step is ONE forward over the flat batch "
                f"of all its sequences' tokens",
            )
        rows, logits_rows = counting.calls[0]
        if logits_rows != sampling:
            return Verdict(
                qid,
                False,
                f"step {step - 1} asked for logits of {logits_rows} rows of {rows}; only the "
                f"sampling rows ({sampling} here) need them: pass logits_rows",
            )
        tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        if len(tokens) != sampling:
            return Verdict(
                qid,
                False,
                f"step {step - 1} returned {len(tokens)} tokens for {sampling} sampling "
                f"sequences: one token per work item that samples, in order",
            )
        for out in engine.scheduler.update(work, [int(t) for t in tokens]):
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    for index, (prompt, _, _) in enumerate(cases):
        problem = same_tokens(got.get(str(index), []), expected[str(index)])
        if problem:
            return Verdict(
                qid,
                False,
                f"request {index} ({len(prompt)}-token prompt) is not greedy generation: "
                f"{problem} (positions, slots or the sampling rows?)",
            )
    return Verdict(
        qid,
        True,
        f"one model call in each of {forwards} steps; {requests} requests token-identical to greedy generation",
    )


def check_step_forward(student_step, model) -> None:
    print(grade_step_forward(student_step, model).line)
