"""Lab 06 code checks: the chunked scheduling decision, and picking the goodput-best budget.

The decision is checked twice, in one check: on scripted scheduler states, each built so that one
known mistake gives a wrong answer there (and the message names the one the student's answer
matches), and on whole arrival traces, where the student's function drives the real scheduler (in
the simulator, step by step) and every step must match vLLM V1's.

The budget picker is checked on scripted sweeps, each holding one rule the lab states (a value
equal to a limit meets it, ties go to the smaller budget, goodput is per second of the run), then
on random sweeps in which the throughput-best, the TTFT-only and the goodput-best budgets differ.

At grading the library code that computes the answer (HIDDEN_AT_GRADING) is not in the student's
kernel: `chunked_token_counts` for the decision; for the picker, `best_budget` and the goodput and
SLO functions."""

import math
import random

from infer.course.grading.checks import (
    Case,
    Verdict,
    as_number,
    case_rng,
    distinct_pair,
    grade_function,
    library_verdict,
)
from infer.engine.scheduler import Chunked, chunked_token_counts
from infer.engine.simulator import simulate
from infer.engine.step_costs import FixedStepCost
from infer.engine.step_record import StepRecord
from infer.experiments.chunked_prefill import best_budget
from infer.metrics import RequestLatencies, meets_slo, request_goodput

DECISION_QID = "06.lab.decision"
BUDGET_QID = "06.lab.budget"


# ---------------------------------------------------------------- the chunked decision


def _state_text(running_needs, running_prefilling, waiting, free_slots, budget) -> str:
    running = ", ".join(f"{'prefill' if p else 'decode'} {n}" for n, p in zip(running_needs, running_prefilling))
    return (
        f"running [{running}], waiting prompts {waiting}, {free_slots} free slot"
        f"{'s' if free_slots != 1 else ''}, budget {budget}"
    )


# Scripted states, V1's answer in the comment: each is one that a known mistake gets wrong.
SCRIPTED_STATES = [
    ([1, 1, 1], [False, False, False], [300], 5, 64),  # a long prompt arrives while three decode: [1, 1, 1], [61]
    ([1, 200, 1], [False, True, False], [50], 4, 40),  # a prompt admitted before a decode: [1, 39, 0], []
    ([120, 1, 1], [True, False, False], [30], 2, 64),  # the oldest is still prefilling: [64, 0, 0], []
    ([1, 1], [False, False], [10, 500, 10], 3, 100),  # the second prompt does not fit whole: [1, 1], [10, 88]
    ([1, 1, 1, 1], [False, False, False, False], [5], 4, 2),  # fewer tokens than decodes: [1, 1, 0, 0], []
    ([3, 1], [True, False], [4, 4, 4], 1, 100),  # one free slot only: [3, 1], [4]
    ([], [], [7, 9], 2, 16),  # an idle engine: [], [7, 9]
]


def _random_state(rng: random.Random):
    running = rng.randint(0, 6)
    prefilling = [rng.random() < 0.3 for _ in range(running)]
    needs = [rng.randint(1, 300) if p else 1 for p in prefilling]
    waiting = [rng.randint(1, 400) for _ in range(rng.randint(0, 5))]
    slots = rng.randint(running, running + 4)
    return needs, prefilling, waiting, slots - running, rng.choice([1, 2, 5, 16, 64, 256, 1024])


# The mistakes are written out as a student would write them: none calls the library's answer.
def _chunks_of_new_prompts(waiting, free_slots, budget):
    counts = []
    for need in waiting[: max(free_slots, 0)]:
        if budget == 0:
            break
        counts.append(min(need, budget))
        budget -= counts[-1]
    return counts


def _decide_decodes_first(needs, prefilling, waiting, free_slots, budget):
    counts = [0] * len(needs)
    for i in sorted(range(len(needs)), key=lambda i: prefilling[i]):
        counts[i] = min(needs[i], budget)
        budget -= counts[i]
    return counts, _chunks_of_new_prompts(waiting, free_slots, budget)


def _decide_new_prompts_first(needs, prefilling, waiting, free_slots, budget):
    new = _chunks_of_new_prompts(waiting, free_slots, budget)
    budget -= sum(new)
    counts = []
    for need in needs:
        counts.append(min(need, budget))
        budget -= counts[-1]
    return counts, new


