"""Lab 02 code checks: a preallocated KV cache, the cached decode loop, the memory bill.

Each check runs the student's code against the library's (infer.kv_cache, infer.generate,
infer.memory) on random inputs seeded by the check's id (and, at grading, on inputs no student
saw), and prints one line. The cache and loop checks also watch *how* the result was made: a cache
must write in place (no torch.cat; what `read` returns stays in the same memory from one write to
the next), allocate in the dtype and on the device it is given, take a write that exactly fills a
slot and refuse one past it; a cached loop must feed the model the prompt once, then one token per
decode step. They run on a model they load themselves.

At grading the library code that computes the answers (HIDDEN_AT_GRADING) is not in the student's
kernel."""

import random

import torch

from infer import hf, memory
from infer.course.grading.checks import (
    Case,
    OpWatch,
    Verdict,
    as_number,
    case_rngs,
    close_to,
    grade_function,
    library_verdict,
    own_model,
    same_tokens,
    torch_generator,
)
from infer.course.grading.wire import storage_of
from infer.engine import Engine
from infer.generate import cached_greedy_generate, naive_greedy_generate
from infer.kv_cache import ConcatKVCache, KVCache
from infer.model import Arch, Transformer
from infer.models import MODEL_SPECS
from infer.prompts import random_prompt_ids

CACHE_QID, LOOP_QID = "02.lab.kv_cache", "02.lab.cached_loop"
KV_BYTES_QID, CONCURRENCY_QID = "02.lab.kv_bytes", "02.lab.concurrency"

# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (
    KVCache,
    ConcatKVCache,
    hf.greedy_generate,
    cached_greedy_generate,
    naive_greedy_generate,
    Engine,
    memory.kv_token_bytes,
    memory.kv_bytes_per_token,
    memory.sequences_that_fit,
    memory.max_concurrent_sequences,
    memory.kv_tokens_that_fit,
    memory.kv_budget_bytes,
    memory.memory_plan,
)
# The models the memory checks draw their cases from, in this order: a model added to the library
# later (week 10's draft) does not change a lab's graded cases or its lines.
CHECKED_MODELS = ("tiny", "qwen2.5-0.5b", "qwen2.5-1.5b", "llama-3.2-1b", "qwen2-dryrun")


def checked_models():
    return [(name, MODEL_SPECS[name]) for name in CHECKED_MODELS]


EXACT_FIT = "a write that ends exactly at max_len fits the slot (positions 0..max_len-1); only one past it must raise"
GROWTH_OPS = ("aten::cat", "aten::stack", "aten::constant_pad_nd")  # ways to grow a tensor instead of writing into one


# ---------------------------------------------------------------- the cache


def grade_kv_cache(student_cache_class, hf_model=None, qid: str = CACHE_QID, rounds: int = 3) -> Verdict:
    """Random writes and reads against infer.kv_cache.KVCache (in place, no torch.cat), the dtype
    and device it is given, a write that exactly fills a slot and one past it, and a real
    generation through the student's cache. `hf_model` (default: the check's own) is for tests."""
    borrowed = library_verdict(qid, student_cache_class)
    if borrowed:
        return borrowed
    try:
        return _cache_verdict(student_cache_class, hf_model, qid, rounds)
    except NotImplementedError as exc:
        return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")


def _cache_verdict(student_cache_class, hf_model, qid: str, rounds: int) -> Verdict:
    for rng in case_rngs(qid):
        for _ in range(rounds):
            verdict = _random_writes_and_reads(student_cache_class, rng, qid)
            if verdict is not None:
                return verdict
    for step in (_dtype_and_device, _write_past_capacity):
        verdict = step(student_cache_class, qid)
        if verdict is not None:
            return verdict
    return _generation_through(student_cache_class, hf_model, case_rngs(qid)[-1], qid)


def check_kv_cache(student_cache_class, hf_model=None) -> None:
    print(grade_kv_cache(student_cache_class, hf_model).line)


