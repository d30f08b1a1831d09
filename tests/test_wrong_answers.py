"""Deliberately wrong answers, substituted into a solution, must fail exactly their own checks."""

import nbformat

from infer.labgen import replace_solution_blocks
from tests.nbval_runner import cell_results, check_cell_ids
from tests.notebook_files import REPO_ROOT

# Plausible mistakes a student makes, one per task of lab 01 (cell id -> replacement solution).
LAB01_MISTAKES = {
    "q1": 'answer_q1 = "decode"',
    "q2": "answer_q2 = 1.54e9 * 2  # bytes, not GB",
    "q3": "answer_q3 = 3.08e9 / 4.8e12  # seconds, not ms",
    "q4": "answer_q4 = 2.0",
    "q5": 'answer_q5 = "memory-bound"',
    "q6": "answer_q6 = (0.310 - 0.250) / 4 * 1e3  # divided by n instead of n - 1",
    "naive-loop": """    sequence = prompt_ids
    for _ in range(max_new_tokens):
        logits = hf.forward(model, sequence)
        next_token = logits[:, 0, :].argmax(dim=-1, keepdim=True)  # first position instead of the last
        sequence = torch.cat([sequence, next_token], dim=1)
    return sequence[:, prompt_ids.shape[1]:]""",
    "ttft-tpot": """    ttft_ms = (token_times_s[0] - send_time_s) * 1e3
    tpot_ms = (token_times_s[-1] - send_time_s) / len(token_times_s) * 1e3  # includes the prefill
    return ttft_ms, tpot_ms""",
    "intensity": "    return m * k * n / (bytes_per_element * (m * k + k * n + m * n))  # forgot the add",
}
LAB01_CHECK_OF_TASK = {"naive-loop": "check-naive-loop", "ttft-tpot": "check-ttft-tpot", "intensity": "check-intensity"}


def with_solutions_replaced(notebook, replacements: dict[str, str]):
    """`notebook` with the solution block of each named cell replaced by other code."""
    for cell in notebook.cells:
        if cell.id in replacements:
            assert "# BEGIN SOLUTION" in cell.source, f"cell {cell.id!r} has no solution block to replace"
            cell.source = replace_solution_blocks(cell.source, lambda block, indent: [replacements[cell.id]])
    return notebook


def test_lab01_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = nbformat.read(REPO_ROOT / "solutions" / "01_prefill_decode.ipynb", as_version=4)
    mutated_path = tmp_path / "01_wrong.ipynb"
    nbformat.write(with_solutions_replaced(solution, LAB01_MISTAKES), mutated_path)

    results = cell_results(mutated_path, tmp_path)
    should_fail = {LAB01_CHECK_OF_TASK.get(cell_id, cell_id) for cell_id in LAB01_MISTAKES}
    for check in check_cell_ids(solution):
        if check in should_fail:
            assert results[check] is False, f"check cell {check!r} passed a deliberately wrong answer"
        else:
            assert results[check] is True, f"check cell {check!r} failed although its task was left correct"
