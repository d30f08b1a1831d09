"""Attention, five ways, and one float64 reference to check them all against.

Every function takes q, k, v of shape [batch, heads, seq_len, head_dim] (self-attention: the
same length for queries and keys) and returns [batch, heads, seq_len, head_dim]. With
`causal=True`, query i sees keys 0..i only.

- `reference_attention`: softmax(QK^T / sqrt(d)) V in float64, the ground truth.
- `naive_attention`: the same formula in the input dtype; it materializes the full
  [seq_len, seq_len] score matrix per head (the "standard attention" of the FlashAttention paper).
- `tiled_attention`: the FlashAttention forward algorithm in plain PyTorch: blocks of K/V, a
  running max and running sum per query row (the online softmax), never more than one
  [block_q, block_k] tile of scores at a time.
- `sdpa_attention`: PyTorch's `scaled_dot_product_attention` with ONE backend chosen explicitly.
- `flash_attn_package`: the `flash-attn` package's `flash_attn_func` (CUDA, fp16/bf16).
- `infer.attention_triton.triton_attention`: the tiled algorithm as a Triton kernel (CUDA).

`IMPLEMENTATIONS` lists them with an `available(device, dtype, head_dim)` that says why one
cannot run here, so a notebook loops over all of them and prints one skip line per missing one."""

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from infer.availability import YES, Availability, error_line
from infer.profiles import dtype_name

