"""Deliberately wrong answers, substituted into solution 04, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 04 (cell id -> replacement solution).
LAB04_MISTAKES = {
    "q1": 'answer_q1 = "approximate"',
    "q2": "answer_q2 = 16 * 65536**2 * 2  # bytes, not GB",
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
    solution = REPO_ROOT / "solutions" / "04_flash_attention.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB04_MISTAKES, LAB04_CHECK_OF_TASK, tmp_path)