def _random_writes_and_reads(cache_class, rng: random.Random, qid: str) -> Verdict | None:
    layers, seqs, max_len, kv_heads, head_dim = (
        rng.randint(1, 3),
        rng.randint(1, 4),
        rng.randint(8, 40),
        rng.randint(1, 4),
        rng.choice([2, 4, 8]),
    )
    shape_text = f"num_layers={layers}, max_seqs={seqs}, max_len={max_len}, kv_heads={kv_heads}, head_dim={head_dim}"
    generator = torch_generator(rng)
    try:
        theirs = cache_class(layers, seqs, max_len, kv_heads, head_dim)
    except NotImplementedError:
        raise
    except Exception as exc:  # the student's bug, as one line
        return Verdict(qid, False, f"creating a cache with {shape_text} raised {type(exc).__name__}: {exc}")
    ours = KVCache(layers, seqs, max_len, kv_heads, head_dim)
    filled = [0] * seqs
    homes: dict[tuple[int, int], tuple[int | None, int | None]] = {}  # (layer, seq) -> storages read from
    for _ in range(12):
        layer, seq = rng.randrange(layers), rng.randrange(seqs)
        if filled[seq] >= max_len:
            continue
        start = filled[seq]
        n = rng.randint(1, min(6, max_len - start))
        k = torch.randn(kv_heads, n, head_dim, generator=generator, device="cpu")  # the cache's default device
        v = torch.randn(kv_heads, n, head_dim, generator=generator, device="cpu")
        what = f"write(layer={layer}, seq_id={seq}, start={start}, k, v) of {n} positions ({shape_text})"
        for layer_all in range(layers):  # the model writes every layer; keep the two caches in step
            ours.write(layer_all, seq, start, k, v)
        try:
            with OpWatch() as watch:
                for layer_all in range(layers):
                    theirs.write(layer_all, seq, start, k, v)
            got_k, got_v = theirs.read(layer, seq, start + n)
        except NotImplementedError:
            raise
        except Exception as exc:
            fills = f": {EXACT_FIT}" if start + n == max_len else ""
            return Verdict(qid, False, f"{what} then read raised {type(exc).__name__}: {exc}{fills}")
        grown = watch.first(GROWTH_OPS)
        if grown:
            return Verdict(
                qid,
                False,
                f"write() grows a tensor ({grown}, as torch.cat does): a cache grown by "
                f"concatenation copies everything stored so far at every step; allocate the "
                f"buffers once in __init__ and copy each write into them",
            )
        filled[seq] = start + n
        want_k, want_v = ours.read(layer, seq, start + n)
        for label, got, want in (("keys", got_k, want_k), ("values", got_v, want_v)):
            if not isinstance(got, torch.Tensor) or tuple(got.shape) != tuple(want.shape):
                shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                return Verdict(
                    qid,
                    False,
                    f"after {what}, read(layer, seq_id, end={start + n}) returned {label} "
                    f"of shape {shape}, expected [kv_heads, end, head_dim] = {tuple(want.shape)}",
                )
            if not torch.equal(got, want):
                return Verdict(
                    qid,
                    False,
                    f"after {what}, read(layer, seq_id, end={start + n}) returned the wrong "
                    f"{label}: did the write land at positions start..start+n-1 of that slot?",
                )
        home = (storage_of(got_k), storage_of(got_v))
        if homes.setdefault((layer, seq), home) != home:
            return Verdict(
                qid,
                False,
                "the tensors read() returns moved to new memory between two writes: a "
                "preallocated cache writes in place, and read() returns views (slices) of "
                "its buffers, not copies or new tensors",
            )
    return None


