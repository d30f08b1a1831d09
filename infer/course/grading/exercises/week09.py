"""Lab 09 code check: decode attention that reads a paged KV cache block by block, with no gather.

`check_paged_decode(paged_decode_attention)` runs the student's function, with the signature of the
engine's decode kernels (`(q, k_cache, v_cache, block_tables, lengths, scale) -> out`,
infer.cpu_kernels), three ways:
- on random paged layouts (blocks scattered through the cache, lengths of one token and either
  side of a block boundary, one and four query heads a KV head) against the engine's own path, the
  blocks gathered and then `scaled_dot_product_attention`, within float32 rounding;
- on one larger call, watched op by op (`OpWatch`): no tensor may be as large as every sequence's
  keys gathered at once, nor as one sequence's keys at full length: the lab asks for the keys a
  block at a time, folded into an online softmax (week 04);
- plugged into the engine (`Engine(..., decode_attention=paged_decode_attention)`, paged store,
  the course's trained weights): its greedy tokens must be the engine's own.

At grading the library code that computes the answer (HIDDEN_AT_GRADING: the compiled kernel, the
gather and the check's reference) is not in the student's kernel.
"""

import torch
import torch.nn.functional as F

from infer.course.grading.checks import OpWatch, Verdict, case_rngs, library_verdict
from infer.cpu_kernels import KernelUnavailable, in_place_decode_attention
from infer.paged_attention import gather_blocks
from infer.profiles import PROFILES

PAGED_QID = "09.lab.paged_decode"
TOLERANCE = {"rtol": 1e-5, "atol": 1e-5}  # float32 sums over a few hundred keys, in another order


def reference_paged_decode(q, k_cache, v_cache, block_tables, lengths, scale):
    """The engine's path: every sequence's blocks gathered, then one masked attention call."""
    longest = int(lengths.max())
    keys, values = gather_blocks(k_cache, block_tables, longest), gather_blocks(v_cache, block_tables, longest)
    batch, kv_heads = keys.shape[:2]
    queries = q.view(batch, kv_heads, q.shape[1] // kv_heads, q.shape[-1])
    mask = torch.arange(longest, device=lengths.device)[None, :] < lengths[:, None]
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask[:, None, None, :], scale=scale)
    return out.reshape(q.shape)


# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answer.
HIDDEN_AT_GRADING = (in_place_decode_attention, gather_blocks, reference_paged_decode)


