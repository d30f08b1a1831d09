"""Arithmetic intensity and the roofline: hand-computed values, and the shape of forward_cost."""

import math

import pytest

from infer import roofline as rl
from infer.models import MODEL_SPECS
from infer.profiles import PROFILES


@pytest.mark.parametrize(
    "m, k, n, b, expected",
    [
        # 2mkn / (b (mk + kn + mn)), computed by hand
        (1, 1536, 1536, 2, 2 * 1536 * 1536 / (2 * (1536 + 1536 * 1536 + 1536))),  # a decode-step matmul: ~1
        (2, 2, 2, 4, 16 / (4 * 12)),  # 16 FLOPs, 12 elements of 4 bytes: 1/3
        (1024, 1024, 1024, 2, 2 * 1024**3 / (2 * 3 * 1024**2)),  # square: n / 3 = 341.33
    ],
)
def test_matmul_arithmetic_intensity_hand_computed(m, k, n, b, expected):
    got = rl.matmul_arithmetic_intensity(m, k, n, b)
    assert math.isclose(got, expected, rel_tol=1e-12), (
        f"I({m}x{k} @ {k}x{n}, {b} B) should be {expected:.6g}, got {got:.6g}"
    )


def test_decode_matmul_is_about_one_flop_per_byte_in_bf16():
    assert rl.matmul_arithmetic_intensity(1, 1536, 1536, 2) == pytest.approx(1.0, abs=0.01)


@pytest.mark.parametrize("k, n, b", [(1536, 8960, 2), (256, 688, 4), (2048, 2048, 2)])
def test_matmul_intensity_rises_then_saturates_at_2kn_over_b_k_plus_n(k, n, b):
    ceiling = rl.matmul_intensity_limit(k, n, b)
    assert ceiling == pytest.approx(2 * k * n / (b * (k + n)), rel=1e-12)
    intensities = [rl.matmul_arithmetic_intensity(m, k, n, b) for m in (1, 8, 64, 512, 4096, 32768, 10**7)]
    assert intensities == sorted(intensities) and max(intensities) < ceiling, (
        f"I(m) must grow with m and stay under its ceiling {ceiling:.1f}, got {intensities}"
    )
    assert intensities[0] == pytest.approx(2 / b, rel=0.01), "one row: about 2/b FLOP/byte, the weight read dominates"
    assert intensities[-1] == pytest.approx(ceiling, rel=1e-3), "very many rows: the activations dominate, I -> ceiling"


def test_forward_cost_decode_step_in_bf16_is_near_one_flop_per_byte():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    cost = rl.forward_cost(config, 1, 0, 2)
    assert cost.intensity == pytest.approx(1.0, abs=0.05), (
        f"one token, bf16: ~2 FLOPs per weight over 2 bytes per weight = ~1 FLOP/byte, got {cost.intensity:.3f}"
    )
    assert cost.weight_bytes == pytest.approx(3.09e9, rel=0.02), (
        f"Qwen2.5-1.5B bf16 weights are ~3.1 GB, got {cost.weight_bytes / 1e9:.2f} GB"
    )
    assert cost.bytes == pytest.approx(cost.weight_bytes, rel=0.01), "one token: the weights are nearly all the bytes"


@pytest.mark.parametrize(
    "name, tokens, bytes_per_element, expected, weights_only_expected",
    [
        # Issue 8's review: counting each linear layer's input and output (and every logits row),
        # the intensities are far below the weights-and-KV-only count that the course used to report.
        ("tiny", 1024, 4, 90, 588),
        ("qwen2.5-1.5b", 2048, 2, 790, 2125),
        ("qwen2.5-1.5b", 8192, 2, 1260, 9351),
    ],
)
def test_prefill_intensity_with_linear_activation_traffic_matches_the_review(
    name, tokens, bytes_per_element, expected, weights_only_expected
):
    cost = rl.forward_cost(MODEL_SPECS[name].config(), tokens, 0, bytes_per_element)
    linears_only = cost.flops / (cost.bytes - cost.attention_activation_bytes)
    assert linears_only == pytest.approx(expected, rel=0.02), (
        f"{name}, {tokens} tokens: weights + KV + linear activations give {linears_only:.0f} FLOP/byte, "
        f"review: ~{expected}"
    )
    assert cost.intensity < linears_only, "attention's queries and outputs add bytes, so the full count is lower"
    weights_only = cost.flops / (cost.weight_bytes + cost.kv_bytes)
    assert weights_only == pytest.approx(weights_only_expected, rel=0.01), "the old count: weights and KV bytes only"
    assert weights_only > 2.5 * cost.intensity, "ignoring activations overstates a long prefill's intensity 3-8x"


