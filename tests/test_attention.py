"""Every attention implementation that can run here must equal the float64 reference."""

import sys

import pytest
import torch

from infer.attention import (
    IMPLEMENTATIONS,
    TOLERANCES,
    AttentionImpl,
    SoftmaxState,
    block_state,
    check_exactness,
    empty_state,
    finalize,
    flash_attn_import_problem,
    merge_states,
    naive_attention,
    random_qkv,
    reference_attention,
    relative_error,
    tiled_attention,
)
from infer.attention_triton import (
    SHARED_MEMORY_BUDGET,
    SUPPORTED_DTYPES,
    SUPPORTED_HEAD_DIMS,
    LaunchConfig,
    launch_config,
)
from infer.availability import YES
from infer.experiments.attention_bench import (
    SweepConfig,
    SweepPoint,
    SweepResult,
    TensorBytes,
    format_table,
    plot_sweep,
    run_sweep,
)
from infer.timing import Timing
from tests.triton_interpreter import run_in_interpreter, triton_importable

CPU_DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Lengths that are not multiples of the tiled block (64 below), and one shorter than a block.
SHAPES = [(2, 3, 100, 64), (1, 2, 37, 16), (2, 1, 130, 32)]


def _runnable_here(name: str, dtype: torch.dtype, head_dim: int):
    verdict = IMPLEMENTATIONS[name].available("cpu", dtype, head_dim)
    if not verdict:
        pytest.skip(f"{name} cannot run on this machine: {verdict.reason}")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", CPU_DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("name", [n for n in IMPLEMENTATIONS if n not in ("triton",)])
def test_implementation_matches_float64_reference(name, dtype, causal, shape):
    _runnable_here(name, dtype, shape[-1])
    result = check_exactness(IMPLEMENTATIONS[name], dtype=dtype, causal=causal, shape=shape)
    assert result.ok, (
        f"{name} in {dtype} (causal={causal}, shape {shape}) is off the float64 reference by "
        f"{result.error:.2e}, more than {result.tolerance:.0e}: {result.line}"
    )


