"""Lab 06's checks: the right chunked decision and budget pick pass; each wrong implementation that
breaks a rule the lab states fails with a message naming that rule; the library's own functions
are refused, even in a partial."""

import functools
import math

import pytest

from infer.course.grading.checks import grade_answer
from infer.course.grading.exercises.week06 import grade_best_budget, grade_chunked_decision
from infer.engine.scheduler import chunked_token_counts

# ---------------------------------------------------------------- the chunked decision


def new_chunks(waiting, free_slots, budget):
    new = []
    for need in waiting[: max(free_slots, 0)]:
        if budget == 0:
            break
        new.append(min(need, budget))
        budget -= new[-1]
    return new


def right(running_needs, running_prefilling, waiting, free_slots, budget):
    counts = []
    for need in running_needs:  # in the order they were admitted: vLLM V1 sorts nothing
        counts.append(min(need, budget))
        budget -= counts[-1]
    return counts, new_chunks(waiting, free_slots, budget)


def decodes_first(running_needs, running_prefilling, waiting, free_slots, budget):
    counts = [0] * len(running_needs)
    for prefilling in (False, True):  # Sarathi-Serve's and vLLM V0's order
        for i, (need, p) in enumerate(zip(running_needs, running_prefilling)):
            if p == prefilling:
                counts[i] = min(need, budget)
                budget -= counts[i]
    return counts, new_chunks(waiting, free_slots, budget)


def whole_prompts_only(running_needs, running_prefilling, waiting, free_slots, budget):
    counts, _ = right(running_needs, running_prefilling, [], 0, budget)
    budget -= sum(counts)
    new = []
    for need in waiting[:free_slots]:
        if need > budget:
            break
        new.append(need)
        budget -= need
    return counts, new


def waiting_first(running_needs, running_prefilling, waiting, free_slots, budget):
    new = new_chunks(waiting, free_slots, budget)
    counts, _ = right(running_needs, running_prefilling, [], 0, budget - sum(new))
    return counts, new


def running_subtracted_twice(running_needs, running_prefilling, waiting, free_slots, budget):
    counts, _ = right(running_needs, running_prefilling, [], 0, budget)
    budget -= sum(counts)
    budget -= sum(counts)  # once more: the new prompts get less than is left
    return counts, new_chunks(waiting, free_slots, max(budget, 0))


def over_budget(running_needs, running_prefilling, waiting, free_slots, budget):
    counts, new = right(running_needs, running_prefilling, waiting, free_slots, budget)
    return [max(n, 1) for n in counts], new  # every running sequence gets a token, budget or not


def test_the_right_decision_passes():
    verdict = grade_chunked_decision(right)
    assert verdict.ok, verdict.line


@pytest.mark.parametrize(
    "wrong, named",
    [
        (
            decodes_first,
            "that is Sarathi-Serve's and vLLM V0's order; vLLM V1 serves the running sequences in the order",
        ),
        (whole_prompts_only, "was left waiting whole: chunked prefill splits it"),
        (waiting_first, "the running sequences come first"),
        (running_subtracted_twice, "the running sequences' tokens were taken from the budget twice"),
        (over_budget, "more than the budget"),
    ],
)
def test_each_wrong_decision_fails_naming_the_rule_it_breaks(wrong, named):
    verdict = grade_chunked_decision(wrong)
    assert not verdict.ok and named in verdict.reason, verdict.line


def test_the_issues_state_is_a_case():
    verdict = grade_chunked_decision(decodes_first)
    assert "running [decode 1, prefill 200, decode 1]" in verdict.line and "expected ([1, 39, 0], [])" in verdict.line


def test_the_librarys_own_decision_is_refused():
    assert "library's own" in grade_chunked_decision(chunked_token_counts).reason


def test_the_kernel_lacks_the_library_functions_that_answer():
    from infer.course.grading.exercises import week06
    from infer.experiments.chunked_prefill import best_budget
    from infer.metrics import meets_slo, request_goodput

    assert week06.HIDDEN_AT_GRADING == (
        chunked_token_counts,
        best_budget,
        week06.goodput_of,
        meets_slo,
        request_goodput,
    )


def test_a_partial_of_the_librarys_decision_is_refused():
    verdict = grade_chunked_decision(functools.partial(chunked_token_counts))
    assert not verdict.ok and "the course library's own infer.engine.scheduler.chunked_token_counts" in verdict.reason


# ---------------------------------------------------------------- the goodput-best budget


def good_count(record, slo_ms, within=lambda value, limit: value <= limit):
    return sum(
        within(t, slo_ms.get("ttft", math.inf)) and within(p, slo_ms.get("tpot", math.inf))
        for t, p in zip(record["ttft_ms"], record["tpot_ms"])
    )


def pick_by(score, ties_to_larger=False):
    sign = 1 if ties_to_larger else -1

    def pick(records, slo_ms):
        return max(records, key=lambda r: (score(r, slo_ms), sign * r["max_num_batched_tokens"]))[
            "max_num_batched_tokens"
        ]

    return pick


goodput_best = pick_by(lambda r, slo: good_count(r, slo) / r["duration_s"])


def test_the_goodput_best_budget_passes():
    verdict = grade_best_budget(goodput_best)
    assert verdict.ok, verdict.line


@pytest.mark.parametrize(
    "wrong, named",
    [
        (
            pick_by(lambda r, slo: good_count(r, slo, lambda v, limit: v < limit) / r["duration_s"]),
            "a value equal to a limit meets it",
        ),
        (pick_by(lambda r, slo: good_count(r, slo) / r["duration_s"], ties_to_larger=True), "ties go to the smaller"),
        (pick_by(lambda r, slo: good_count(r, slo)), "goodput divides their count by the run's duration_s"),
        (pick_by(lambda r, slo: len(r["ttft_ms"]) / r["duration_s"]), "that is the throughput-best budget"),
        (pick_by(lambda r, slo: good_count(r, {"ttft": slo["ttft"]}) / r["duration_s"]), "best budget for TTFT alone"),
        (pick_by(lambda r, slo: good_count(r, {"tpot": slo["tpot"]}) / r["duration_s"]), "best budget for TPOT alone"),
    ],
    ids=["strictly-below", "ties-to-larger", "not-per-second", "throughput", "ttft-only", "tpot-only"],
)
def test_each_wrong_pick_fails_naming_the_rule_it_breaks(wrong, named):
    verdict = grade_best_budget(wrong)
    assert not verdict.ok and named in verdict.reason, verdict.line


def test_a_tie_shows_equal_goodputs_and_a_limit_case_shows_distinct_ones():
    ties = grade_best_budget(pick_by(lambda r, slo: good_count(r, slo) / r["duration_s"], ties_to_larger=True))
    assert "got 4096, expected 1024 (goodput 0.8 vs 0.8 req/s)" in ties.line, ties.line


# ---------------------------------------------------------------- check questions: messages that fit


def test_a_fractional_step_count_is_told_to_round_up():
    line = grade_answer("06.q2", 2000 / 492).line
    assert "expected a whole number, got 4.06504" in line and "round up" in line and "round down" not in line, line


def test_a_rejected_number_is_printed_with_the_digits_that_set_it_apart_from_the_accepted_edge():
    edge = 408 * 1.01
    line = grade_answer("06.q3", edge + 1e-7).line
    shown = line.split("❌ 06.q3: ")[1].split(" ms")[0]
    assert float(shown) > edge and f"{edge:g}" != shown, line
