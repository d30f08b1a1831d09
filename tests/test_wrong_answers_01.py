"""Deliberately wrong answers, substituted into a solution, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes a student makes, one per task of lab 01 (cell id -> replacement solution).
LAB01_MISTAKES = {
    "q1": 'answer_q1 = "decode"',
    "q2": "answer_q2 = 1.24e9 * 2  # bytes, not GB",
    "q3": "answer_q3 = 2.48e9 / 3.35e12  # seconds, not ms",
    "q4": "answer_q4 = 2 * 32 / 2  # the 2m/b approximation: forgets the activation and output bytes",
    "q5": 'answer_q5 = "compute-bound"',
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


def test_lab01_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "01_prefill_decode.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB01_MISTAKES, LAB01_CHECK_OF_TASK, tmp_path)
