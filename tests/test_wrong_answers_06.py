"""Lab 06: deliberately wrong answers, substituted into the solution, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 06 (cell id -> replacement solution).
LAB06_MISTAKES = {
    "q1": "answer_q1 = 512  # the whole budget, as if the decodes took none of it",
    "q2": "answer_q2 = 2000 / (512 - 20)  # not rounded up: the last, partial chunk takes a step too",
    "q3": "answer_q3 = 400  # the prefill only, not the decode step that makes the next token",
    "q4": 'answer_q4 = "small-budget"',
    "q5": 'answer_q5 = "small-hurts-tpot-large-hurts-ttft"',
    "q6": 'answer_q6 = "random-seeds"',
    "decision": """    budget = max_num_batched_tokens
    running_counts = [0] * len(running_needs)
    for prefilling in (False, True):  # decodes first: Sarathi-Serve's and vLLM V0's order, not V1's
        for i, need in enumerate(running_needs):
            if running_prefilling[i] == prefilling:
                running_counts[i] = min(need, budget)
                budget -= running_counts[i]
    new_counts = []
    for need in waiting_prompt_lens[: max(free_slots, 0)]:
        if budget == 0:
            break
        new_counts.append(min(need, budget))
        budget -= new_counts[-1]
    return running_counts, new_counts""",
    "budget": """    def goodput(record):  # strictly below the limits: a value equal to a limit is counted as a miss
        good = sum(ttft < slo_ms["ttft"] and tpot < slo_ms["tpot"] for ttft, tpot in zip(record["ttft_ms"], record["tpot_ms"]))
        return good / record["duration_s"]

    return max(records, key=lambda r: (goodput(r), -r["max_num_batched_tokens"]))["max_num_batched_tokens"]""",
}
LAB06_CHECK_OF_TASK = {"decision": "check-decision", "budget": "check-budget"}


def test_lab06_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "06_chunked_prefill.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB06_MISTAKES, LAB06_CHECK_OF_TASK, tmp_path)