def _dtype_and_device(cache_class, qid: str) -> Verdict | None:
    """The buffers take the dtype and the device the constructor is given (the model's): a cache
    made for a bf16 model must hold bf16, and one for a model on a GPU must live there. The device
    is checked with PyTorch's "meta" device, which holds shapes without data, so that any
    machine can see where the buffers went."""
    for dtype, device in ((torch.bfloat16, "cpu"), (torch.float32, "meta")):
        asked = f"dtype={dtype}, device={device!r}"
        k = torch.arange(12, dtype=dtype, device="cpu").reshape(2, 3, 2).to(device)
        try:
            cache = cache_class(1, 2, 5, 2, 2, dtype=dtype, device=device)
            if device != "meta":  # a meta tensor holds no data to write: only where it lives is checked
                cache.write(0, 1, 0, k, -k)
            got_k, got_v = cache.read(0, 1, 3)
        except NotImplementedError:
            raise
        except Exception as exc:
            return Verdict(
                qid,
                False,
                f"a cache made with {asked} raised {type(exc).__name__}: {exc}"
                + (" (PyTorch's 'meta' device holds shapes, not data)" if device == "meta" else ""),
            )
        if not isinstance(got_k, torch.Tensor) or got_k.dtype != dtype:
            got = got_k.dtype if isinstance(got_k, torch.Tensor) else type(got_k).__name__
            return Verdict(
                qid,
                False,
                f"a cache made with dtype={dtype} returned keys of {got}: allocate the buffers in the "
                f"dtype the constructor is given (the model's: a bf16 model on a GPU needs a bf16 cache)",
            )
        if got_k.device.type != torch.device(device).type:
            return Verdict(
                qid,
                False,
                f"a cache made with device={device!r} returned keys on {got_k.device}: allocate the buffers "
                f"on the device the constructor is given (a model on a GPU needs its cache there; the check "
                f"asks for PyTorch's 'meta' device, which holds shapes without data, to see it on any machine)",
            )
        if device == "cpu" and not (torch.equal(got_k, k) and torch.equal(got_v, -k)):
            return Verdict(qid, False, f"a cache made with {asked} read back other keys or values than were written")
    return None


def _write_past_capacity(cache_class, qid: str) -> Verdict | None:
    cache = cache_class(1, 2, 11, 2, 4)
    cache.write(0, 1, 0, torch.zeros(2, 9, 4, device="cpu"), torch.zeros(2, 9, 4, device="cpu"))
    last_two = torch.ones(2, 2, 4, device="cpu")  # positions 9 and 10: exactly fills a max_len=11 slot
    try:
        cache.write(0, 1, 9, last_two, last_two)
    except NotImplementedError:
        raise
    except Exception as exc:
        return Verdict(
            qid,
            False,
            f"a write of positions 9..10 into a slot of max_len=11 raised {type(exc).__name__}: "
            f"{str(exc)[:80]!r}: {EXACT_FIT}",
        )
    cache = cache_class(1, 2, 11, 2, 4)
    cache.write(0, 1, 0, torch.zeros(2, 9, 4, device="cpu"), torch.zeros(2, 9, 4, device="cpu"))
    try:
        past_the_end = torch.zeros(2, 3, 4, device="cpu")  # positions 9, 10, 11 of a max_len=11 slot
        cache.write(0, 1, 9, past_the_end, past_the_end)
    except NotImplementedError:
        raise
    except Exception as exc:
        if "11" in str(exc):
            return None
        # torch's own shape mismatch also raises here; the point is an error that says what went wrong
        return Verdict(
            qid,
            False,
            f"a write past capacity raised {type(exc).__name__}: {str(exc)[:80]!r}, which does "
            "not name the capacity: check end > max_len yourself and say so (max_len=11)",
        )
    return Verdict(
        qid,
        False,
        "writing positions 9..11 into a slot of max_len=11 did not raise: a write past capacity "
        "must raise an error, never drop or overwrite anything silently",
    )