# ---------------------------------------------------------------- reference and naive


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Exact attention in float64 (returned in float64): what every other version is measured against."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        scores = scores.masked_fill(causal_mask(q.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def causal_mask(seq_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[seq_len, seq_len] booleans, True where a key lies in a query's future (to be masked out)."""
    return torch.ones(seq_len, seq_len, dtype=torch.bool, device=device).triu(diagonal=1)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Standard attention: S = QK^T/sqrt(d), P = softmax(S), O = PV, each a full tensor in memory.

    S and P are [batch, heads, seq_len, seq_len]: memory grows with the square of the length.
    The softmax runs in float32 even for bf16/fp16 inputs (as `transformers`' eager attention
    does): exponentials of rounded scores would otherwise lose too many digits."""
    softmax_dtype = torch.promote_types(q.dtype, torch.float32)  # float32, or float64 for float64 inputs
    scores = (q @ k.transpose(-2, -1)).to(softmax_dtype) / math.sqrt(q.shape[-1])  # S: N x N per head
    if causal:
        scores.masked_fill_(causal_mask(q.shape[-2], q.device), float("-inf"))
    probabilities = torch.softmax(scores, dim=-1).to(v.dtype)  # P: another N x N per head
    return probabilities @ v


# ---------------------------------------------------------------- the online softmax


class SoftmaxState(NamedTuple):
    """What one query row needs to remember about the keys it has seen so far:

    max: the largest score seen (m), sum: sum of exp(score - m) (l),
    acc: sum of exp(score - m) * value (an unnormalized output row).
    The attention output is acc / sum; the state of a union of key blocks follows from the
    states of the blocks (`merge_states`), so keys can be processed one block at a time."""

    max: torch.Tensor  # [..., rows, 1]
    sum: torch.Tensor  # [..., rows, 1]
    acc: torch.Tensor  # [..., rows, head_dim]


def _exp_minus(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """exp(x - m), with exp(-inf - (-inf)) taken as 0: a row that has seen no unmasked key yet."""
    return torch.exp(x - torch.where(torch.isinf(m), torch.zeros_like(m), m))


def block_state(scores: torch.Tensor, values: torch.Tensor) -> SoftmaxState:
    """The state of one block of keys: `scores` [..., rows, keys] (masked ones -inf), `values` [..., keys, d]."""
    row_max = scores.amax(dim=-1, keepdim=True)
    weights = _exp_minus(scores, row_max)  # every entry <= 1: no overflow, whatever the scores
    acc = (weights.to(values.dtype) @ values).to(scores.dtype)  # kernels multiply in the input dtype
    return SoftmaxState(row_max, weights.sum(dim=-1, keepdim=True), acc)


def merge_states(a: SoftmaxState, b: SoftmaxState) -> SoftmaxState:
    """The online-softmax identity: rescale both states to the larger max, then add.

    With m = max(m_a, m_b):  l = e^(m_a - m) l_a + e^(m_b - m) l_b,
                             acc = e^(m_a - m) acc_a + e^(m_b - m) acc_b.
    The result equals the state computed from both blocks at once, exactly (up to rounding)."""
    new_max = torch.maximum(a.max, b.max)
    scale_a, scale_b = _exp_minus(a.max, new_max), _exp_minus(b.max, new_max)
    return SoftmaxState(new_max, scale_a * a.sum + scale_b * b.sum, scale_a * a.acc + scale_b * b.acc)


def empty_state(rows_like: torch.Tensor, dtype: torch.dtype) -> SoftmaxState:
    """The state of a row that has seen no key: max -inf, sum 0, acc 0."""
    shape = rows_like.shape[:-1]
    return SoftmaxState(
        torch.full((*shape, 1), float("-inf"), dtype=dtype, device=rows_like.device),
        torch.zeros((*shape, 1), dtype=dtype, device=rows_like.device),
        torch.zeros((*shape, rows_like.shape[-1]), dtype=dtype, device=rows_like.device),
    )


def finalize(state: SoftmaxState) -> torch.Tensor:
    return state.acc / state.sum


# ---------------------------------------------------------------- tiled (FlashAttention forward)


def tiled_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, block_q: int = 256, block_k: int = 256
) -> torch.Tensor:
    """The FlashAttention forward pass, one tile at a time, in plain PyTorch.

    For each block of `block_q` query rows (a GPU kernel runs these blocks in parallel):
      keep a running state (max, sum, acc) per row, starting empty;
      for each block of `block_k` keys and values:
        S_ij = Q_i K_j^T / sqrt(d)               a [block_q, block_k] tile, never [N, N]
        state = merge(state, state of S_ij, V_j)  the online softmax: rescale, then add
      O_i = acc / sum
    With `causal=True`, key blocks entirely in the future of the query block are skipped (about
    half of them), and only tiles that cross the diagonal need a mask. Statistics are kept in
    float32 (float64 for float64 inputs), as the kernels keep them in registers.

    This is the loop order of FlashAttention-2 (query blocks outside). The 2022 paper's
    Algorithm 1 puts the K/V loop outside and re-reads/writes O, l, m per block; the arithmetic
    is the same."""
    seq_len, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
    stat_dtype = torch.promote_types(q.dtype, torch.float32)
    out = torch.empty_like(q)
    for q_start in range(0, seq_len, block_q):
        q_block = q[..., q_start : q_start + block_q, :].to(stat_dtype)
        rows = q_block.shape[-2]
        state = empty_state(q_block, stat_dtype)
        keys_seen = min(seq_len, q_start + rows) if causal else seq_len  # later keys are all in the future
        for k_start in range(0, keys_seen, block_k):
            k_block = k[..., k_start : k_start + block_k, :].to(stat_dtype)
            scores = q_block @ k_block.transpose(-2, -1) * scale
            if causal and k_start + k_block.shape[-2] - 1 > q_start:  # this tile crosses the diagonal
                query_pos = torch.arange(q_start, q_start + rows, device=q.device)[:, None]
                key_pos = torch.arange(k_start, k_start + k_block.shape[-2], device=q.device)[None, :]
                scores = scores.masked_fill(key_pos > query_pos, float("-inf"))
            state = merge_states(state, block_state(scores, v[..., k_start : k_start + block_k, :]))
        out[..., q_start : q_start + rows, :] = finalize(state).to(q.dtype)
    return out


# ---------------------------------------------------------------- library kernels


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, *, backend: SDPBackend
) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention`, restricted to exactly one backend.

    Without `sdpa_kernel`, PyTorch silently picks a backend; restricted to one, it raises a
    RuntimeError when that backend cannot run these inputs, instead of falling back."""
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def flash_attn_package(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """The `flash-attn` package (Dao-AILab). Its layout is [batch, seq_len, heads, head_dim]."""
    from flash_attn import flash_attn_func

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=causal)
    return out.transpose(1, 2)