def _decide_whole_prompts_only(needs, prefilling, waiting, free_slots, budget):
    counts = []
    for need in needs:
        counts.append(min(need, budget))
        budget -= counts[-1]
    new = []
    for need in waiting[: max(free_slots, 0)]:
        if need > budget:
            break
        new.append(need)
        budget -= need
    return counts, new


def _decide_running_subtracted_twice(needs, prefilling, waiting, free_slots, budget):
    counts = []
    for need in needs:
        counts.append(min(need, budget))
        budget -= counts[-1]
    budget = max(budget - sum(counts), 0)  # what the running sequences took, taken once more
    return counts, _chunks_of_new_prompts(waiting, free_slots, budget)


DECISION_MISTAKES = (
    (
        _decide_decodes_first,
        "the decodes went ahead of a prompt admitted before them: that is Sarathi-Serve's and vLLM V0's "
        "order; vLLM V1 serves the running sequences in the order they were admitted",
    ),
    (
        _decide_new_prompts_first,
        "new prompts ran before the running sequences had their tokens: the running sequences come first "
        "(prefill-first thinking)",
    ),
    (
        _decide_whole_prompts_only,
        "a prompt that did not fit the budget left was left waiting whole: chunked prefill splits it and "
        "spends the rest of the budget on its first chunk",
    ),
    (
        _decide_running_subtracted_twice,
        "the running sequences' tokens were taken from the budget twice: new prompts get all that they leave",
    ),
)


def _decision_rule_broken(state, got) -> str:
    """A rule of the lab that `got` breaks in `state`, whatever the mistake behind it, or ""."""
    needs, prefilling, waiting, free_slots, budget = state
    running_counts, new_counts = got
    if sum(running_counts) + sum(new_counts) > budget:
        return f"the step computes {sum(running_counts) + sum(new_counts)} tokens, more than the budget of {budget}"
    if len(new_counts) > max(free_slots, 0):
        return f"{len(new_counts)} new requests admitted into {free_slots} free slots"
    if any(n > need for n, need in zip(running_counts, needs)) or any(n > w for n, w in zip(new_counts, waiting)):
        return "a sequence gets more tokens than it has left to compute"
    if any(n <= 0 for n in new_counts):
        return (
            "an admitted request gets no tokens: admit a request only when the budget has room for part of its prompt"
        )
    return ""


def _decision_mistake(state, got) -> str:
    for mistake, why in DECISION_MISTAKES:
        if [list(x) for x in mistake(*state)] == [list(x) for x in got]:
            return why
    return ""


def _compare_decision(state):
    def compare(got, expected) -> str | None:
        if got is None:
            return "returned None (a missing `return`?); expected (running_counts, new_counts)"
        if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(isinstance(g, (list, tuple)) for g in got):
            return "expected a pair of lists (running_counts, new_counts)"
        running_counts, new_counts = [list(g) for g in got]
        if len(running_counts) != len(state[0]):
            return (
                f"running_counts has {len(running_counts)} entries for {len(state[0])} running sequences: "
                f"one each, 0 for one left out"
            )
        for value in running_counts + new_counts:
            number, problem = as_number(value, what="a token count")
            if problem or number != int(number):
                return f"token counts must be integers, got {value!r}"
        if [running_counts, new_counts] == [list(e) for e in expected]:
            return None
        why = _decision_rule_broken(state, (running_counts, new_counts)) or _decision_mistake(
            state, (running_counts, new_counts)
        )
        shown = f"got ({running_counts}, {new_counts}), expected ({list(expected[0])}, {list(expected[1])})"
        return shown + (f": {why}" if why else "")

    return compare


def grade_chunked_decision(decide, random_cases: int = 40) -> Verdict:
    qid = DECISION_QID
    borrowed = library_verdict(qid, decide)
    if borrowed:
        return borrowed
    rng = case_rng(qid)
    states = SCRIPTED_STATES + [_random_state(rng) for _ in range(random_cases)]
    for state in states:
        verdict = grade_function(
            qid, decide, chunked_token_counts, [Case(_state_text(*state), state)], _compare_decision(state), ""
        )
        if not verdict.ok:
            return verdict
    traces = grade_chunked_traces(decide)
    if not traces.ok:
        return Verdict(qid, False, traces.reason)
    return Verdict(qid, True, f"{len(states)} scheduler states and {traces.reason}")


