"""Lab 04 code checks: the online-softmax merge, the tiled forward pass, the score-matrix memory.

Cases are random, seeded by the check's id (at grading, also cases no student saw). The tiled
check also watches one call op by op (`OpWatch`): correct values computed with
scaled_dot_product_attention, through a tensor as large as a [block, N] strip of scores, or with
scores (a matmul, exp or softmax) spanning more keys than one block, are not tiled attention: the
last catches a loop over strips of query rows with a plain softmax over all keys.

At grading the library code that computes the answers (HIDDEN_AT_GRADING) is not in the student's
kernel; `block_state` and `SoftmaxState` are given on purpose (GIVEN)."""

import torch

from infer.attention import (
    SoftmaxState,
    block_state,
    flash_attn_package,
    merge_states,
    naive_attention,
    random_qkv,
    reference_attention,
    relative_error,
    sdpa_attention,
    tiled_attention,
)
from infer.attention_io import score_matrix_bytes
from infer.attention_triton import triton_attention
from infer.course.grading.checks import Case, OpWatch, Verdict, case_rngs, close_to, grade_function, torch_generator
from infer.paged_attention import causal_attention

MERGE_QID, TILED_QID, BYTES_QID = "04.lab.merge", "04.lab.tiled", "04.lab.score_bytes"
SDPA_OPS = ("scaled_dot_product",)  # every SDPA backend's aten op has this in its name
# Ops that compute scores or their weights: none may span more keys than one block in a tiled pass.
SCORE_OPS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::_softmax", "aten::exp")

# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (
    merge_states,
    tiled_attention,
    naive_attention,
    reference_attention,
    sdpa_attention,
    flash_attn_package,
    triton_attention,
    causal_attention,
    score_matrix_bytes,
)
GIVEN = {TILED_QID: (block_state, SoftmaxState)}


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


def grade_merge(student_merge, cases: int = 6) -> Verdict:
    """merge(state of block A, state of block B) must equal the state of A and B together."""
    qid = MERGE_QID
    examples = []
    for rng in case_rngs(qid):
        examples += _merge_cases(rng, cases)
    return grade_function(
        qid,
        student_merge,
        merge_states,
        examples,
        _state_problem,
        f"merged states equal the two-block states on {cases} random cases",
    )