def _generation_through(cache_class, hf_model, rng: random.Random, qid: str) -> Verdict:
    hf_model = hf.float32_copy(hf_model if hf_model is not None else own_model())  # float32: bf16 rounds otherwise
    model = Transformer.from_hf(hf_model)
    arch: Arch = model.arch
    length, new_tokens = rng.randint(3, 30), rng.randint(3, 10)
    weight = model.embed.weight  # the model's dtype and device: the cache must take both (a GPU needs it there)
    prompt = random_prompt_ids(hf_model.config, length, seed=rng.randrange(2**31)).to(weight.device)
    try:
        cache = cache_class(
            arch.num_layers,
            1,
            length + new_tokens,
            arch.num_kv_heads,
            arch.head_dim,
            dtype=weight.dtype,
            device=weight.device,
        )
        got = cached_greedy_generate(model, prompt, new_tokens, cache)
    except Exception as exc:
        return Verdict(qid, False, f"generating through your cache raised {type(exc).__name__}: {exc}")
    problem = same_tokens(got, hf.greedy_generate(hf_model, prompt, new_tokens))
    if problem:
        return Verdict(qid, False, f"the model generating through your cache ({length}-token prompt): {problem}")
    return Verdict(
        qid,
        True,
        "writes and reads match the library's KVCache, in the dtype and on the device asked for; a write "
        "that fills a slot is taken and one past capacity raises; generation through your cache is "
        "token-identical to generate()",
    )


# ---------------------------------------------------------------- the cached decode loop


class TokenCountingModel:
    """The course model, counting the tokens of every forward pass (`fed`), so that a check can
    tell a cached loop (the prompt once, then one token per step) from one that recomputes."""

    def __init__(self, model: Transformer):
        self.model, self.fed = model, []

    def __call__(self, token_ids, *args, **kwargs):
        self.fed.append(int(token_ids.numel()))
        return self.model(token_ids, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name):  # arch, embed, config...: the wrapped model's own
        return getattr(self.model, name)


def grade_cached_loop(student_generate, hf_model=None, prompts: int = 5) -> Verdict:
    """The student's `(model, prompt_ids, max_new_tokens, cache)` loop vs transformers' generate(),
    then the tokens it fed each forward pass. `hf_model` (default: the check's own) is for tests."""
    qid = LOOP_QID
    hf_model = hf.float32_copy(hf_model if hf_model is not None else own_model())  # float32: bf16 rounds otherwise
    model = Transformer.from_hf(hf_model)
    device = model.embed.weight.device
    cases = []
    for rng in case_rngs(qid):
        for _ in range(prompts):
            length, new_tokens = rng.randint(1, 48), rng.randint(2, 12)
            ids = random_prompt_ids(hf_model.config, length, seed=rng.randrange(2**31)).to(device)
            cache = KVCache.for_model(model, max_seqs=1, max_len=length + new_tokens)  # exactly enough room
            cases.append(
                Case(
                    f"a {length}-token prompt with max_new_tokens={new_tokens}",
                    (TokenCountingModel(model), ids, new_tokens, cache),
                )
            )

    def reference(_model, ids, new_tokens, _cache):
        return hf.greedy_generate(hf_model, ids, new_tokens)

    verdict = grade_function(qid, student_generate, reference, cases, same_tokens, "")
    if not verdict.ok:
        return verdict
    for case in cases:
        counting, ids, new_tokens, _ = case.args
        wanted = [ids.numel()] + [1] * (new_tokens - 1)
        if counting.fed != wanted:
            return Verdict(
                qid,
                False,
                f"on {case.description}, your loop fed the model {_fed_text(counting.fed)}; a "
                f"cached loop feeds the prompt once ({ids.numel()} tokens), then one new token "
                f"per decode step: the cache holds the rest",
            )
    return Verdict(
        qid,
        True,
        f"tokens identical to transformers' generate() on {prompts} random prompts (float32), "
        f"with a cache of exactly prompt + new tokens positions, one new token per decode step",
    )


def _fed_text(fed: list[int]) -> str:
    shown = ", ".join(map(str, fed[:6])) + (", ..." if len(fed) > 6 else "")
    return f"{len(fed)} forward passes of [{shown}] tokens"


def check_cached_loop(student_generate, hf_model=None, prompts: int = 5) -> None:
    print(grade_cached_loop(student_generate, hf_model, prompts).line)


# ---------------------------------------------------------------- the memory bill


