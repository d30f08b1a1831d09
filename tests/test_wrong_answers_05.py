"""Lab 05: deliberately wrong answers, substituted into the solution, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 05 (cell id -> replacement solution).
LAB05_MISTAKES = {
    "q1": "answer_q1 = (4 + 12 + 3 + 6 + 8 + 2 + 5 + 11) / 4  # as if no slot ever idled",
    "q2": "answer_q2 = 4 * 12 - (4 + 12 + 3 + 6)  # the first batch only",
    "q3": 'answer_q3 = "memory"',
    "q4": "answer_q4 = 4.0 / 16  # lambda / L instead of L / lambda",
    "q5": "answer_q5 = 4  # 900 + 700 + 100 + 50: the short prompts overtook the 600",
    "q6": "answer_q6 = 250  # forgets the decode step that makes the next token",
    "admission": """    if num_running:  # static batching: only into an empty engine
        return 0
    budget, admitted = max_num_batched_tokens, 0
    for length in waiting_prompt_lens[:max_num_seqs]:
        if length > budget:
            break
        budget -= length
        admitted += 1
    return admitted""",
    "step-forward": """    tokens = []
    for item in work:  # one model call per sequence: no batching at all
        stop = item.start + item.num_tokens
        ids = torch.tensor(item.seq.token_ids(item.start, stop))
        logits = model(ids, torch.arange(item.start, stop), cache, torch.full((item.num_tokens,), item.seq.slot),
                       logits_rows=torch.tensor([item.num_tokens - 1]))
        if item.samples:
            tokens.append(int(logits.argmax()))
    return tokens""",
}
LAB05_CHECK_OF_TASK = {"admission": "check-admission", "step-forward": "check-step-forward"}


def test_lab05_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "05_continuous_batching.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB05_MISTAKES, LAB05_CHECK_OF_TASK, tmp_path)
