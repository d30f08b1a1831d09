"""Deliberately wrong answers, substituted into solution 04, must fail exactly their own checks."""

import nbformat

from tests.nbval_runner import cell_results, check_cell_ids
from tests.notebook_files import REPO_ROOT
from tests.test_wrong_answers import with_solutions_replaced

# Plausible mistakes, one per task of lab 04 (cell id -> replacement solution).
LAB04_MISTAKES = {
    "q1": 'answer_q1 = "approximate"',
    "q2": "answer_q2 = 32 * 32768**2 * 2  # bytes, not GB",
    "q3": "answer_q3 = 3 + 1  # forgot to rescale to the common max",
    "q4": "answer_q4 = math.ceil(192 * 1024 / (4 * 128))  # bytes instead of fp16 elements",
    "q5": "answer_q5 = 1",
    "q6": 'answer_q6 = "flashattention-2"',
    "merge": """    new_max = torch.maximum(a.max, b.max)
    return SoftmaxState(new_max, a.sum + b.sum, a.acc + b.acc)  # no rescaling""",
    "tiled": """    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # the whole N x N matrix: correct, not tiled
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v""",
    "score-bytes": "    return batch * heads * seq_len * bytes_per_element  # N, not N^2",
}
LAB04_CHECK_OF_TASK = {"merge": "check-merge", "tiled": "check-tiled", "score-bytes": "check-score-bytes"}


def test_lab04_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = nbformat.read(REPO_ROOT / "solutions" / "04_flash_attention.ipynb", as_version=4)
    mutated_path = tmp_path / "04_wrong.ipynb"
    nbformat.write(with_solutions_replaced(solution, LAB04_MISTAKES), mutated_path)

    results = cell_results(mutated_path, tmp_path)
    should_fail = {LAB04_CHECK_OF_TASK.get(cell_id, cell_id) for cell_id in LAB04_MISTAKES}
    for check in check_cell_ids(solution):
        if check in should_fail:
            assert results[check] is False, f"check cell {check!r} passed a deliberately wrong answer"
        else:
            assert results[check] is True, f"check cell {check!r} failed although its task was left correct"