@pytest.mark.parametrize("blocks", [(16, 16), (64, 32), (32, 64), (7, 13)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tiled_is_exact_for_any_block_shape(blocks, causal):
    q, k, v = random_qkv(2, 2, 101, 32, seed=3)
    out = tiled_attention(q, k, v, causal=causal, block_q=blocks[0], block_k=blocks[1])
    error = relative_error(out, reference_attention(q, k, v, causal=causal))
    assert error < 1e-5, (
        f"tiled_attention with block_q={blocks[0]}, block_k={blocks[1]} is off by {error:.2e}: "
        "check the rescaling by exp(m_old - m_new) and the diagonal mask"
    )


def test_float64_inputs_reach_float64_accuracy():
    q, k, v = random_qkv(1, 2, 70, 16, dtype=torch.float64, seed=1)
    for fn in (naive_attention, tiled_attention):
        assert (
            relative_error(fn(q, k, v, causal=True), reference_attention(q, k, v, causal=True))
            < TOLERANCES[torch.float64]
        )


def test_first_causal_row_attends_to_itself_only():
    q, k, v = random_qkv(1, 1, 50, 16, seed=2)
    out = tiled_attention(q, k, v, causal=True, block_q=16, block_k=16)
    assert torch.allclose(out[0, 0, 0], v[0, 0, 0], atol=1e-6), "row 0 under a causal mask must return v[0] exactly"


@pytest.mark.parametrize("seed", range(5))
def test_online_softmax_merge_equals_the_state_of_both_blocks(seed):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(6, 20, generator=gen, dtype=torch.float64) * 20
    scores[:2, 12:] = float("-inf")  # two rows see nothing in the second block
    values = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    merged = merge_states(block_state(scores[:, :12], values[:12]), block_state(scores[:, 12:], values[12:]))
    together = block_state(scores, values)
    for label, got, expected in zip(SoftmaxState._fields, merged, together):
        assert torch.allclose(got, expected, rtol=1e-12), f"merged {label} differs from the state of both blocks"
    assert torch.allclose(finalize(merged), torch.softmax(scores, -1) @ values, rtol=1e-12)


def test_merging_with_an_empty_state_changes_nothing_and_gives_no_nan():
    scores = torch.randn(3, 5, dtype=torch.float64)
    values = torch.randn(5, 4, dtype=torch.float64)
    state = block_state(scores, values)
    merged = merge_states(empty_state(torch.zeros(3, 4), torch.float64), state)
    assert all(torch.equal(a, b) for a, b in zip(merged, state))
    all_masked = block_state(torch.full((3, 5), float("-inf"), dtype=torch.float64), values)
    assert not any(torch.isnan(t).any() for t in all_masked), "a fully masked block must give sum 0 and acc 0, not NaN"


def test_tiled_never_holds_the_full_score_matrix_but_naive_does():
    q, k, v = random_qkv(1, 1, 1024, 32, seed=0)
    full = 1024 * 1024 * 4
    with TensorBytes() as naive:
        naive_attention(q, k, v, causal=True)
    with TensorBytes() as tiled:
        tiled_attention(q, k, v, causal=True, block_q=64, block_k=64)
    assert naive.peak >= 2 * full, f"naive attention should hold S and P ({2 * full} bytes); tracked {naive.peak}"
    assert tiled.peak < full / 4, (
        f"tiled attention held {tiled.peak} bytes, a large part of the {full}-byte N x N matrix"
    )


def test_sweep_refuses_naive_over_the_cpu_budget_and_goes_on():
    impls = {name: IMPLEMENTATIONS[name] for name in ("naive", "tiled")}
    config = SweepConfig(
        seq_lens=(64, 256),
        batch=1,
        heads=1,
        head_dim=16,
        dtype=torch.float32,
        device="cpu",
        warmup=0,
        repeats=1,
        cpu_budget_bytes=200_000,
    )
    result = run_sweep(impls, config, progress=False)
    assert result.point("naive", 64).status == "ok"
    refused = result.point("naive", 256)
    assert refused.status == "oom" and "budget" in refused.note, refused
    assert result.point("tiled", 256).status == "ok", "the other implementations must still run at that length"


def _committed_cpu_sweep() -> SweepResult:
    """The cpu profile's sweep as committed (week 04): two methods refused at 8192 tokens, whose last
    measured points (4096) lie above another method's 8192-token point."""
    config = SweepConfig(
        seq_lens=(512, 1024, 2048, 4096, 8192), batch=1, heads=1, head_dim=64, dtype=torch.float32, device="cpu"
    )
    measured = {  # name: [(median ms, peak MiB) per length]; None: refused over the CPU budget
        "naive": [(1.46, 2.5), (5.04, 9.0), (30.57, 34.0), (183.51, 132.0), None],
        "tiled": [(1.90, 1.32), (5.11, 1.82), (17.45, 2.82), (64.22, 4.82), (234.22, 8.82)],
        "sdpa-math": [(1.62, 3.25), (7.24, 12.5), (54.11, 49.0), (228.37, 194.0), None],
        "sdpa-flash": [(1.05, 0.13), (2.47, 0.25), (8.28, 0.51), (30.82, 1.02), (124.98, 2.03)],
    }
    result = SweepResult(config)
    for name, values in measured.items():
        for n, value in zip(config.seq_lens, values):
            if value is None:
                result.points.append(SweepPoint(name, n, "oom", note="refused: needs ~576 MiB > CPU budget 512 MiB"))
            else:
                result.points.append(
                    SweepPoint(
                        name, n, "ok", Timing((value[0] * 0.98, value[0], value[0] * 1.02)), int(value[1] * 2**20)
                    )
                )
    return result


def test_oom_markers_sit_above_every_measured_point():
    """Issue F12 of the weeks 00-04 review: an OOM marker drawn at a y value read while the series
    were still being added landed among the data (below the same method's 4096-token point, on top
    of sdpa-flash's real 8192-token time), where a reader takes it for a measurement."""
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_memory) = plt.subplots(1, 2)
    plot_sweep(ax_time, ax_memory, _committed_cpu_sweep())
    fig.canvas.draw()
    for ax, panel in ((ax_time, "time"), (ax_memory, "memory")):
        markers = [line for line in ax.get_lines() if line.get_marker() == "x"]
        data = [line for line in ax.get_lines() if line.get_marker() == "o"]
        assert len(markers) == 2, f"{panel} panel: expected one OOM marker each for naive and sdpa-math"
        highest_point = max(line.get_transform().transform(line.get_xydata())[:, 1].max() for line in data)
        for marker in markers:
            x_px, y_px = marker.get_transform().transform(marker.get_xydata())[0]
            assert y_px > highest_point, (
                f"{panel} panel: an OOM marker at {y_px:.0f} px lies at or below the highest measured point "
                f"({highest_point:.0f} px): draw the markers after every series, above the data, at a fixed "
                "height of the axes, so that no reader takes a refused run for a measurement"
            )
            assert ax.bbox.y0 <= y_px <= ax.bbox.y1, f"{panel} panel: the OOM marker lies outside the axes"
        heights = sorted(marker.get_transform().transform(marker.get_xydata())[0][1] for marker in markers)
        assert heights[1] - heights[0] > 5, f"{panel} panel: two OOM markers at one length must not overlap"
    plt.close(fig)


def test_one_failing_implementation_is_recorded_and_the_sweep_goes_on():
    """Before issue 22 the sweep caught only out-of-memory: a flash-attn build that fails at its first
    call, or a Triton kernel out of shared memory, ended week 04's sweep."""

    def broken(q, k, v, causal=False):
        raise ImportError("flash_attn_2_cuda.so: undefined symbol: _ZN3c104cuda9SetDeviceEi")

    impls = {
        "broken": AttentionImpl("broken", broken, "fails at its first call", lambda *a: YES, False),
        "tiled": IMPLEMENTATIONS["tiled"],
    }
    config = SweepConfig(
        seq_lens=(64,), batch=1, heads=1, head_dim=16, dtype=torch.float32, device="cpu", warmup=0, repeats=1
    )
    result = run_sweep(impls, config, progress=False)
    failed = result.point("broken", 64)
    assert failed.status == "failed" and failed.note.startswith("ImportError: flash_attn_2_cuda.so"), failed
    assert result.point("tiled", 64).status == "ok", "the other implementations must still run"
    assert "FAILED" in format_table(result)


def test_a_flash_attn_build_that_does_not_import_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    """find_spec finds a broken build too; only importing it tells (issue 22, item 10)."""
    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    flash_attn_import_problem.cache_clear()
    try:
        verdict = IMPLEMENTATIONS["flash-attn"].available("cuda", torch.bfloat16, 128)
    finally:
        flash_attn_import_problem.cache_clear()
    assert not verdict and "installed but does not import (ImportError: flash_attn_2_cuda.so" in verdict.reason, verdict


def test_triton_launch_configs_fit_in_shared_memory():
    """Triton's default of 3 pipeline stages of 64-key tiles needs 224 KiB in float32 at head_dim 128
    (the gpu model's): more than an A100 or L4 gives a block (issue 22, item 11)."""
    assert LaunchConfig(64, 64, 3).tile_bytes(torch.float32, 128) == 224 * 1024
    for dtype in SUPPORTED_DTYPES:
        for head_dim in SUPPORTED_HEAD_DIMS:
            config = launch_config(dtype, head_dim)
            assert config.tile_bytes(dtype, head_dim) <= SHARED_MEMORY_BUDGET, (dtype, head_dim, config)
    assert launch_config(torch.float32, 128).num_stages < 3
    assert launch_config(torch.bfloat16, 64).num_stages == 3, "small tiles keep the deepest pipeline"


def test_unavailable_implementations_say_why():
    for name in ("sdpa-efficient", "sdpa-cudnn", "flash-attn"):
        verdict = IMPLEMENTATIONS[name].available("cpu", torch.bfloat16, 64)
        assert not verdict and verdict.reason, f"{name} must refuse the CPU with a reason"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: the Triton kernel runs on CUDA only")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_kernel_on_cuda(dtype, causal):
    impl = IMPLEMENTATIONS["triton"]
    verdict = impl.available("cuda", dtype, 64)
    if not verdict:
        pytest.skip(verdict.reason)
    for shape in [(2, 3, 100, 64), (1, 2, 1000, 128), (1, 1, 37, 16)]:
        result = check_exactness(impl, dtype=dtype, causal=causal, shape=shape, device="cuda")
        assert result.ok, result.line


@pytest.mark.skipif(not triton_importable(), reason="the triton package is not installed (CPU-only PyTorch)")
def test_triton_kernel_in_the_cpu_interpreter():
    """Triton's interpreter (TRITON_INTERPRET=1, read at import) runs the kernel with NumPy. Its
    bf16 dot is broken, so fp32 and fp16 only; bf16 is covered by the CUDA test."""
    code = (
        "import torch\n"
        "from infer.attention import IMPLEMENTATIONS, check_exactness\n"
        "for dtype in (torch.float32, torch.float16):\n"
        "    for causal in (False, True):\n"
        "        r = check_exactness(IMPLEMENTATIONS['triton'], dtype=dtype, causal=causal, shape=(1, 2, 70, 16))\n"
        "        assert r.ok, r.line\n"
    )
    run_in_interpreter(code)
