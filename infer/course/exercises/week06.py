"""Lab 06 code checks: the chunked scheduling decision, and picking the goodput-best budget.

The decision is checked twice, in one check: on scripted scheduler states, each built so that one shortcut of
prefill-first thinking gives a wrong answer (and the message names it), and on whole arrival
traces, where the student's function drives the real scheduler (in the simulator, step by step)
and every step must match vLLM V1's. The budget picker is checked on sweep records in which the
throughput-best, the TTFT-only and the goodput-best budgets differ."""

import math
import random

from infer.course.checks import Case, Verdict, as_number, case_rng, grade_function, library_verdict
from infer.engine.scheduler import Chunked, chunked_token_counts
from infer.engine.simulator import simulate
from infer.engine.step_costs import FixedStepCost
from infer.metrics import RequestLatencies, meets_slo


def _state_text(running_needs, running_prefilling, waiting, free_slots, budget) -> str:
    running = ", ".join(f"{'prefill' if p else 'decode'} {n}" for n, p in zip(running_needs, running_prefilling))
    return (f"running [{running}], waiting prompts {waiting}, {free_slots} free slot"
            f"{'s' if free_slots != 1 else ''}, budget {budget}")


# Scripted states: each one catches a shortcut (named in the message when the answer matches it).
SCRIPTED_STATES = [
    ([1, 1, 1], [False, False, False], [300], 5, 64),  # a long prompt arrives while three decode
    ([1, 200, 1], [False, True, False], [50], 4, 40),  # a prompt being continued, and decodes around it
    ([1, 1], [False, False], [10, 500, 10], 3, 100),  # the second prompt does not fit whole
    ([1, 1, 1, 1], [False, False, False, False], [5], 4, 2),  # fewer tokens than decodes
    ([3, 1], [True, False], [4, 4, 4], 1, 100),  # one free slot only
    ([], [], [7, 9], 2, 16),  # an idle engine
]


def _random_state(rng: random.Random):
    running = rng.randint(0, 6)
    prefilling = [rng.random() < 0.3 for _ in range(running)]
    needs = [rng.randint(1, 300) if p else 1 for p in prefilling]
    waiting = [rng.randint(1, 400) for _ in range(rng.randint(0, 5))]
    slots = rng.randint(running, running + 4)
    return needs, prefilling, waiting, slots - running, rng.choice([1, 2, 5, 16, 64, 256, 1024])


def _shortcut(state, got) -> str:
    """Which prefill-first habit `got` shows in `state`, if any."""
    needs, prefilling, waiting, free_slots, budget = state
    running_counts, new_counts = got
    decodes_left = [i for i, p in enumerate(prefilling) if not p and running_counts[i] == 0]
    if sum(running_counts) + sum(new_counts) > budget:
        return f"the step computes {sum(running_counts) + sum(new_counts)} tokens, more than the budget of {budget}"
    if len(new_counts) > max(free_slots, 0):
        return f"{len(new_counts)} new requests admitted into {free_slots} free slots"
    if any(n > need for n, need in zip(running_counts, needs)) or any(n > w for n, w in zip(new_counts, waiting)):
        return "a sequence gets more tokens than it has left to compute"
    if any(n <= 0 for n in new_counts):
        return "an admitted request gets no tokens: admit a request only when the budget has room for part of its prompt"
    if new_counts and decodes_left:
        return "new prompts ran while a decode waited: the running sequences come first (prefill-first thinking)"
    if decodes_left and any(running_counts[i] for i, p in enumerate(prefilling) if p):
        return "a prompt being continued ran while a decode waited: the decodes come first, then the prompt chunks"
    left = budget - sum(running_counts) - sum(new_counts)
    admissible = min(len(waiting), max(free_slots, 0))
    if left > 0 and len(new_counts) < admissible and all(n == need for n, need in zip(running_counts, needs)):
        following = waiting[len(new_counts)]
        if following > left:
            return (f"the next prompt ({following} tokens) did not fit the {left} tokens left and was left waiting "
                    f"whole: chunked prefill splits it and spends the rest of the budget on its first chunk")
        return "budget was left over but no new prompt started: what the running sequences leave goes to new prompts"
    return ""


def _compare_decision(state):
    def compare(got, expected) -> str | None:
        if got is None:
            return "returned None (a missing `return`?); expected (running_counts, new_counts)"
        if not isinstance(got, (tuple, list)) or len(got) != 2 or not all(isinstance(g, (list, tuple)) for g in got):
            return "expected a pair of lists (running_counts, new_counts)"
        running_counts, new_counts = [list(g) for g in got]
        if len(running_counts) != len(state[0]):
            return f"running_counts has {len(running_counts)} entries for {len(state[0])} running sequences: one each, 0 for one left out"
        for value in running_counts + new_counts:
            number, problem = as_number(value, what="a token count")
            if problem or number != int(number):
                return f"token counts must be integers, got {value!r}"
        if [running_counts, new_counts] == [list(e) for e in expected]:
            return None
        why = _shortcut(state, (running_counts, new_counts))
        return f"got ({running_counts}, {new_counts}), expected ({list(expected[0])}, {list(expected[1])})" + (f": {why}" if why else "")
    return compare


