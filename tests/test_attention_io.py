"""The IO and memory formulas, checked on values worked out by hand."""

import math

import pytest

from infer.attention_io import (
    flash_attention_hbm_bytes,
    flash_block_sizes,
    io_time_ms,
    score_matrix_bytes,
    standard_attention_hbm_bytes,
    standard_over_flash_limit,
    standard_over_tiled_limit,
    tiled_hbm_bytes,
)


def test_score_matrix_bytes():
    assert score_matrix_bytes(1, 1, 1024, 4) == 4 * 2**20
    assert score_matrix_bytes(1, 32, 32768, 2) == 32 * 32768**2 * 2  # 68.7 GB: one layer of a 32-head model
    assert score_matrix_bytes(2, 3, 10, 1) == 600


def test_standard_attention_counts_four_passes_over_the_n_by_n_matrix():
    # N=1024, d=64, fp16: 4*N*d + 4*N^2 elements.
    assert standard_attention_hbm_bytes(1024, 64, 2) == 2 * (4 * 1024 * 64 + 4 * 1024**2)


def test_paper_block_sizes_on_an_a100_sm():
    sram_elements = 192 * 1024 // 2  # 192 KB of fp16
    assert flash_block_sizes(sram_elements, 128) == (128, 192)
    assert flash_block_sizes(sram_elements, 64) == (64, 384)


def test_flash_attention_formula_by_hand():
    n, d, m, b = 1024, 64, 16384, 2  # B_c = 16384 / 256 = 64, so T_c = 16 outer steps
    expected = b * (3 * n * d + 2 * n + 16 * (3 * n * d + 4 * n))
    assert flash_attention_hbm_bytes(n, d, m, b) == expected


def test_flash_attention_moves_less_when_n_is_large_and_scales_as_one_over_m():
    n, d = 16384, 64
    standard = standard_attention_hbm_bytes(n, d, 2)
    small, large = flash_attention_hbm_bytes(n, d, 2**14, 2), flash_attention_hbm_bytes(n, d, 2**16, 2)
    assert large < small < standard
    assert small / large == pytest.approx(4, rel=0.1), "Theta(N^2 d^2 / M): 4x the SRAM, about 1/4 the traffic"


def test_the_saving_of_algorithm_1_tends_to_m_over_3d_squared_not_m_over_d_squared():
    """Review F4: week 04 printed "Theorem 2's saving M/d^2 = 64" next to its own exact count, whose
    ratio was 18.8 at N = 8192 (M = 262,144 elements: a 1 MiB L2 in float32, d = 64)."""
    d, m = 64, 2**20 // 4
    limit = standard_over_flash_limit(d, m)
    assert limit == pytest.approx(4 * 1024 / (3 * 64 + 4)), (
        f"standard / Algorithm 1 bytes tend to 4 B_c / (3d + 4) = 20.9 here (B_c = 1024), got {limit}"
    )
    assert limit == pytest.approx(m / (3 * d**2), rel=0.03), "which is about M / 3d^2 = 21.3"
    ratios = [standard_attention_hbm_bytes(n, d, 4) / flash_attention_hbm_bytes(n, d, m, 4) for n in (8192, 2**20)]
    assert ratios[0] == pytest.approx(18.74, abs=0.01), "the lecture's table: 1082.1 MB / 57.7 MB at N = 8192"
    assert ratios[0] < ratios[1] < limit and ratios[1] == pytest.approx(limit, rel=0.01), (
        f"the exact ratio must climb towards the limit {limit:.2f} as N grows, got {ratios}"
    )
    assert m / d**2 > 2.9 * limit, "Theorem 2's M / d^2 is the scaling, three times the exact count's saving"


def test_tiled_bytes_non_causal_reads_kv_once_per_query_block():
    n, d, block = 1000, 64, 128
    blocks = math.ceil(n / block)
    assert tiled_hbm_bytes(n, d, block, block, 4) == 4 * (2 * n * d + blocks * 2 * n * d)


def test_tiled_bytes_causal_reads_about_half():
    n, d = 8192, 64
    full, causal = tiled_hbm_bytes(n, d, 128, 128, 2), tiled_hbm_bytes(n, d, 128, 128, 2, causal=True)
    assert causal / full == pytest.approx(0.5, abs=0.02)


def test_io_time():
    assert io_time_ms(2e9, 2e12) == pytest.approx(1.0)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_byte_ratio_tends_to_a_constant_not_to_infinity(causal):
    limit = standard_over_tiled_limit(64, 256, causal=causal)
    assert limit == (16.0 if causal else 8.0), (
        "4N^2 against 2N^2 d / B_r (halved when causal): 2 B_r / d, 4 B_r / d causal"
    )
    ratios = [
        standard_attention_hbm_bytes(n, 64, 4) / tiled_hbm_bytes(n, 64, 256, 256, 4, causal=causal)
        for n in (512, 2048, 8192, 2**17)
    ]
    assert ratios == sorted(ratios) and ratios[-1] < limit, f"the ratio approaches its limit from below: {ratios}"
    assert ratios[-1] == pytest.approx(limit, rel=0.02), "at 128k tokens the O(Nd) terms no longer matter"
