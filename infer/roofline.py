"""Arithmetic intensity and the roofline: why prefill is compute-bound and decode memory-bound.

A kernel that does F floating-point operations while moving B bytes to and from memory has
arithmetic intensity I = F / B (FLOP/byte). A device with peak compute P (FLOP/s) and memory
bandwidth W (byte/s) can reach at most min(P, I * W): the roofline. Below the ridge point
I = P / W, memory is the bottleneck; above it, compute.

One forward pass over m new tokens multiplies every weight matrix by m vectors: about 2m FLOPs
per weight, while each weight is read once however large m is. But the activations move too:
every linear layer reads an m-row input and writes an m-row output, and that traffic grows with
m as fast as the FLOPs do. So a matmul's intensity rises like 2m/b while the weights dominate the
bytes, then levels off at 2kn / (b (k + n)) once the activations do (`matmul_intensity_limit`).
Attention does not level off: its FLOPs grow with the square of the prompt, while a fused kernel
moves bytes that grow only linearly (queries, output, K and V). So a prefill's intensity keeps
rising with the prompt as attention's share of the FLOPs grows: for a 1.5B model in bf16,
`forward_cost` gives about 700 FLOP/byte at 2048 tokens and 1150 at 8192, right of an H100 SXM's
ridge (about 295 FLOP/byte). A decode step (m = 1) sits at about 1 FLOP/byte in bf16, limited by
how fast the weights stream from memory."""

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
import torch
from transformers import PretrainedConfig

from infer.memory import kv_token_bytes
from infer.model import Arch
from infer.profiles import dtype_name
from infer.timing import benchmark


def matmul_arithmetic_intensity(m: int, k: int, n: int, bytes_per_element: int) -> float:
    """FLOP/byte of C[m,n] = A[m,k] @ B[k,n]: 2mkn FLOPs; A and B read once, C written once."""
    return 2 * m * k * n / (bytes_per_element * (m * k + k * n + m * n))


def matmul_intensity_limit(k: int, n: int, bytes_per_element: int) -> float:
    """The ceiling of `matmul_arithmetic_intensity` as the rows m grow: 2kn / (b (k + n)).

    Dividing numerator and denominator by m: 2kn / (b (k + n + kn/m)). The weight term kn/m fades,
    and what is left is the cost of reading each row's k inputs and writing its n outputs."""
    return 2 * k * n / (bytes_per_element * (k + n))


@dataclass(frozen=True)
class ForwardCost:
    """FLOPs of one forward pass, and the bytes it must move at least, split by what they carry."""

    flops: float
    weight_bytes: float  # every weight read once
    kv_bytes: float  # attention reads the cached keys and values (context and new tokens)
    linear_activation_bytes: float  # every linear layer reads its input rows and writes its output rows
    attention_activation_bytes: float  # attention reads the queries and writes its output

    @property
    def bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.linear_activation_bytes + self.attention_activation_bytes

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def linear_parameters(config: PretrainedConfig) -> int:
    """Weights that multiply every token: attention projections, MLP, and the output head."""
    a = Arch.from_config(config)
    return a.num_layers * _layer_linear_parameters(a) + a.hidden_size * a.vocab_size


def _layer_linear_parameters(a: Arch) -> int:
    q_and_o = 2 * a.hidden_size * a.num_heads * a.head_dim
    k_and_v = 2 * a.hidden_size * a.num_kv_heads * a.head_dim
    mlp = 3 * a.hidden_size * a.intermediate_size  # gate, up and down projections (SwiGLU)
    return q_and_o + k_and_v + mlp


def _layer_linear_widths(a: Arch) -> int:
    """Elements one token's row brings into and out of one layer's linears: sum of (inputs + outputs)."""
    q_width, kv_width = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    projections = (a.hidden_size + q_width) + 2 * (a.hidden_size + kv_width) + (q_width + a.hidden_size)
    mlp = 2 * (a.hidden_size + a.intermediate_size) + (a.intermediate_size + a.hidden_size)
    return projections + mlp