def grade_chunked_decision(decide, random_cases: int = 40) -> Verdict:
    qid = "06.lab.decision"
    borrowed = library_verdict(qid, decide)
    if borrowed:
        return borrowed
    rng = case_rng(qid)
    states = SCRIPTED_STATES + [_random_state(rng) for _ in range(random_cases)]
    for state in states:
        verdict = grade_function(qid, decide, chunked_token_counts, [Case(_state_text(*state), state)],
                                 _compare_decision(state), "")
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


def grade_chunked_traces(decide, traces: int = 6) -> Verdict:
    """The student's decision drives the scheduler through whole traces; every step must match."""
    qid = "06.lab.decision"
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
            return Verdict(qid, False, f"trace {number + 1} ({len(prompts)} requests, budget {budget}, {seqs} slots) "
                                       f"raised {type(exc).__name__}: {exc}")
        for step, (g, e) in enumerate(zip(got, expected)):
            if g.items != e.items:
                show = lambda items: [(i.request_id, "prefill" if i.prefill else "decode", i.num_tokens) for i in items]
                return Verdict(qid, False, f"trace {number + 1} (budget {budget}, {seqs} slots), step {step}: ran "
                                           f"{show(g.items)}, expected {show(e.items)}")
        if len(got) != len(expected):
            return Verdict(qid, False, f"trace {number + 1}: {len(got)} steps, expected {len(expected)}")
    return Verdict(qid, True, f"{traces} arrival traces, every step as vLLM V1 schedules it")


# ------------------------------------------------------------ the goodput-best budget

def goodput_of(record: dict, slo_ms: dict[str, float]) -> float:
    """Requests per second within every SLO, from a sweep record's per-request latencies."""
    latencies = [RequestLatencies(ttft, tpot, math.nan, ()) for ttft, tpot in zip(record["ttft_ms"], record["tpot_ms"])]
    return sum(meets_slo(lat, slo_ms) for lat in latencies) / record["duration_s"]


def reference_best_budget(records: list[dict], slo_ms: dict[str, float]) -> int:
    return max(records, key=lambda r: (goodput_of(r, slo_ms), -r["max_num_batched_tokens"]))["max_num_batched_tokens"]


def sweep_records(rng: random.Random, slo_ms: dict[str, float]) -> list[dict]:
    """Sweep records in which small budgets miss the TTFT SLO, large ones the TPOT SLO, and the
    goodput-best budget is not the throughput-best one (drawn again until it is not)."""
    while True:
        records = _draw_sweep(rng)
        fastest = max(records, key=lambda r: (len(r["ttft_ms"]) / r["duration_s"], -r["max_num_batched_tokens"]))
        if reference_best_budget(records, slo_ms) != fastest["max_num_batched_tokens"]:
            return records


def _draw_sweep(rng: random.Random) -> list[dict]:
    budgets = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    records = []
    for i, budget in enumerate(budgets):
        n = rng.randint(20, 40)
        ttft_scale = 900 / (1 + i) ** 1.5  # small budgets: long prompts take many steps
        tpot_scale = 8 + 4 * 2 ** (i / 1.5)  # large budgets: decodes share steps with big chunks
        records.append({"max_num_batched_tokens": budget, "duration_s": rng.uniform(8, 12) * (1 - 0.04 * i),
                        "ttft_ms": [rng.uniform(0.3, 1.7) * ttft_scale for _ in range(n)],
                        "tpot_ms": [rng.uniform(0.5, 1.5) * tpot_scale for _ in range(n)]})
    rng.shuffle(records)
    return records


SLO_CASES = [{"ttft": 200.0, "tpot": 40.0}, {"ttft": 100.0, "tpot": 60.0}, {"ttft": 400.0, "tpot": 25.0}]


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
        fastest = max(records, key=lambda r: (len(r["ttft_ms"]) / r["duration_s"], -r["max_num_batched_tokens"]))
        ttft_only = reference_best_budget(records, {"ttft": slo_ms["ttft"]})
        tpot_only = reference_best_budget(records, {"tpot": slo_ms["tpot"]})
        hint = ""
        if value == fastest["max_num_batched_tokens"]:
            hint = ": that is the throughput-best budget; goodput counts only requests within every SLO"
        elif value == ttft_only:
            hint = ": that budget is best for TTFT alone; a request must also meet the TPOT SLO"
        elif value == tpot_only:
            hint = ": that budget is best for TPOT alone; a request must also meet the TTFT SLO"
        return f"got {int(value)}, expected {expected} (goodput {goodput_of(by_budget[value], slo_ms):.2f} vs " \
               f"{goodput_of(by_budget[expected], slo_ms):.2f} req/s){hint}"
    return compare


def grade_best_budget(pick, sweeps: int = 6) -> Verdict:
    qid = "06.lab.budget"
    rng = case_rng(qid)
    for number in range(sweeps):
        slo_ms = SLO_CASES[number % len(SLO_CASES)]
        records = sweep_records(rng, slo_ms)
        verdict = grade_function(qid, pick, reference_best_budget,
                                 [Case(f"sweep {number + 1} with SLOs {slo_ms}", (records, slo_ms))],
                                 _compare_budget(records, slo_ms), "")
        if not verdict.ok:
            return verdict
    return Verdict(qid, True, f"the goodput-best budget of {sweeps} sweeps, none of them the throughput-best")


def check_best_budget(pick, sweeps: int = 6) -> None:
    print(grade_best_budget(pick, sweeps).line)