# ---------------------------------------------------------------- the registry


AvailableFn = Callable[[str, torch.dtype, int], Availability]


@dataclass(frozen=True)
class AttentionImpl:
    name: str
    fn: Callable[..., torch.Tensor]  # fn(q, k, v, causal=...) -> out
    description: str
    available: AvailableFn  # available(device_type, dtype, head_dim)
    materializes_scores: bool  # holds a full [N, N] matrix per head (subject to the CPU memory budget)

    def __call__(self, q, k, v, causal: bool = False) -> torch.Tensor:
        return self.fn(q, k, v, causal=causal)


def _always(device: str, dtype: torch.dtype, head_dim: int) -> Availability:
    return YES


@functools.cache
def _probe_sdpa(backend_name: str, device: str, dtype: torch.dtype, head_dim: int) -> Availability:
    """Run the backend once on a tiny input: the only reliable way to learn whether it has a kernel
    for this device, dtype and head size (its rules differ by GPU generation and version)."""
    if device == "cuda" and not torch.cuda.is_available():
        return Availability(False, "no CUDA device")
    q = torch.randn(1, 1, 16, head_dim, device=device, dtype=dtype)
    try:
        sdpa_attention(q, q, q, causal=True, backend=getattr(SDPBackend, backend_name))
    except RuntimeError as exc:
        return Availability(
            False,
            f"PyTorch has no {backend_name} kernel for {device}/{dtype_name(dtype)}/"
            f"d={head_dim} ({error_line(exc, 90)})",
        )
    return YES


def _sdpa_available(backend_name: str, cuda_only: bool) -> AvailableFn:
    def available(device: str, dtype: torch.dtype, head_dim: int) -> Availability:
        if cuda_only and device != "cuda":
            return Availability(False, f"SDPBackend.{backend_name} exists on CUDA only (device here: {device})")
        return _probe_sdpa(backend_name, device, dtype, head_dim)

    return available


@functools.cache
def flash_attn_import_problem() -> str | None:
    """Why `flash_attn_func` cannot be imported here, or None when it can. Finding the package is
    not enough: a wheel built for another torch or CUDA version installs fine and then fails to
    load its compiled library (ImportError "undefined symbol", or OSError)."""
    try:
        from flash_attn import flash_attn_func  # noqa: F401
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "flash_attn":
            return "the flash-attn package is not installed (see environment.yml)"
        return f"the flash-attn package is installed but does not import ({error_line(exc)})"
    except OSError as exc:
        return f"the flash-attn package is installed but its CUDA library does not load ({error_line(exc)})"
    return None


def _flash_attn_available(device: str, dtype: torch.dtype, head_dim: int) -> Availability:
    if device != "cuda":
        return Availability(False, f"flash-attn runs on CUDA GPUs only (device here: {device})")
    problem = flash_attn_import_problem()
    if problem:
        return Availability(False, problem)
    if dtype not in (torch.float16, torch.bfloat16):
        return Availability(False, f"flash-attn supports fp16 and bf16 only, not {dtype_name(dtype)}")
    return YES


def _triton_available(device: str, dtype: torch.dtype, head_dim: int) -> Availability:
    from infer import attention_triton

    return attention_triton.available(device, dtype, head_dim)


def _triton_fn(q, k, v, causal=False):
    from infer.attention_triton import triton_attention

    return triton_attention(q, k, v, causal=causal)


