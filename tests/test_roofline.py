"""Arithmetic intensity and the roofline: hand-computed values, and the shape of forward_cost."""

import math

import pytest


from infer import roofline as rl
from infer.models import MODEL_SPECS
from infer.profiles import PROFILES


@pytest.mark.parametrize("m, k, n, b, expected", [
    # 2mkn / (b (mk + kn + mn)), computed by hand
    (1, 1536, 1536, 2, 2 * 1536 * 1536 / (2 * (1536 + 1536 * 1536 + 1536))),  # a decode-step matmul: ~1
    (2, 2, 2, 4, 16 / (4 * 12)),  # 16 FLOPs, 12 elements of 4 bytes: 1/3
    (1024, 1024, 1024, 2, 2 * 1024**3 / (2 * 3 * 1024**2)),  # square: n / 3 = 341.33
])
def test_matmul_arithmetic_intensity_hand_computed(m, k, n, b, expected):
    got = rl.matmul_arithmetic_intensity(m, k, n, b)
    assert math.isclose(got, expected, rel_tol=1e-12), f"I({m}x{k} @ {k}x{n}, {b} B) should be {expected:.6g}, got {got:.6g}"


def test_decode_matmul_is_about_one_flop_per_byte_in_bf16():
    assert rl.matmul_arithmetic_intensity(1, 1536, 1536, 2) == pytest.approx(1.0, abs=0.01)


def test_forward_cost_decode_step_in_bf16_is_near_one_flop_per_byte():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    cost = rl.forward_cost(config, 1, 0, 2)
    assert cost.intensity == pytest.approx(1.0, abs=0.05), (
        f"one token, bf16: ~2 FLOPs per weight over 2 bytes per weight = ~1 FLOP/byte, got {cost.intensity:.3f}")
    assert cost.bytes == pytest.approx(3.09e9, rel=0.02), f"Qwen2.5-1.5B bf16 weights are ~3.1 GB, got {cost.bytes / 1e9:.2f} GB"


def test_forward_cost_intensity_grows_with_new_tokens():
    config = MODEL_SPECS["qwen2.5-1.5b"].config()
    intensities = [rl.forward_cost(config, n, 0, 2).intensity for n in (1, 16, 256, 2048)]
    assert intensities == sorted(intensities), f"intensity must grow with the tokens per pass, got {intensities}"
    assert intensities[-1] > 295, "a 2048-token bf16 prefill should sit right of the H100 ridge point (~295 FLOP/byte)"


def test_forward_cost_halves_intensity_in_fp32():
    config = MODEL_SPECS["tiny"].config()
    bf16, fp32 = rl.forward_cost(config, 64, 0, 2), rl.forward_cost(config, 64, 0, 4)
    assert fp32.flops == bf16.flops, "FLOPs do not depend on the dtype"
    assert fp32.intensity == pytest.approx(bf16.intensity / 2), "twice the bytes per element: half the intensity"


def test_achieved_point_divides_flops_by_seconds():
    cost = rl.ForwardCost(flops=2e9, bytes=1e9)
    intensity, achieved = rl.achieved_point(cost, 4.0)
    assert intensity == 2.0 and achieved == pytest.approx(5e11), f"2 GFLOP in 4 ms is 500 GFLOP/s, got {achieved:.3g}"
    with pytest.raises(ValueError):
        rl.achieved_point(cost, 0.0)


def test_measured_roofline_ridge_and_attainable():
    probe = rl.ROOFLINE_PROBES["cpu"]
    roof = rl.MeasuredRoofline(peak_flops=989e12, bandwidth=3.35e12, probe=probe)
    assert roof.ridge_point == pytest.approx(295.2, abs=0.1), "H100: 989 TFLOP/s / 3.35 TB/s = ~295 FLOP/byte"
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