def _shipped_shapes():
    for name, spec in checked_models():
        arch = Arch.from_config(spec.config())
        yield name, arch


def grade_kv_bytes(student_kv_bytes_per_token) -> Verdict:
    qid = KV_BYTES_QID
    rngs = case_rngs(qid)
    cases = []
    for name, arch in _shipped_shapes():
        width = rngs[0].choice([1, 2, 4])
        cases.append(
            Case(
                f"{name} ({arch.num_layers} layers, {arch.num_kv_heads} KV heads, head dim "
                f"{arch.head_dim}, {width} bytes per element)",
                (arch.num_layers, arch.num_kv_heads, arch.head_dim, width),
            )
        )
    visible = len(cases) + 3
    for rng in rngs:
        for _ in range(3):
            args = (rng.randint(1, 96), rng.randint(1, 16), rng.choice([64, 80, 96, 128, 256]), rng.choice([1, 2, 4]))
            cases.append(Case("layers={}, kv_heads={}, head_dim={}, bytes={}".format(*args), args))
    return grade_function(
        qid,
        student_kv_bytes_per_token,
        memory.kv_token_bytes,
        cases,
        close_to(1e-9, unit="bytes"),
        f"KV bytes per token match on {visible} model shapes",
    )


def check_kv_bytes(student_kv_bytes_per_token) -> None:
    print(grade_kv_bytes(student_kv_bytes_per_token).line)


def grade_concurrency(student_max_concurrent_sequences) -> Verdict:
    qid = CONCURRENCY_QID
    cases = []
    for rng in case_rngs(qid):
        for name, spec in checked_models():
            if name == "tiny":
                continue
            config, dtype = spec.config(), rng.choice(["bf16", "fp16", "fp32"])
            gpu_gb, seq_len, reserve_gb = (
                rng.choice([24, 40, 48, 80, 141]),
                rng.choice([1024, 2048, 4096, 8192]),
                rng.choice([1, 2, 4]),
            )
            args = (
                gpu_gb * memory.GB,
                memory.weight_bytes(config, dtype),
                reserve_gb * memory.GB,
                memory.kv_bytes_per_token(config, dtype),
                seq_len,
            )
            cases.append(
                Case(
                    f"{name} in {dtype} on a {gpu_gb} GB card, {reserve_gb} GB reserve, {seq_len}-token sequences", args
                )
            )
    exactly_three = 15e9 + 2e9 + 3 * 28_672 * 1024
    cases += [
        Case(
            "a card whose free memory holds exactly 3 sequences (15 GB of weights, 2 GB reserve, "
            "28,672 bytes per token, 1024-token sequences)",
            (exactly_three, 15e9, 2e9, 28_672, 1024),
        ),
        Case("a card with nothing left (16 GB card, 14 GB of weights, 2 GB reserve)", (16e9, 14e9, 2e9, 28_672, 1024)),
        Case(
            "a card too small for the weights (16 GB card, 15 GB of weights, 2 GB reserve)",
            (16e9, 15e9, 2e9, 28_672, 1024),
        ),
    ]
    visible = len(CHECKED_MODELS) - 1 + 3
    return grade_function(
        qid,
        student_max_concurrent_sequences,
        memory.sequences_that_fit,
        cases,
        _whole_sequences,
        f"whole sequences that fit match on {visible} model/card combinations",
    )


def check_concurrency(student_max_concurrent_sequences) -> None:
    print(grade_concurrency(student_max_concurrent_sequences).line)


def _whole_sequences(got, expected) -> str | None:
    got, problem = as_number(got, what="a whole number of sequences")
    if problem:
        return problem
    if got != int(got):
        return f"got {got:,.3f} sequences: a fraction of a sequence cannot run, round down to whole sequences"
    if got < 0:
        return f"got {got:,.0f} sequences: when nothing is left for the cache, no sequence fits: 0, never fewer"
    if got != expected:
        return f"got {got:,.0f} sequences, expected {expected:,}"
    return None