IMPLEMENTATIONS: dict[str, AttentionImpl] = {
    impl.name: impl
    for impl in [
        AttentionImpl("naive", naive_attention, "full S and P matrices (standard attention)", _always, True),
        AttentionImpl("tiled", tiled_attention, "hand-written online-softmax tiles, plain PyTorch", _always, False),
        AttentionImpl(
            "sdpa-math",
            functools.partial(sdpa_attention, backend=SDPBackend.MATH),
            "SDPA, MATH backend (composite ops, materializes S)",
            _sdpa_available("MATH", False),
            True,
        ),
        AttentionImpl(
            "sdpa-flash",
            functools.partial(sdpa_attention, backend=SDPBackend.FLASH_ATTENTION),
            "SDPA, FLASH_ATTENTION backend (on CPU: the fused CPU kernel)",
            _sdpa_available("FLASH_ATTENTION", False),
            False,
        ),
        AttentionImpl(
            "sdpa-efficient",
            functools.partial(sdpa_attention, backend=SDPBackend.EFFICIENT_ATTENTION),
            "SDPA, EFFICIENT_ATTENTION backend (memory-efficient kernel)",
            _sdpa_available("EFFICIENT_ATTENTION", True),
            False,
        ),
        AttentionImpl(
            "sdpa-cudnn",
            functools.partial(sdpa_attention, backend=SDPBackend.CUDNN_ATTENTION),
            "SDPA, CUDNN_ATTENTION backend",
            _sdpa_available("CUDNN_ATTENTION", True),
            False,
        ),
        AttentionImpl(
            "flash-attn", flash_attn_package, "the flash-attn package's flash_attn_func", _flash_attn_available, False
        ),
        AttentionImpl(
            "triton",
            _triton_fn,
            "the tiled algorithm as a Triton kernel (infer/attention_triton.py)",
            _triton_available,
            False,
        ),
    ]
}


def available_implementations(
    device: str, dtype: torch.dtype, head_dim: int, report: Callable[[str], None] | None = print
) -> dict[str, AttentionImpl]:
    """The implementations that can run here; `report` gets one line per one that cannot."""
    usable = {}
    for name, impl in IMPLEMENTATIONS.items():
        verdict = impl.available(torch.device(device).type, dtype, head_dim)
        if verdict:
            usable[name] = impl
        elif report is not None:
            report(f"skipped {name}: {verdict.reason}")
    return usable


# ---------------------------------------------------------------- exactness


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| (Frobenius norms, in float64): one number for the whole output."""
    reference = reference.double()
    return ((out.double() - reference).norm() / reference.norm()).item()


TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def random_qkv(
    batch: int,
    heads: int,
    seq_len: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fresh standard-normal q, k, v (seeded when `seed` is given)."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed(seed if seed is not None else torch.seed() % 2**63)
    shape = (batch, heads, seq_len, head_dim)
    # drawn on the host, where the seeded generator lives, so every device sees the same values
    return tuple(torch.randn(shape, generator=generator, device="cpu").to(device=device, dtype=dtype) for _ in range(3))


@dataclass(frozen=True)
class ExactnessResult:
    name: str
    dtype: torch.dtype
    causal: bool
    shape: tuple[int, ...]
    error: float

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.dtype]

    @property
    def ok(self) -> bool:
        return self.error <= self.tolerance

    @property
    def line(self) -> str:
        mark = "✅" if self.ok else "❌"
        return (
            f"{mark} {self.name:<15} {dtype_name(self.dtype):<9} {'causal' if self.causal else 'full':<6} "
            f"shape {self.shape}: relative error {self.error:.1e} (tolerance {self.tolerance:.0e})"
        )


def check_exactness(
    impl: AttentionImpl, *, dtype: torch.dtype, causal: bool, shape=(2, 3, 100, 64), device: str = "cpu"
) -> ExactnessResult:
    """Run `impl` on fresh random inputs and compare it with the float64 reference of the SAME
    (already rounded) inputs, so only the implementation's own rounding counts."""
    q, k, v = random_qkv(*shape, dtype=dtype, device=device)
    out = impl(q, k, v, causal=causal)
    error = relative_error(out, reference_attention(q, k, v, causal=causal))
    return ExactnessResult(impl.name, dtype, causal, tuple(shape), error)
