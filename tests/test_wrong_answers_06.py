"""Lab 06: deliberately wrong answers, substituted into the solution, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 06 (cell id -> replacement solution).
LAB06_MISTAKES = {
    "q1": "answer_q1 = 512  # the whole budget, as if the decodes took none of it",
    "q2": "answer_q2 = math.ceil(2000 / 512)  # the decodes' share forgotten",
    "q3": "answer_q3 = 400  # the prefill only, not the decode step that makes the next token",
    "q4": 'answer_q4 = "small-budget"',
    "q5": 'answer_q5 = "small-hurts-tpot-large-hurts-ttft"',
    "q6": 'answer_q6 = "random-seeds"',
    "decision": """    budget = max_num_batched_tokens
    new_counts = []
    for need in waiting_prompt_lens[:max(free_slots, 0)]:  # new prompts first: prefill-first habits
        if budget == 0:
            break
        new_counts.append(min(need, budget))
        budget -= new_counts[-1]
    running_counts = []
    for need in running_needs:
        running_counts.append(min(need, budget))
        budget -= running_counts[-1]
    return running_counts, new_counts""",
    "budget": """    return max(records, key=lambda r: len(r["ttft_ms"]) / r["duration_s"])["max_num_batched_tokens"]  # throughput""",
}
LAB06_CHECK_OF_TASK = {"decision": "check-decision", "budget": "check-budget"}


def test_lab06_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "06_chunked_prefill.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB06_MISTAKES, LAB06_CHECK_OF_TASK, tmp_path)
