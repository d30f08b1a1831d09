"""Deliberately wrong answers, substituted into solution 02, must fail exactly their own checks."""

from tests.nbval_runner import assert_only_mistaken_checks_fail
from tests.notebook_files import REPO_ROOT

# Plausible mistakes, one per task of lab 02 (cell id -> replacement solution block).
LAB02_MISTAKES = {
    "q1": "answer_q1 = 100 + 50 - 1  # the cached count, not the naive one",
    "q2": 'answer_q2 = "q, k and v"',
    "q3": "answer_q3 = 32 * 8 * 128 * 2  # forgot that V is cached too",
    "q4": "answer_q4 = 2 * 24 * 2 * 64 * 2 * 32_768  # bytes, not GB",
    "q5": "answer_q5 = 8 / 64  # upside down",
    "q6": "answer_q6 = int((48e9 - 1_543_714_304 * 2 - 2e9) // (2 * 28 * 2 * 128 * 2)) // 8192  # the whole card, not u = 0.9 of it",
    "cached-loop": """    prompt = prompt_ids.reshape(-1)
    n = prompt.shape[0]
    logits = model(prompt, torch.arange(n), cache)
    token = logits[-1].argmax().reshape(1)
    new_tokens = [token]
    for i in range(1, max_new_tokens):
        logits = model(token, torch.tensor([n + i]), cache)  # one position too far: skips position n
        token = logits[-1].argmax().reshape(1)
        new_tokens.append(token)
    return torch.cat(new_tokens)[None]""",
    "kv-bytes": "    return num_layers * num_kv_heads * head_dim * bytes_per_element  # only K",
    "concurrency": "    return (gpu_bytes - weight_bytes - reserve_bytes) / kv_bytes_per_token / seq_len  # fractions, negatives",
}
# The cache cell has three blocks (__init__, write, read): only write goes wrong, silently clipping at capacity.
LAB02_MISTAKES["kv-cache"] = [
    """        shape = (max_seqs, kv_heads, max_len, head_dim)
        self.k = [torch.zeros(shape) for _ in range(num_layers)]
        self.v = [torch.zeros(shape) for _ in range(num_layers)]
        self.max_len = max_len""",
    """        end = min(start + k.shape[1], self.max_len)  # drops whatever does not fit, without a word
        self.k[layer][seq_id, :, start:end] = k[:, : end - start]
        self.v[layer][seq_id, :, start:end] = v[:, : end - start]""",
    """        return self.k[layer][seq_id, :, :end], self.v[layer][seq_id, :, :end]""",
]
LAB02_CHECK_OF_TASK = {
    "kv-cache": "check-kv-cache",
    "cached-loop": "check-cached-loop",
    "kv-bytes": "check-kv-bytes",
    "concurrency": "check-concurrency",
}


def test_lab02_wrong_answers_fail_exactly_their_checks(tmp_path):
    solution = REPO_ROOT / "solutions" / "02_kv_cache.ipynb"
    assert_only_mistaken_checks_fail(solution, LAB02_MISTAKES, LAB02_CHECK_OF_TASK, tmp_path)
