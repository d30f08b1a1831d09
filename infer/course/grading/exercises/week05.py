"""Lab 05 code checks: the continuous admission decision, and one engine step as one forward.

- `check_admission(admit)`: the student's decision goes into the engine's prefill-first policy
  and runs scripted arrival traces (infer.engine.simulator.run_trace: no model, steps only); every step's batch
  must match the reference. A mismatch is diagnosed by replaying the trace with the usual wrong
  decisions (static batching, no token budget, slots ignored, a short prompt overtaking the head
  of the queue) and naming the one that behaves like the student's.
- `check_step_forward(step_forward)`: the student's step drives a real engine (the profile's
  model, loaded by the check) over requests that arrive while others decode: first with
  continuous batching, then with chunked prefill and a small token budget, so that some items are
  prompt chunks that start mid-prompt and do not sample. A step must call the model exactly
  once, ask for logits of the sampling rows only, return a token for each sampling item and none
  for the others, and every request's tokens must equal greedy generation by the library's engine
  run in lockstep on the same schedule (the same batches, so the same arithmetic in any dtype;
  tests/test_engine.py shows that engine equal to single-request greedy in float32).

At grading the library code that computes the answers (HIDDEN_AT_GRADING) is not in the student's
kernel, and both checks also run traces and requests no student saw.
"""

import numbers
import random

from infer import hf
from infer.course.grading.checks import Verdict, case_rngs, library_verdict, own_model, same_tokens
from infer.engine import Engine, SamplingParams
from infer.engine.model_runner import ModelRunner, flatten, step_runs
from infer.engine.scheduler import PrefillFirst, admit_continuous, admit_static, chunked_token_counts
from infer.engine.simulator import TraceRequest, run_trace
from infer.model import Transformer

ADMISSION_QID = "05.lab.admission"
STEP_QID = "05.lab.step_forward"
# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (
    admit_continuous,
    admit_static,
    chunked_token_counts,
    flatten,
    step_runs,
    ModelRunner,
    Engine,
)


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


def _admit_refusing_an_exact_fit(lens, num_running, max_num_seqs, budget):
    taken = 0
    for length in lens[: max(max_num_seqs - num_running, 0)]:
        if length >= budget:  # a prompt that exactly fills what is left is refused
            break
        budget -= length
        taken += 1
    return taken


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
    (
        _admit_refusing_an_exact_fit,
        "a prompt that exactly fills the budget left was refused: the admitted prompts fit when their "
        "lengths add up to at most max_num_batched_tokens (<=, not <)",
    ),
)