def check_chunked_decision(decide, random_cases: int = 40) -> None:
    print(grade_chunked_decision(decide, random_cases).line)


def trace(rng: random.Random, num_requests: int):
    """A scripted arrival trace: prompt lengths, output lengths and arrival steps (as times)."""
    prompts = [rng.choice([rng.randint(1, 20), rng.randint(50, 300)]) for _ in range(num_requests)]
    outputs = [rng.randint(1, 12) for _ in range(num_requests)]
    offsets = sorted(rng.uniform(0, 0.03) for _ in range(num_requests))  # steps are 1 ms: arrivals mid-run
    return prompts, outputs, offsets


def show_items(items) -> list[tuple[str, str, int]]:
    """A step's items as (request, "prefill" or "decode", tokens): how a schedule is printed."""
    return [(i.request_id, "prefill" if i.prefill else "decode", i.num_tokens) for i in items]


def schedule_difference(got: list[StepRecord], expected: list[StepRecord]) -> str | None:
    """Where two schedules first part (the step, and what each ran in it), or None if they are the same."""
    for step, (g, e) in enumerate(zip(got, expected)):
        if g.items != e.items:
            return f"step {step}: ran {show_items(g.items)}, expected {show_items(e.items)}"
    if len(got) != len(expected):
        return f"the end: {len(got)} steps, expected {len(expected)}"
    return None


def grade_chunked_traces(decide, traces: int = 6) -> Verdict:
    """The student's decision drives the scheduler through whole traces; every step must match."""
    qid = DECISION_QID
    rng = case_rng("06.lab.traces")
    for number in range(traces):
        prompts, outputs, offsets = trace(rng, rng.randint(4, 10))
        seqs, budget = rng.choice([2, 4, 8]), rng.choice([3, 16, 64, 200])
        settings = dict(max_num_seqs=seqs, max_num_batched_tokens=budget, max_model_len=512, offsets=offsets)
        expected = simulate(FixedStepCost(), prompts, outputs, policy="chunked", **settings).steps
        try:
            got = simulate(FixedStepCost(), prompts, outputs, policy=Chunked(decide), **settings).steps
        except NotImplementedError as exc:
            return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
        except Exception as exc:
            return Verdict(
                qid,
                False,
                f"trace {number + 1} ({len(prompts)} requests, budget {budget}, {seqs} slots) "
                f"raised {type(exc).__name__}: {exc}",
            )
        difference = schedule_difference(got, expected)
        if difference:
            return Verdict(qid, False, f"trace {number + 1} (budget {budget}, {seqs} slots), {difference}")
    return Verdict(qid, True, f"{traces} arrival traces, every step as vLLM V1 schedules it")


# ---------------------------------------------------------------- the goodput-best budget


def goodput_of(record: dict, slo_ms: dict[str, float]) -> float:
    """Requests per second within every SLO, from a sweep record's per-request latencies."""
    latencies = [RequestLatencies(ttft, tpot, math.nan, ()) for ttft, tpot in zip(record["ttft_ms"], record["tpot_ms"])]
    return sum(meets_slo(lat, slo_ms) for lat in latencies) / record["duration_s"]


def reference_best_budget(records: list[dict], slo_ms: dict[str, float]) -> int:
    return max(records, key=lambda r: (goodput_of(r, slo_ms), -r["max_num_batched_tokens"]))["max_num_batched_tokens"]


# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (chunked_token_counts, best_budget, goodput_of, meets_slo, request_goodput)