def _merge_cases(rng, cases: int) -> list[Case]:
    generator = torch_generator(rng)
    examples = []
    for index in range(cases):
        rows, keys_a, keys_b, dim = rng.randint(1, 8), rng.randint(1, 12), rng.randint(1, 12), rng.choice([4, 16])
        spread = rng.choice([1.0, 30.0])  # large scores: a merge that forgets to rescale overflows or drifts
        scores = torch.randn(rows, keys_a + keys_b, dtype=torch.float64, generator=generator, device="cpu") * spread
        if index % 2:  # some rows see nothing in block B (masked keys), as on a causal diagonal
            scores[: rows // 2 + 1, keys_a:] = float("-inf")
        values = torch.randn(keys_a + keys_b, dim, dtype=torch.float64, generator=generator, device="cpu")
        a = block_state(scores[:, :keys_a], values[:keys_a])
        b = block_state(scores[:, keys_a:], values[keys_a:])
        label = f"{rows} rows, blocks of {keys_a} and {keys_b} keys, scores x{spread:g}" + (
            ", some rows masked in B" if index % 2 else ""
        )
        examples.append(Case(label, (a, b)))
    return examples


def check_merge(student_merge, cases: int = 6) -> None:
    print(grade_merge(student_merge, cases).line)


def _output_problem(tolerance: float):
    def compare(got, expected) -> str | None:
        reference, q, k, v, causal = expected
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        if got.shape != reference.shape:
            return f"expected shape {tuple(reference.shape)}, got {tuple(got.shape)}"
        if torch.isnan(got).any():
            return (
                "the output contains NaN: some query row saw no key at all (all its scores -inf, and "
                "exp(-inf - (-inf)) is NaN); a causal mask hides the keys *after* each query (key position > "
                "query position), never the query's own position"
            )
        error = relative_error(got, reference)
        if not error <= tolerance:
            other = reference_attention(q, k, v, causal=not causal).to(q.dtype)
            if relative_error(got, other) <= tolerance:
                return "your output is " + (
                    "non-causal attention: apply the mask when causal=True"
                    if causal
                    else "causal attention: mask only when causal=True"
                )
            return f"relative error {error:.2e} against the float64 reference (allowed {tolerance:.0e})"
        return None

    return compare


def _reference_for(q, k, v, causal, block_size):
    return reference_attention(q, k, v, causal=causal).to(q.dtype), q, k, v, causal


def grade_tiled(student_tiled, cases: int = 5) -> Verdict:
    examples = []
    for rng in case_rngs(TILED_QID):
        for index in range(cases):
            block = rng.choice([16, 32, 64])
            seq_len = rng.randint(block + 1, 4 * block) | 1  # odd: never a multiple of the block size
            batch, heads, dim = rng.randint(1, 2), rng.randint(1, 3), rng.choice([16, 32])
            causal = index % 2 == 0
            q, k, v = random_qkv(batch, heads, seq_len, dim, seed=rng.randrange(2**31))
            examples.append(
                Case(
                    f"q of shape {(batch, heads, seq_len, dim)}, causal={causal}, block_size={block}",
                    (q, k, v, causal, block),
                )
            )
    verdict = grade_function(TILED_QID, student_tiled, _reference_for, examples, _output_problem(1e-5), "")
    if not verdict.ok:
        return verdict
    return _watched_call_verdict(student_tiled, cases)


def _watched_call_verdict(student_tiled, cases: int) -> Verdict:
    """Correct values are not enough: watch one call at N=1024 for SDPA and for large tensors. A
    [block, block] tile of scores is 4,096 elements here; a [block, N] strip of scores (all keys at
    once) is 65,536, the N x N matrix 1,048,576, while q, k, v and the output hold 32,768 each."""
    seq_len, block = 1024, 64
    q, k, v = random_qkv(1, 1, seq_len, 32, seed=0)
    try:
        with OpWatch() as watch:
            student_tiled(q, k, v, True, block)
    except Exception as exc:
        return Verdict(
            TILED_QID, False, f"with N={seq_len}, block_size={block}, causal=True, raised {type(exc).__name__}: {exc}"
        )
    sdpa = watch.first(SDPA_OPS)
    if sdpa:
        return Verdict(
            TILED_QID,
            False,
            f"correct values, but your function calls scaled_dot_product_attention "
            f"({sdpa}): the lab asks for the tiling and the online softmax by hand",
        )
    wide = next(
        (
            (op, shapes[0])
            for op, shapes in watch.ops
            if op in SCORE_OPS and shapes and len(shapes[0]) >= 2 and shapes[0][-1] > block
        ),
        None,
    )
    large = watch.first_larger_than(block * seq_len)
    if large:
        op, shape = large
        return Verdict(
            TILED_QID,
            False,
            (
                f"correct values, but with N={seq_len}, block_size={block} your function built a tensor of shape "
                f"{list(shape)} ({op}), as large as a strip of scores against all N keys or more (the N x N matrix is "
                f"[{seq_len}, {seq_len}]): compute one [block_size, block_size] tile of scores at a time"
            ),
        )
    if wide:
        op, shape = wide
        return Verdict(
            TILED_QID,
            False,
            f"correct values, but with N={seq_len}, block_size={block} your function computed scores or "
            f"weights over {shape[-1]} keys at once ({op} gave shape {list(shape)}): FlashAttention tiles the "
            f"keys too, one block of block_size keys at a time folded into the online softmax; strips of "
            f"query rows with a plain softmax over all keys are not it",
        )
    return Verdict(
        TILED_QID,
        True,
        f"matches the float64 reference on {cases} random cases, calls no SDPA, never builds a tensor "
        f"larger than a few tiles, and never scores more than one block of keys at once",
    )


def check_tiled(student_tiled, cases: int = 5) -> None:
    print(grade_tiled(student_tiled, cases).line)


def grade_score_bytes(student_score_bytes, cases: int = 6) -> Verdict:
    qid = BYTES_QID
    examples = [Case("batch 1, 32 heads, N = 32768, bf16", (1, 32, 32768, 2))]
    for rng in case_rngs(qid):
        for _ in range(cases - 1):
            args = (rng.randint(1, 16), rng.choice([1, 8, 12, 32, 64]), rng.randint(1, 131072), rng.choice([1, 2, 4]))
            examples.append(Case(f"batch {args[0]}, {args[1]} heads, N = {args[2]}, {args[3]} bytes per element", args))
    return grade_function(
        qid,
        student_score_bytes,
        score_matrix_bytes,
        examples,
        close_to(1e-9, unit="bytes"),
        f"score-matrix bytes match on {cases} shapes",
    )


def check_score_bytes(student_score_bytes, cases: int = 6) -> None:
    print(grade_score_bytes(student_score_bytes, cases).line)