def forward_cost(
    config: PretrainedConfig,
    new_tokens: int,
    context_tokens: int,
    bytes_per_element: int,
    *,
    logits_rows: int | None = None,
) -> ForwardCost:
    """FLOPs and bytes moved by one forward pass (batch 1) over `new_tokens` tokens that attend
    to `context_tokens` earlier ones held in a KV cache.

    `logits_rows` is how many positions go through the output head: all new tokens by default (a
    plain forward pass), 1 for a prefill as servers run it (only the last position's logits pick
    the first token). Bytes count the weights, the KV cache, and the activation rows that each
    linear layer and attention read and write, as a fused attention kernel would (no N x N
    matrix). Elementwise steps (norms, rotary, the SwiGLU product, residual adds) are left out:
    so the bytes are a lower bound and the intensity an upper bound."""
    a = Arch.from_config(config)
    rows = new_tokens if logits_rows is None else logits_rows
    if not 0 <= rows <= new_tokens:
        raise ValueError(f"logits_rows must be between 0 and new_tokens ({new_tokens}), got {rows}")
    head = a.hidden_size * a.vocab_size
    attended = context_tokens + (new_tokens + 1) / 2  # on average, with the causal mask
    attention_flops = 4 * a.num_layers * a.num_heads * a.head_dim * new_tokens * attended  # QK^T and PV
    linear_flops = 2 * a.num_layers * _layer_linear_parameters(a) * new_tokens + 2 * head * rows
    kv_bytes_per_token = kv_token_bytes(a.num_layers, a.num_kv_heads, a.head_dim, bytes_per_element)
    linear_rows = a.num_layers * _layer_linear_widths(a) * new_tokens + (a.hidden_size + a.vocab_size) * rows
    return ForwardCost(
        flops=linear_flops + attention_flops,
        weight_bytes=linear_parameters(config) * bytes_per_element,
        kv_bytes=kv_bytes_per_token * (context_tokens + new_tokens),
        linear_activation_bytes=linear_rows * bytes_per_element,
        attention_activation_bytes=2 * a.num_layers * a.num_heads * a.head_dim * new_tokens * bytes_per_element,
    )


def measure_matmul_flops(device: str, dtype: torch.dtype, size: int, repeats: int = 5) -> float:
    """Achieved FLOP/s of a square matmul: the practical compute roof of this device."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    timing = benchmark(lambda: a @ b, device=device, warmup=2, repeats=repeats)
    return 2 * size**3 / (timing.median_ms / 1e3)


def measure_copy_bandwidth(device: str, megabytes: int, repeats: int = 5) -> float:
    """Achieved bytes/s of a large device-to-device copy (each byte read once and written once)."""
    source = torch.empty(megabytes * 2**20, dtype=torch.uint8, device=device).random_()
    target = torch.empty_like(source)
    timing = benchmark(lambda: target.copy_(source), device=device, warmup=2, repeats=repeats)
    return 2 * source.numel() / (timing.median_ms / 1e3)


def plot_roofline(ax: plt.Axes, peak_flops: float, bandwidth: float, points: dict[str, tuple[float, float]]) -> None:
    """Draw the roofline min(P, I*W) and place each (intensity, achieved FLOP/s) point on it."""
    ridge = peak_flops / bandwidth
    intensities = [i for i, _ in points.values()]
    x = np.logspace(np.log10(min(intensities + [ridge]) / 4), np.log10(max(intensities + [ridge]) * 4), 200)
    ax.loglog(x, np.minimum(peak_flops, x * bandwidth), color="black", label="roofline (measured)")
    ax.axvline(ridge, color="0.6", linestyle=":", label=f"ridge point: {ridge:.1f} FLOP/byte")
    for label, (intensity, achieved) in points.items():
        ax.scatter([intensity], [achieved], s=60, zorder=3, label=f"{label}: {intensity:.1f} FLOP/byte")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved FLOP/s")
    # Beside the axes, not inside: points can land anywhere under the roof.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    ax.figure.subplots_adjust(right=0.62)
    ax.grid(True, which="both", alpha=0.3)


def plot_matmul_saturation(
    ax: plt.Axes, weights: dict[str, tuple[int, int]], bytes_per_element: int, max_rows: int = 65536
) -> None:
    """Intensity of m activation rows times each [k, n] weight, against m: it follows 2m/b while the
    weight dominates the bytes, then flattens at its ceiling 2kn / (b (k + n)) (dashed)."""
    rows = np.unique(np.logspace(0, np.log10(max_rows), 200).astype(int))
    ax.loglog(rows, 2 * rows / bytes_per_element, color="0.6", linestyle=":", label="2m/b (weights only)")
    for i, (label, (k, n)) in enumerate(weights.items()):
        ax.loglog(
            rows,
            [matmul_arithmetic_intensity(m, k, n, bytes_per_element) for m in rows],
            color=f"C{i}",
            label=f"{label}: [m, {k}] @ [{k}, {n}]",
        )
        ceiling = matmul_intensity_limit(k, n, bytes_per_element)
        ax.axhline(
            ceiling, color=f"C{i}", linestyle="--", linewidth=0.8, label=f"ceiling 2kn/(b(k+n)) = {ceiling:,.0f}"
        )
    ax.set_ylim(top=max(matmul_intensity_limit(k, n, bytes_per_element) for k, n in weights.values()) * 3)
    ax.set_xlabel("activation rows m (tokens in the pass)")
    ax.set_ylabel("arithmetic intensity (FLOP/byte)")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


# ---------------------------------------------------------------- this device's roofline, measured


@dataclass(frozen=True)
class RooflineProbe:
    """How to measure a profile's roofline: one square matmul for the compute roof, one copy for bandwidth."""

    matmul_size: int
    matmul_dtype: torch.dtype
    copy_megabytes: int  # large enough to spill out of the CPU's last-level cache
    repeats: int