def _scripted_record(
    budget: int,
    duration_s: float,
    slo_ms: dict,
    *,
    good: int = 0,
    at_ttft_limit: int = 0,
    at_tpot_limit: int = 0,
    late: int = 0,
    slow: int = 0,
) -> dict:
    """A sweep record of requests well within both SLOs (`good`), exactly at one limit and within the
    other, past the TTFT limit only (`late`), or past the TPOT limit only (`slow`)."""
    ttft, tpot = slo_ms["ttft"], slo_ms["tpot"]
    kinds = (
        [(ttft / 2, tpot / 2)] * good
        + [(ttft, tpot / 2)] * at_ttft_limit
        + [(ttft / 2, tpot)] * at_tpot_limit
        + [(ttft * 1.5, tpot / 2)] * late
        + [(ttft / 2, tpot * 1.5)] * slow
    )
    return {
        "max_num_batched_tokens": budget,
        "duration_s": duration_s,
        "ttft_ms": [t for t, _ in kinds],
        "tpot_ms": [p for _, p in kinds],
    }


SCRIPTED_SLO = {"ttft": 200.0, "tpot": 40.0}


def scripted_sweeps() -> list[tuple[str, list[dict]]]:
    """(what it holds, records) at SCRIPTED_SLO: each sweep is one rule the lab states."""
    slo = SCRIPTED_SLO
    return [
        (
            "a sweep with TTFTs and TPOTs equal to their limits",
            [
                _scripted_record(128, 10.0, slo, good=2, late=6, slow=2),
                _scripted_record(512, 10.0, slo, good=4, at_ttft_limit=3, at_tpot_limit=3),  # 10 good, 4 below both
                _scripted_record(2048, 10.0, slo, good=8, slow=2),
            ],
        ),
        (
            "a sweep with an exact tie in goodput",
            [
                _scripted_record(256, 10.0, slo, good=6, late=2, slow=2),
                _scripted_record(1024, 10.0, slo, good=8, late=1, slow=1),  # 0.8 req/s
                _scripted_record(4096, 5.0, slo, good=4),  # 0.8 req/s, in a shorter run
            ],
        ),
        (
            "a sweep whose runs last 12, 8 and 20 s",
            [
                _scripted_record(64, 12.0, slo, good=9, slow=3),  # 0.75 req/s
                _scripted_record(512, 8.0, slo, good=8, slow=1),  # 1.0 req/s: the best per second
                _scripted_record(2048, 20.0, slo, good=10, slow=1),  # the most requests within SLOs, 0.5 req/s
            ],
        ),
    ]


def random_sweep(rng: random.Random, slo_ms: dict[str, float]) -> list[dict]:
    """Sweep records in which small budgets miss the TTFT SLO, large ones the TPOT SLO, and the
    goodput-best budget is not the throughput-best one (drawn again until it is not)."""
    while True:
        records = _draw_sweep(rng)
        if reference_best_budget(records, slo_ms) != _pick_throughput_best(records, slo_ms):
            return records


def _draw_sweep(rng: random.Random) -> list[dict]:
    budgets = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    records = []
    for i, budget in enumerate(budgets):
        n = rng.randint(20, 40)
        ttft_scale = 900 / (1 + i) ** 1.5  # small budgets: long prompts take many steps
        tpot_scale = 8 + 4 * 2 ** (i / 1.5)  # large budgets: decodes share steps with big chunks
        records.append(
            {
                "max_num_batched_tokens": budget,
                "duration_s": rng.uniform(8, 12) * (1 - 0.04 * i),
                "ttft_ms": [rng.uniform(0.3, 1.7) * ttft_scale for _ in range(n)],
                "tpot_ms": [rng.uniform(0.5, 1.5) * tpot_scale for _ in range(n)],
            }
        )
    rng.shuffle(records)
    return records


RANDOM_SLOS = [{"ttft": 200.0, "tpot": 40.0}, {"ttft": 100.0, "tpot": 60.0}, {"ttft": 400.0, "tpot": 25.0}]


# The mistakes, written out as a student would write them; each picks (score, budget) the wrong way.
def _pick(records, score, *, ties_to_larger: bool = False) -> int:
    sign = 1 if ties_to_larger else -1
    return max(records, key=lambda r: (score(r), sign * r["max_num_batched_tokens"]))["max_num_batched_tokens"]


def _good(record, slo_ms, within) -> int:
    return sum(
        within(t, slo_ms.get("ttft", math.inf)) and within(p, slo_ms.get("tpot", math.inf))
        for t, p in zip(record["ttft_ms"], record["tpot_ms"])
    )


def _at_or_below(value, limit):
    return value <= limit


