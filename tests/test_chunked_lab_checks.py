"""Lab 06's checks: the right chunked decision and budget pick pass; each shortcut fails with a
message that names it; the library's own function is refused."""

import pytest

from infer.course.exercises.week06 import grade_best_budget, grade_chunked_decision
from infer.engine.scheduler import chunked_token_counts


def right(running_needs, running_prefilling, waiting, free_slots, budget):
    counts = [0] * len(running_needs)
    for prefilling in (False, True):  # decodes, then the prompts being continued
        for i, (need, p) in enumerate(zip(running_needs, running_prefilling)):
            if p == prefilling:
                counts[i] = min(need, budget)
                budget -= counts[i]
    new = []
    for need in waiting[: max(free_slots, 0)]:
        if budget == 0:
            break
        new.append(min(need, budget))
        budget -= new[-1]
    return counts, new


def prefill_first(running_needs, running_prefilling, waiting, free_slots, budget):
    new = []
    for need in waiting[:free_slots]:
        if need > budget:
            break
        new.append(need)
        budget -= need
    if new:
        return [0] * len(running_needs), new
    return [0 if p else 1 for p in running_prefilling], []


def waiting_first(running_needs, running_prefilling, waiting, free_slots, budget):
    new = []
    for need in waiting[:free_slots]:
        if budget == 0:
            break
        new.append(min(need, budget))
        budget -= new[-1]
    counts = []
    for need in running_needs:
        counts.append(min(need, budget))
        budget -= counts[-1]
    return counts, new


def running_in_queue_order(running_needs, running_prefilling, waiting, free_slots, budget):
    counts = []
    for need in running_needs:
        counts.append(min(need, budget))
        budget -= counts[-1]
    return counts, right([], [], waiting, free_slots, budget)[1]  # the rest to new prompts, as it should


def over_budget(running_needs, running_prefilling, waiting, free_slots, budget):
    counts, new = right(running_needs, running_prefilling, waiting, free_slots, budget)
    return [1 if not p else n for n, p in zip(counts, running_prefilling)], new


def test_the_right_decision_passes():
    verdict = grade_chunked_decision(right)
    assert verdict.ok, verdict.line


@pytest.mark.parametrize(
    "wrong, named",
    [
        (prefill_first, "was left waiting whole: chunked prefill splits it"),
        (waiting_first, "the running sequences come first"),
        (running_in_queue_order, "the decodes come first, then the prompt chunks"),
        (over_budget, "more than the budget"),
    ],
)
def test_each_shortcut_fails_with_its_name(wrong, named):
    verdict = grade_chunked_decision(wrong)
    assert not verdict.ok and named in verdict.reason, verdict.line


def test_the_librarys_own_decision_is_refused():
    assert "library's own" in grade_chunked_decision(chunked_token_counts).reason


def goodput(record, slo_ms):
    good = sum(
        t <= slo_ms.get("ttft", float("inf")) and p <= slo_ms.get("tpot", float("inf"))
        for t, p in zip(record["ttft_ms"], record["tpot_ms"])
    )
    return good / record["duration_s"]


def test_the_goodput_best_budget_passes():
    def pick(records, slo_ms):
        return max(records, key=lambda r: (goodput(r, slo_ms), -r["max_num_batched_tokens"]))["max_num_batched_tokens"]

    assert grade_best_budget(pick).ok


def test_the_throughput_best_budget_is_named():
    def pick(records, slo_ms):
        return max(records, key=lambda r: len(r["ttft_ms"]) / r["duration_s"])["max_num_batched_tokens"]

    assert "that is the throughput-best budget" in grade_best_budget(pick).reason


def test_a_ttft_only_pick_fails():
    def pick(records, slo_ms):
        return max(records, key=lambda r: (goodput(r, {"ttft": slo_ms["ttft"]}), -r["max_num_batched_tokens"]))[
            "max_num_batched_tokens"
        ]

    assert not grade_best_budget(pick).ok


def test_a_wrapper_around_the_librarys_decision_is_refused():
    verdict = grade_chunked_decision(lambda *args: chunked_token_counts(*args))
    assert not verdict.ok and "calls the course library's own" in verdict.reason, verdict.line