ROOFLINE_PROBES = {
    "cpu": RooflineProbe(matmul_size=1024, matmul_dtype=torch.float32, copy_megabytes=64, repeats=5),
    "gpu": RooflineProbe(matmul_size=8192, matmul_dtype=torch.bfloat16, copy_megabytes=1024, repeats=10),
    "gpu-check": RooflineProbe(matmul_size=8192, matmul_dtype=torch.bfloat16, copy_megabytes=1024, repeats=10),  # < 1 s
    # The gpu probe's bf16 matmul at a size a CPU does in milliseconds (the gpu-dryrun stand-in).
    "gpu-dryrun": RooflineProbe(matmul_size=256, matmul_dtype=torch.bfloat16, copy_megabytes=16, repeats=3),
}


@dataclass(frozen=True)
class MeasuredRoofline:
    peak_flops: float  # FLOP/s, achieved by a large matmul
    bandwidth: float  # byte/s, achieved by a large copy
    probe: RooflineProbe

    @property
    def ridge_point(self) -> float:
        """The intensity (FLOP/byte) where the two roofs meet: below it, memory is the bottleneck."""
        return self.peak_flops / self.bandwidth

    def attainable(self, intensity: float) -> float:
        """The roofline itself: the most FLOP/s any kernel of this intensity can reach here."""
        return min(self.peak_flops, intensity * self.bandwidth)

    def __str__(self) -> str:
        dtype = dtype_name(self.probe.matmul_dtype)
        return (
            f"matmul {self.probe.matmul_size}x{self.probe.matmul_size} {dtype}: {self.peak_flops / 1e9:,.1f} GFLOP/s | "
            f"copy {self.probe.copy_megabytes} MiB: {self.bandwidth / 1e9:,.1f} GB/s | "
            f"ridge point: {self.ridge_point:.1f} FLOP/byte"
        )


def measure_roofline(profile) -> MeasuredRoofline:
    """Measure the compute and bandwidth roofs of the profile's device, at the profile's sizes."""
    if profile.name not in ROOFLINE_PROBES:
        raise ValueError(f"No roofline probe for profile {profile.name!r}; known: {', '.join(ROOFLINE_PROBES)}")
    probe = ROOFLINE_PROBES[profile.name]
    peak = measure_matmul_flops(profile.device, probe.matmul_dtype, probe.matmul_size, repeats=probe.repeats)
    bandwidth = measure_copy_bandwidth(profile.device, probe.copy_megabytes, repeats=probe.repeats)
    return MeasuredRoofline(peak_flops=peak, bandwidth=bandwidth, probe=probe)


def achieved_point(cost: ForwardCost, median_ms: float) -> tuple[float, float]:
    """(intensity in FLOP/byte, achieved FLOP/s) of a forward pass of `cost` that took `median_ms`."""
    if median_ms <= 0:
        raise ValueError(f"a measured time must be positive, got {median_ms} ms")
    return cost.intensity, cost.flops / (median_ms / 1e3)