def paged_case(
    rng, batch: int, heads: int, kv_heads: int, lengths: list[int], block_size: int = 16, d: int = 32, scale=None
):
    """(q, k_cache, v_cache, block_tables, lengths, scale): each sequence's blocks scattered at random;
    `scale` 1/sqrt(d) unless given."""
    generator = torch.Generator().manual_seed(rng.randrange(2**31))
    tables = [-(-n // block_size) for n in lengths]
    num_blocks = sum(tables) + 4
    shuffled = torch.randperm(num_blocks, generator=generator, device="cpu").tolist()
    widest = max(tables)
    block_tables = torch.zeros(batch, widest, dtype=torch.long, device="cpu")
    for row, count in enumerate(tables):
        block_tables[row, :count] = torch.tensor([shuffled.pop() for _ in range(count)], device="cpu")
    k_cache = torch.randn(num_blocks, kv_heads, block_size, d, generator=generator, device="cpu")
    v_cache = torch.randn(num_blocks, kv_heads, block_size, d, generator=generator, device="cpu")
    q = torch.randn(batch, heads, d, generator=generator, device="cpu")
    return q, k_cache, v_cache, block_tables, torch.tensor(lengths, device="cpu"), scale or d**-0.5


def _cases(rng) -> list[tuple[str, tuple]]:
    cases = [
        ("one sequence of one token", paged_case(rng, 1, 8, 2, [1])),
        ("lengths either side of a block boundary (15, 16, 17, 33)", paged_case(rng, 4, 8, 2, [15, 16, 17, 33])),
        ("one query head a KV head", paged_case(rng, 3, 4, 4, [40, 5, 64])),
        ("a scale of 0.3 (not 1/sqrt(head_dim))", paged_case(rng, 2, 8, 2, [20, 50], scale=0.3)),
    ]
    for _ in range(3):
        batch = rng.randint(1, 6)
        lengths = [rng.randint(1, 200) for _ in range(batch)]
        cases.append((f"{batch} sequences of {lengths} tokens", paged_case(rng, batch, 8, 2, lengths)))
    return cases


def _compare(got, expected) -> str | None:
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"expected shape {tuple(expected.shape)} ([batch, heads, head_dim]), got {tuple(got.shape)}"
    if torch.isnan(got).any():
        return "the output holds NaN: a block where every score is masked gives exp(-inf - (-inf)); keep a finite max"
    if not torch.allclose(got, expected, **TOLERANCE):
        return f"differs from the gathered attention by up to {(got - expected).abs().max().item():.2e}"
    return None


def grade_paged_decode(paged_decode_attention) -> Verdict:
    qid = PAGED_QID
    if not callable(paged_decode_attention):
        return Verdict(qid, False, f"expected a function, got {type(paged_decode_attention).__name__}")
    borrowed = library_verdict(qid, paged_decode_attention) or _compiled_kernel_verdict(paged_decode_attention)
    if borrowed:
        return borrowed
    for rng in case_rngs(qid):
        for description, args in _cases(rng):
            try:
                got = paged_decode_attention(*args)
            except Exception as exc:  # the student's bug, as one line
                if isinstance(exc, NotImplementedError):
                    return Verdict(qid, False, "not implemented yet")
                return Verdict(qid, False, f"on {description}, raised {type(exc).__name__}: {exc}")
            problem = _compare(got, reference_paged_decode(*args))
            if problem and _compare(got, reference_paged_decode(*args[:-1], args[0].shape[-1] ** -0.5)) is None:
                problem = "the scores were scaled by 1/sqrt(head_dim): multiply them by the `scale` given"
            if problem:
                return Verdict(qid, False, f"on {description}, {problem}")
    watched = _watched_call(paged_decode_attention, case_rngs(qid)[0])
    if watched:
        return Verdict(qid, False, watched)
    tokens = _in_the_engine(paged_decode_attention)
    if tokens:
        return Verdict(qid, False, tokens)
    return Verdict(
        qid,
        True,
        "matches the gathered attention on scattered blocks, never holds a gathered sequence, and inside the "
        "engine generates its greedy tokens",
    )


def _compiled_kernel_verdict(fn) -> Verdict | None:
    """The course's compiled kernel is the lecture's answer, not the student's (its C++ runs no op a watch sees)."""
    try:
        compiled = in_place_decode_attention()
    except KernelUnavailable:
        return None
    if fn is compiled:
        return Verdict(PAGED_QID, False, "this is the course's compiled kernel (infer.cpu_kernels): write your own")
    return None


def _watched_call(paged_decode_attention, rng) -> str | None:
    """8 sequences of 512 tokens in blocks of 16: all their keys gathered are 8 x 2 x 512 x 32 elements,
    one sequence's 2 x 512 x 32, one block of every sequence 8 x 2 x 16 x 32."""
    batch, kv_heads, length, block_size, d = 8, 2, 512, 16, 32
    args = paged_case(rng, batch, 8, kv_heads, [length] * batch, block_size, d)
    limit = 4 * batch * kv_heads * block_size * d  # a few blocks of every sequence at once
    try:
        with OpWatch() as watch:
            paged_decode_attention(*args)
    except Exception as exc:
        return f"on 8 sequences of 512 tokens, raised {type(exc).__name__}: {exc}"
    large = watch.first_larger_than(limit, ignore_views=True)  # the cache itself is larger, and sliced
    if large:
        op, shape = large
        return (
            f"correct values, but on 8 sequences of 512 tokens your function built a tensor of shape {list(shape)} "
            f"({op}), as large as a sequence's keys at full length or more: read the keys a block (one block "
            f"column of every sequence) at a time, and fold each block into an online softmax"
        )
    return None


def _in_the_engine(paged_decode_attention) -> str | None:
    from infer.engine import Engine
    from infer.engine.sequence import SamplingParams
    from infer.model import Transformer
    from infer.models import load_model

    # float32 on the CPU whatever the profile: the engine's decode kernels' own setting (week 09)
    model = Transformer.from_hf(load_model("tiny", profile=PROFILES["cpu"], weights="course", quiet=True).model)
    prompts = [list(b"def main():\n    "), list(b"import sys\nfor line in sys.stdin:\n"), list(b"class ")]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    outputs = {}
    for name, attention in (("engine", "sdpa"), ("yours", paged_decode_attention)):
        engine = Engine(model, "chunked", 4, 64, 128, kv_store="paged", decode_attention=attention)
        try:
            outputs[name] = [r.token_ids for r in engine.generate(prompts, params, progress=False)]
        except Exception as exc:  # the student's function, failing inside the engine
            return f"inside the engine (paged store), raised {type(exc).__name__}: {exc}"
    if outputs["yours"] != outputs["engine"]:
        return "inside the engine (paged store, the course's weights) the greedy tokens differ from the engine's own"
    return None


def check_paged_decode(paged_decode_attention) -> None:
    print(grade_paged_decode(paged_decode_attention).line)
