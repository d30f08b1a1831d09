"""IO accounting for attention: how many bytes must cross between slow memory and the chip.

The FlashAttention paper (Dao et al., 2022, Theorem 2) counts accesses to HBM (GPU main memory)
for one head with sequence length N, head dimension d and an on-chip memory (SRAM) of M elements,
d <= M <= Nd:
  standard attention:  Theta(N d + N^2)
  FlashAttention:      Theta(N^2 d^2 / M)
Here the same counts are written out exactly, in bytes, for one (batch, head), so that they can be
set next to measured times. Assumptions, stated once:
- every tensor element is `bytes_per_element` wide (2 for fp16/bf16, 4 for fp32), the softmax
  statistics (m, l) included;
- "standard attention" is the paper's Algorithm 0: S = QK^T written to HBM, read back for the
  softmax, P written, read back for PV; the causal mask is applied inside the softmax step;
- a tile loaded on chip is used fully before it is evicted (that is what the block sizes ensure),
  and nothing is cached between loop iterations beyond what the algorithm keeps on chip;
- the multiplication by V, the scaling and the masking add no HBM traffic of their own.
On a CPU the same roles are played by DRAM (slow) and the L2 cache (on chip, per core); the
hardware caches automatically, so these counts are an idealization there."""

import math


def score_matrix_bytes(batch: int, heads: int, seq_len: int, bytes_per_element: int) -> int:
    """Memory of ONE [seq_len, seq_len] matrix per (batch, head): the S (or P) that standard attention stores."""
    return batch * heads * seq_len * seq_len * bytes_per_element


def standard_attention_hbm_bytes(seq_len: int, head_dim: int, bytes_per_element: int) -> int:
    """Algorithm 0, one head: read Q, K, write S; read S, write P; read P, V, write O.

    = (2Nd + N^2) + (N^2 + N^2) + (N^2 + Nd + Nd) = 4Nd + 4N^2 elements."""
    n, d = seq_len, head_dim
    return bytes_per_element * (4 * n * d + 4 * n * n)


def flash_block_sizes(sram_elements: int, head_dim: int) -> tuple[int, int]:
    """The paper's block sizes (B_r, B_c) = (min(ceil(M/4d), d), ceil(M/4d)): Q_i, K_j, V_j, O_i fit in M."""
    block_cols = math.ceil(sram_elements / (4 * head_dim))
    return min(block_cols, head_dim), block_cols


def flash_attention_hbm_bytes(seq_len: int, head_dim: int, sram_elements: int, bytes_per_element: int) -> int:
    """Algorithm 1 (FlashAttention, 2022), one head, K/V blocks in the outer loop.

    Initialize O, l, m in HBM (Nd + 2N); read K and V once (2Nd); then for each of the
    T_c = ceil(N / B_c) outer steps, the inner loop reads all of Q, O, l, m (2Nd + 2N) and writes
    O, l, m back (Nd + 2N). Total 3Nd + 2N + T_c (3Nd + 4N) elements. Since T_c ~ 4Nd/M, this is
    Theta(N^2 d^2 / M): a larger on-chip memory means fewer passes over Q and O."""
    n, d = seq_len, head_dim
    _, block_cols = flash_block_sizes(sram_elements, d)
    outer_steps = math.ceil(n / block_cols)
    return bytes_per_element * (3 * n * d + 2 * n + outer_steps * (3 * n * d + 4 * n))


def standard_over_flash_limit(head_dim: int, sram_elements: int) -> float:
    """What `standard_attention_hbm_bytes / flash_attention_hbm_bytes` tends to as N grows.

    Standard attention moves about 4N^2 elements; Algorithm 1 about T_c (3Nd + 4N) with
    T_c = N / B_c, so the ratio tends to 4 B_c / (3d + 4): about M / (3 d^2), since B_c = ceil(M / 4d).
    Theorem 2's Theta(N d + N^2) against Theta(N^2 d^2 / M) gives the scaling, M / d^2; the exact
    count's constants make the saving about three times smaller than that."""
    _, block_cols = flash_block_sizes(sram_elements, head_dim)
    return 4 * block_cols / (3 * head_dim + 4)


def tiled_hbm_bytes(
    seq_len: int, head_dim: int, block_q: int, block_k: int, bytes_per_element: int, causal: bool = False
) -> int:
    """The loop of `infer.attention.tiled_attention` and the Triton kernel (query blocks outside,
    FlashAttention-2's order), one head: each query block reads its Q tile once, streams the K and
    V tiles it needs, and writes its O tile once. K/V are read once per query block, so about
    ceil(N / block_q) times in all (half as often with the causal skip)."""
    n, d = seq_len, head_dim
    elements = 0
    for q_start in range(0, n, block_q):
        rows = min(block_q, n - q_start)
        keys_needed = min(n, q_start + rows) if causal else n
        keys_read = min(n, math.ceil(keys_needed / block_k) * block_k)  # whole tiles, clipped at N
        elements += rows * d + 2 * keys_read * d + rows * d  # Q_i in, K and V tiles in, O_i out
    return bytes_per_element * elements


def standard_over_tiled_limit(head_dim: int, block_q: int, causal: bool = False) -> float:
    """What `standard_attention_hbm_bytes / tiled_hbm_bytes` tends to as N grows: a constant.

    Standard attention moves about 4N^2 elements; the tiled loop reads K and V (2Nd) once per
    query block, N / B_r times: 2N^2 d / B_r, half that with the causal skip. The ratio is 2B_r/d,
    or 4B_r/d causal, whatever N is: the saving does not grow with the sequence, only the O(Nd)
    terms fade, so at short lengths the ratio is below its limit."""
    return (4 if causal else 2) * block_q / head_dim


def io_time_ms(bytes_moved: float, bandwidth_bytes_per_s: float) -> float:
    """The IO lower bound on time: bytes / bandwidth, in ms (compute and overheads ignored)."""
    return bytes_moved / bandwidth_bytes_per_s * 1e3


def on_chip_bytes(device: str) -> tuple[int, str]:
    """The fast memory one tile must fit in, and where the number came from.

    CUDA: shared memory per streaming multiprocessor (the paper's SRAM). CPU: the L2 cache of
    one core, read from Linux's sysfs (1 MiB assumed when it cannot be read)."""
    import torch

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        size = getattr(props, "shared_memory_per_multiprocessor", 0) or 228 * 1024
        return size, f"shared memory per SM of {props.name}"
    try:
        from pathlib import Path

        for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
            if (index / "level").read_text().strip() == "2":
                text = (index / "size").read_text().strip().upper()
                scale = {"K": 1024, "M": 2**20}.get(text[-1], 1)
                return int(text.rstrip("KM")) * scale, "L2 cache of one CPU core (sysfs)"
    except (OSError, ValueError):
        pass
    return 2**20, "assumed 1 MiB L2 cache (could not read sysfs)"
