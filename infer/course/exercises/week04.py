"""Lab 04 code checks: the online-softmax merge, the tiled forward pass, the score-matrix memory."""

import random

import torch

from infer.attention import SoftmaxState, block_state, merge_states, random_qkv, reference_attention, relative_error
from infer.attention_bench import TensorBytes
from infer.attention_io import score_matrix_bytes
from infer.course.checks import Case, Verdict, check_function, close_to, grade_function


def _state_problem(got, expected: SoftmaxState) -> str | None:
    if not isinstance(got, tuple) or len(got) != 3:
        return f"expected a (max, sum, acc) triple, got {type(got).__name__}"
    for label, g, e in zip(("max", "sum", "acc"), got, expected):
        if not isinstance(g, torch.Tensor):
            return f"{label}: expected a tensor, got {type(g).__name__}"
        if g.shape != e.shape:
            return f"{label}: expected shape {tuple(e.shape)}, got {tuple(g.shape)}"
        if torch.isnan(g).any():
            return f"{label} contains NaN (exp(-inf - (-inf))? keep every exponent <= 0)"
        if not torch.allclose(g.double(), e.double(), rtol=1e-9, atol=1e-12):
            return f"{label} differs from the state of both blocks together by up to {(g - e).abs().max().item():.3g}"
    return None


def check_merge(student_merge, cases: int = 6) -> None:
    """merge(state of block A, state of block B) must equal the state of A and B together."""
    rng = random.Random()
    examples = []
    for index in range(cases):
        rows, keys_a, keys_b, dim = rng.randint(1, 8), rng.randint(1, 12), rng.randint(1, 12), rng.choice([4, 16])
        spread = rng.choice([1.0, 30.0])  # large scores: a merge that forgets to rescale overflows or drifts
        scores = torch.randn(rows, keys_a + keys_b, dtype=torch.float64) * spread
        if index % 2:  # some rows see nothing in block B (masked keys), as on a causal diagonal
            scores[: rows // 2 + 1, keys_a:] = float("-inf")
        values = torch.randn(keys_a + keys_b, dim, dtype=torch.float64)
        a = block_state(scores[:, :keys_a], values[:keys_a])
        b = block_state(scores[:, keys_a:], values[keys_a:])
        label = f"{rows} rows, blocks of {keys_a} and {keys_b} keys, scores x{spread:g}" + (
            ", some rows masked in B" if index % 2 else "")
        examples.append(Case(label, (a, b)))
    check_function("04.lab.merge", student_merge, merge_states, examples, _state_problem,
                   f"merged states equal the two-block states on {cases} random cases")


def _output_problem(tolerance: float):
    def compare(got, expected) -> str | None:
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        if got.shape != expected.shape:
            return f"expected shape {tuple(expected.shape)}, got {tuple(got.shape)}"
        error = relative_error(got, expected)
        if not error <= tolerance:
            return f"relative error {error:.2e} against the float64 reference (allowed {tolerance:.0e})"
        return None

    return compare


def _reference_for(q, k, v, causal, block_size):
    return reference_attention(q, k, v, causal=causal).to(q.dtype)


def grade_tiled(student_tiled, cases: int = 5) -> Verdict:
    rng = random.Random()
    examples = []
    for index in range(cases):
        block = rng.choice([16, 32, 64])
        seq_len = rng.randint(block + 1, 4 * block) | 1  # odd: never a multiple of the block size
        batch, heads, dim = rng.randint(1, 2), rng.randint(1, 3), rng.choice([16, 32])
        causal = index % 2 == 0
        q, k, v = random_qkv(batch, heads, seq_len, dim)
        examples.append(Case(f"q of shape {(batch, heads, seq_len, dim)}, causal={causal}, block_size={block}",
                             (q, k, v, causal, block)))
    verdict = grade_function("04.lab.tiled", student_tiled, _reference_for, examples, _output_problem(1e-5), "")
    if not verdict.ok:
        return verdict
    return _memory_verdict(student_tiled, cases)


def _memory_verdict(student_tiled, cases: int) -> Verdict:
    """A correct answer that builds the whole [N, N] matrix is not tiled: measure what it holds."""
    seq_len, block = 1024, 64
    q, k, v = random_qkv(1, 1, seq_len, 32)
    full_matrix = seq_len * seq_len * 4
    with TensorBytes() as tracker:
        student_tiled(q, k, v, True, block)
    if tracker.peak >= full_matrix / 4:
        return Verdict("04.lab.tiled", False, (
            f"correct values, but with N={seq_len}, block_size={block} your function held {tracker.peak / 2**20:.1f} MiB "
            f"at once, against {full_matrix / 2**20:.1f} MiB for the whole N x N score matrix: compute one "
            f"[block, block] tile of scores at a time"))
    return Verdict("04.lab.tiled", True, f"matches the float64 reference on {cases} random cases, "
                                         f"and never holds more than a fraction of the N x N matrix")


def check_tiled(student_tiled, cases: int = 5) -> None:
    print(grade_tiled(student_tiled, cases).line)


def check_score_bytes(student_score_bytes, cases: int = 6) -> None:
    rng = random.Random()
    examples = [Case("batch 1, 32 heads, N = 32768, bf16", (1, 32, 32768, 2))]
    for _ in range(cases - 1):
        args = (rng.randint(1, 16), rng.choice([1, 8, 12, 32, 64]), rng.randint(1, 131072), rng.choice([1, 2, 4]))
        examples.append(Case(f"batch {args[0]}, {args[1]} heads, N = {args[2]}, {args[3]} bytes per element", args))
    check_function("04.lab.score_bytes", student_score_bytes, score_matrix_bytes, examples, close_to(1e-9, unit="bytes"),
                   f"score-matrix bytes match on {cases} shapes")