def _below(value, limit):
    return value < limit


def _pick_strictly_below(records, slo_ms):
    return _pick(records, lambda r: _good(r, slo_ms, _below) / r["duration_s"])


def _pick_ties_to_larger(records, slo_ms):
    return _pick(records, lambda r: _good(r, slo_ms, _at_or_below) / r["duration_s"], ties_to_larger=True)


def _pick_not_per_second(records, slo_ms):
    return _pick(records, lambda r: _good(r, slo_ms, _at_or_below))


def _pick_throughput_best(records, slo_ms):
    return _pick(records, lambda r: len(r["ttft_ms"]) / r["duration_s"])


def _pick_ttft_only(records, slo_ms):
    return _pick(records, lambda r: _good(r, {"ttft": slo_ms["ttft"]}, _at_or_below) / r["duration_s"])


def _pick_tpot_only(records, slo_ms):
    return _pick(records, lambda r: _good(r, {"tpot": slo_ms["tpot"]}, _at_or_below) / r["duration_s"])


# (mistake, what its pick is, the rule it breaks): one pick may be several mistakes at once.
BUDGET_MISTAKES = (
    (_pick_strictly_below, "the pick that leaves out requests exactly at a limit", "a value equal to a limit meets it"),
    (_pick_ties_to_larger, "the larger of two budgets tied on goodput", "ties go to the smaller budget"),
    (
        _pick_not_per_second,
        "the budget with the most requests within the SLOs, not the most per second",
        "goodput divides their count by the run's duration_s",
    ),
    (_pick_throughput_best, "the throughput-best budget", "goodput counts only requests within every SLO"),
    (_pick_ttft_only, "the best budget for TTFT alone", "a request must also meet the TPOT SLO"),
    (_pick_tpot_only, "the best budget for TPOT alone", "a request must also meet the TTFT SLO"),
)


def _compare_budget(records, slo_ms):
    def compare(got, expected) -> str | None:
        value, problem = as_number(got, what="a budget (max_num_batched_tokens)")
        if problem:
            return problem
        if value == expected:
            return None
        by_budget = {r["max_num_batched_tokens"]: r for r in records}
        if value not in by_budget:
            return f"got {got}, which is not a budget of the sweep ({sorted(by_budget)})"
        matched = [(what, rule) for mistake, what, rule in BUDGET_MISTAKES if mistake(records, slo_ms) == value]
        why = f"that is {' and '.join(w for w, _ in matched)}: {'; '.join(r for _, r in matched)}" if matched else ""
        shown = distinct_pair(goodput_of(by_budget[value], slo_ms), goodput_of(by_budget[expected], slo_ms))
        return f"got {int(value)}, expected {expected} (goodput {shown[0]} vs {shown[1]} req/s)" + (
            f": {why}" if why else ""
        )

    return compare


def budget_cases(random_sweeps: int) -> list[tuple[str, list[dict], dict]]:
    """(description, records, SLOs): the scripted sweeps, then random ones."""
    rng = case_rng(BUDGET_QID)
    cases = [(f"{text}, SLOs {SCRIPTED_SLO}", records, SCRIPTED_SLO) for text, records in scripted_sweeps()]
    for number in range(random_sweeps):
        slo_ms = RANDOM_SLOS[number % len(RANDOM_SLOS)]
        cases.append((f"random sweep {number + 1} with SLOs {slo_ms}", random_sweep(rng, slo_ms), slo_ms))
    return cases


def grade_best_budget(pick, random_sweeps: int = 6) -> Verdict:
    qid = BUDGET_QID
    cases = budget_cases(random_sweeps)
    for description, records, slo_ms in cases:
        verdict = grade_function(
            qid,
            pick,
            reference_best_budget,
            [Case(description, (records, slo_ms))],
            _compare_budget(records, slo_ms),
            "",
        )
        if not verdict.ok:
            return verdict
    return Verdict(
        qid,
        True,
        f"the goodput-best budget of {len(cases)} sweeps, among them values equal to a limit, an exact tie "
        f"and runs of different lengths",
    )


def check_best_budget(pick, random_sweeps: int = 6) -> None:
    print(grade_best_budget(pick, random_sweeps).line)
