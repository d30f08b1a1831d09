import pytest
import torch

from infer.profiles import PROFILES, pick_profile


def test_override_by_environment(monkeypatch):
    monkeypatch.setenv("INFER_PROFILE", "cpu")
    profile = pick_profile()
    assert profile.name == "cpu" and "INFER_PROFILE" in profile.reason


def test_unknown_override_lists_valid_profiles(monkeypatch):
    monkeypatch.setenv("INFER_PROFILE", "tpu")
    with pytest.raises(ValueError, match="valid profiles: cpu, gpu"):
        pick_profile()


def test_hardware_choice_without_override(monkeypatch):
    monkeypatch.delenv("INFER_PROFILE", raising=False)
    expected = "gpu" if torch.cuda.is_available() else "cpu"
    assert pick_profile().name == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_profile_refused_without_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        pick_profile("gpu")


def test_profiles_are_frozen_and_consistent():
    cpu = PROFILES["cpu"]
    with pytest.raises(Exception):
        cpu.name = "other"
    gpu = PROFILES["gpu"]
    assert gpu.dtype == torch.bfloat16 and gpu.model_name == "qwen2.5-1.5b"
    assert 2048 in gpu.grid.input_lens and max(gpu.grid.concurrency) == 32 and gpu.grid.num_prompts == 200
    assert (gpu.slo.ttft_ms, gpu.slo.tpot_ms) == (500.0, 20.0)