def test_prefill_with_one_logits_row_skips_the_head_for_the_other_rows():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    every_row, last_row = rl.forward_cost(config, 2048, 0, 2), rl.forward_cost(config, 2048, 0, 2, logits_rows=1)
    head = config.hidden_size * config.vocab_size
    assert every_row.flops - last_row.flops == pytest.approx(2 * head * 2047), (
        "the head's 2 h V FLOPs per row, 2047 rows fewer"
    )
    assert (
        every_row.linear_activation_bytes - last_row.linear_activation_bytes
        == 2 * (config.hidden_size + config.vocab_size) * 2047
    )
    with pytest.raises(ValueError, match="logits_rows"):
        rl.forward_cost(config, 16, 0, 2, logits_rows=17)


def test_forward_cost_intensity_grows_with_new_tokens_then_levels_off():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    intensities = [rl.forward_cost(config, n, 0, 2, logits_rows=1).intensity for n in (1, 16, 256, 2048, 8192)]
    assert intensities == sorted(intensities), f"intensity must grow with the tokens per pass, got {intensities}"
    assert intensities[3] > 295, (
        "a 2048-token bf16 prefill should sit right of the H100 SXM ridge point (~295 FLOP/byte)"
    )
    mlp_ceiling = rl.matmul_intensity_limit(config.hidden_size, config.intermediate_size, 2)
    assert intensities[-1] < mlp_ceiling, (
        f"an 8192-token prefill stays under the MLP matmuls' ceiling {mlp_ceiling:.0f}"
    )


def test_forward_cost_halves_intensity_in_fp32():
    config = MODEL_SPECS["tiny"].config()
    bf16, fp32 = rl.forward_cost(config, 64, 0, 2), rl.forward_cost(config, 64, 0, 4)
    assert fp32.flops == bf16.flops, "FLOPs do not depend on the dtype"
    assert fp32.intensity == pytest.approx(bf16.intensity / 2), "twice the bytes per element: half the intensity"


def test_achieved_point_divides_flops_by_seconds():
    cost = rl.ForwardCost(
        flops=2e9, weight_bytes=6e8, kv_bytes=1e8, linear_activation_bytes=2e8, attention_activation_bytes=1e8
    )
    intensity, achieved = rl.achieved_point(cost, 4.0)
    assert cost.bytes == pytest.approx(1e9)
    assert intensity == pytest.approx(2.0) and achieved == pytest.approx(5e11), (
        f"2 GFLOP in 4 ms is 500 GFLOP/s, got {achieved:.3g}"
    )
    with pytest.raises(ValueError):
        rl.achieved_point(cost, 0.0)


def test_measured_roofline_ridge_and_attainable():
    probe = rl.ROOFLINE_PROBES["cpu"]
    roof = rl.MeasuredRoofline(peak_flops=989e12, bandwidth=3.35e12, probe=probe)
    assert roof.ridge_point == pytest.approx(295.2, abs=0.1), "H100 SXM: 989 TFLOP/s / 3.35 TB/s = ~295 FLOP/byte"
    assert roof.attainable(1.0) == pytest.approx(3.35e12), "left of the ridge the roof is intensity x bandwidth"
    assert roof.attainable(1000.0) == 989e12, "right of the ridge the roof is the compute peak"


def test_measure_roofline_on_cpu_returns_positive_roofs():
    roof = rl.measure_roofline(PROFILES["cpu"])
    assert roof.peak_flops > 0 and roof.bandwidth > 0, f"measured roofs must be positive: {roof}"
    assert "GFLOP/s" in str(roof) and "GB/s" in str(roof)


def test_plot_roofline_labels_axes_with_units():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    rl.plot_roofline(ax, 1e11, 1e10, {"decode": (0.5, 1e9), "prefill": (100.0, 5e10)})
    assert "FLOP/byte" in ax.get_xlabel() and "FLOP/s" in ax.get_ylabel()
    plt.close(fig)


def test_plot_matmul_saturation_draws_each_ceiling():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    rl.plot_matmul_saturation(ax, {"MLP up": (1536, 8960)}, 2)
    ceilings = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert ceilings == [pytest.approx(rl.matmul_intensity_limit(1536, 8960, 2))]
    assert "FLOP/byte" in ax.get_ylabel() and "rows" in ax.get_xlabel()
    plt.close(fig)
