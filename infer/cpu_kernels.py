"""The course's compiled CPU kernel (week 09): decode attention that reads the block KV cache in place.

`in_place_decode_attention()` builds `infer/csrc/paged_decode_attention.cpp` with PyTorch's C++
extension builder the first time a process asks for it. The first build on a machine takes about
25 s; PyTorch keeps it in its extension cache (`~/.cache/torch_extensions`, or
`TORCH_EXTENSIONS_DIR`), so later processes load it in a moment. It returns the kernel, or raises
`KernelUnavailable` saying why (no C++ compiler, a cache it cannot write, a GPU device). The
engine uses it only when asked: `Engine(..., decode_attention="in_place")`.

`-march=native` lets the compiler use this CPU's vector instructions; the build is made on the
machine that runs it, so it never meets another CPU.
"""

import functools
import shutil
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("csrc") / "paged_decode_attention.cpp"
COMPILER_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp-simd"]


class KernelUnavailable(RuntimeError):
    """The compiled kernel cannot be had here; the message says why."""


@functools.cache
def _build():
    """The compiled module, or the reason there is none (kept, so a failed build is not retried)."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        return "no C++ compiler (c++ or g++) on the PATH"
    from torch.utils.cpp_extension import load

    try:
        return load(
            name="infer_paged_decode_attention", sources=[str(SOURCE)], extra_cflags=COMPILER_FLAGS, verbose=False
        )
    except Exception as error:  # the compiler's or the cache's own message says what went wrong
        return f"building {SOURCE.name} failed: {type(error).__name__}: {error}"


def in_place_decode_attention(device: torch.device | str = "cpu"):
    """`kernel(q, k_cache, v_cache, block_tables, lengths, scale) -> out`, as the .cpp file describes."""
    if torch.device(device).type != "cpu":
        raise KernelUnavailable(
            f"the in-place decode kernel is a CPU kernel; on {device} the engine's decode attention is "
            "PyTorch's scaled_dot_product_attention (week 09's GPU section)"
        )
    built = _build()
    if isinstance(built, str):
        raise KernelUnavailable(built)
    return built.paged_decode_attention