def admission_traces(rng: random.Random, scripted: bool = True) -> list[tuple[str, list[TraceRequest], int, int]]:
    """(description, trace, max_num_seqs, max_num_batched_tokens): scripted cases first (one per
    rule the lab states), then random ones."""
    cases = [
        (
            "a token budget of 100 with prompts of 60 and 40 tokens (an exact fit) and a third of 1",
            [TraceRequest(0, 60, 3), TraceRequest(0, 40, 3), TraceRequest(0, 1, 2)],
            4,
            100,
        ),
        (
            "3 slots and 3 requests at step 0, then 2 more (exactly the free slots)",
            [TraceRequest(0, 8, 4) for _ in range(3)] + [TraceRequest(1, 8, 2) for _ in range(2)],
            3,
            512,
        ),
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
    return cases if scripted else cases[5:]


def _batches(admit, trace, max_num_seqs, budget) -> list[tuple[str, tuple[int, ...]]]:
    return run_trace(trace, PrefillFirst("continuous", admit), max_num_seqs, budget).batches()


def _safe_batches(admit, trace, max_num_seqs, budget):
    try:
        return _batches(admit, trace, max_num_seqs, budget)
    except Exception:  # noqa: BLE001 - a mistake may break the engine's invariants; that is a difference too
        return None


class AdmissionAnswer(Exception):
    """The student's admit returned something that is not a count of waiting requests."""


def _answers_checked(admit):
    """`admit`, with each answer checked before the engine uses it: a count of waiting requests,
    a whole number from 0 to the number waiting (numpy and torch integers count)."""

    def checked(lens, num_running, max_num_seqs, budget):
        answer = admit(lens, num_running, max_num_seqs, budget)
        value = answer.item() if hasattr(answer, "item") and getattr(answer, "shape", None) == () else answer
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            kind = type(answer).__name__
            raise AdmissionAnswer(
                f"admit({lens}, {num_running}, {max_num_seqs}, {budget}) returned a {kind} ({answer!r}): "
                "return how many waiting requests join, a whole number"
            )
        if not 0 <= value <= len(lens):
            raise AdmissionAnswer(
                f"admit({lens}, {num_running}, {max_num_seqs}, {budget}) returned {value}: a count of waiting "
                f"requests lies between 0 and the {len(lens)} waiting"
            )
        return int(value)

    return checked


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
    rngs = case_rngs(qid)
    visible = admission_traces(rngs[0])
    cases = visible + [case for rng in rngs[1:] for case in admission_traces(rng, scripted=False)]
    for description, trace, slots, budget in cases:
        expected = _batches(admit_continuous, trace, slots, budget)
        try:
            got = _batches(_answers_checked(student_admit), trace, slots, budget)
        except AdmissionAnswer as exc:
            return Verdict(qid, False, f"on {description}, {exc}")
        except Exception as exc:  # noqa: BLE001 - the student's bug, as one line
            if isinstance(exc, NotImplementedError):
                return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
            reason = next(
                (why for wrong, why in KNOWN_MISTAKES if _safe_batches(wrong, trace, slots, budget) is None), None
            )
            return Verdict(
                qid,
                False,
                f"on {description}, the engine failed: {type(exc).__name__}: {exc}"
                + (f" ({reason})" if reason else ""),
            )
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
    return Verdict(qid, True, f"every step of {len(visible)} arrival traces matches continuous batching")


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


# The engines the step is checked in: continuous batching (whole prompts, decodes), then chunked
# prefill with a budget smaller than the longer prompts (chunks that start mid-prompt and do not sample).
STEP_ENGINES = (
    ("continuous batching", dict(policy="continuous", max_num_seqs=3, max_num_batched_tokens=64, max_model_len=40)),
    ("chunked prefill, budget 10", dict(policy="chunked", max_num_seqs=3, max_num_batched_tokens=10, max_model_len=40)),
)


def grade_step_forward(student_step, model=None, requests: int = 8) -> Verdict:
    """`model` (default: the check's own, the profile's model in float32 as the course's Transformer) is for tests."""
    qid = STEP_QID
    if not callable(student_step):
        return Verdict(
            qid, False, f"expected a function step_forward(model, cache, work), got {type(student_step).__name__}"
        )
    borrowed = library_verdict(qid, student_step)
    if borrowed:
        return borrowed
    # float32: the student's step attends through PerSequenceKV, the library's engine through PagedKV;
    # on CUDA those are two different kernels, which in bf16 round differently and can flip a near-tie
    model = model if model is not None else Transformer.from_hf(hf.float32_copy(own_model()))
    forwards = 0
    for rng in case_rngs(qid):
        for name, settings in STEP_ENGINES:
            verdict = _drive(student_step, model, _requests(rng, requests), name, settings)
            if isinstance(verdict, Verdict):
                return verdict
            forwards += verdict
    return Verdict(
        qid,
        True,
        f"one model call per step; {requests} requests token-identical to greedy generation, with continuous "
        f"batching and with chunked prefill (prompt chunks that do not sample included)",
    )


def _drive(student_step, model, cases, engine_name: str, settings: dict) -> Verdict | int:
    """Run `cases` through an engine whose steps the student's function computes, beside the
    library's engine on the same schedule; a failing Verdict, or the number of steps it ran."""
    qid = STEP_QID
    engine, reference = Engine(model, **settings), Engine(model, **settings)
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
        where = f"with {engine_name}, step {step}"
        step += 1
        if not work:
            continue
        counting.calls.clear()
        forwards += 1
        try:
            tokens = student_step(counting, engine.kv_store.cache, work)
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, NotImplementedError):
                return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
            return Verdict(qid, False, f"{where} ({len(work)} items), raised {type(exc).__name__}: {exc}")
        sampling = sum(item.samples for item in work)
        if len(counting.calls) != 1:
            return Verdict(
                qid,
                False,
                f"{where} with {len(work)} items called the model {len(counting.calls)} times: a step is ONE "
                f"forward over the flat batch of all its items' tokens",
            )
        rows, logits_rows = counting.calls[0]
        if logits_rows != sampling:
            return Verdict(
                qid,
                False,
                f"{where} asked for logits of {logits_rows} rows of {rows}; only the sampling rows "
                f"({sampling} here) need them: pass logits_rows",
            )
        tokens = tokens.tolist() if hasattr(tokens, "tolist") else list(tokens)
        if len(tokens) != sampling:
            chunks = len(work) - sampling
            return Verdict(
                qid,
                False,
                f"{where} returned {len(tokens)} tokens for {sampling} sampling items of {len(work)}: one token "
                f"per item that samples (item.samples), in order"
                + (
                    "; the other item is a prompt chunk with more of its prompt to come, which gives none"
                    if chunks == 1
                    else f"; the other {chunks} are prompt chunks with more of their prompts to come, which give none"
                    if chunks
                    else ""
                ),
            )
        for out in engine.scheduler.update(work, [[int(t)] for t in tokens]):
            got.setdefault(out.request_id, []).extend(out.new_token_ids)
    for index, (prompt, _, _) in enumerate(cases):
        problem = same_tokens(got.get(str(index), []), expected[str(index)])
        if problem:
            return Verdict(
                qid,
                False,
                f"with {engine_name}, request {index} ({len(prompt)}-token prompt) is not greedy generation: "
                f"{problem} (positions, slots or the sampling rows? a chunk starts at item.start, mid-prompt)",
            )
    return forwards


def check_step_forward(student_step, model=None) -> None:
    print(grade_step_forward(student_step, model).line)
