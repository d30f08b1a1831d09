import dataclasses

import pytest
import torch

from infer.profiles import PROFILES, pick_profile


def test_override_by_environment(monkeypatch):
    monkeypatch.setenv("INFER_PROFILE", "cpu")
    profile = pick_profile()
    assert profile.name == "cpu" and "INFER_PROFILE" in profile.reason


def test_unknown_override_lists_valid_profiles(monkeypatch):
    monkeypatch.setenv("INFER_PROFILE", "tpu")
    with pytest.raises(ValueError, match="valid profiles: cpu, gpu, gpu-check, gpu-dryrun"):
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
    with pytest.raises(dataclasses.FrozenInstanceError):
        cpu.name = "other"
    gpu = PROFILES["gpu"]
    assert gpu.dtype == torch.bfloat16 and gpu.model_name == "qwen2.5-1.5b"
    assert 2048 in gpu.grid.input_lens and max(gpu.grid.concurrency) == 32 and gpu.grid.num_prompts == 200
    assert (gpu.slo.ttft_ms, gpu.slo.tpot_ms) == (500.0, 20.0)


def test_gpu_dryrun_runs_on_cpu_when_asked_for(monkeypatch):
    monkeypatch.setenv("INFER_PROFILE", "gpu-dryrun")
    profile = pick_profile()
    assert profile.name == "gpu-dryrun" and profile.device == "cpu"


def test_gpu_dryrun_keeps_what_the_gpu_code_paths_depend_on():
    from infer.models import MODEL_SPECS

    gpu, dryrun = PROFILES["gpu"], PROFILES["gpu-dryrun"]
    assert dryrun.dtype == gpu.dtype == torch.bfloat16
    assert (
        MODEL_SPECS[dryrun.model_name].config().model_type == MODEL_SPECS[gpu.model_name].config().model_type == "qwen2"
    )
    # The grid's structure: as many input lengths in the same ratio, as many output lengths, the same
    # concurrency ladder, and prompts enough to fill its largest level.
    assert len(dryrun.grid.input_lens) == len(gpu.grid.input_lens)
    gpu_ratios = [n / gpu.grid.input_lens[0] for n in gpu.grid.input_lens]
    assert [n / dryrun.grid.input_lens[0] for n in dryrun.grid.input_lens] == gpu_ratios
    assert len(dryrun.grid.output_lens) == len(gpu.grid.output_lens)
    assert dryrun.grid.concurrency == gpu.grid.concurrency
    assert dryrun.grid.num_prompts >= max(dryrun.grid.concurrency)
    # ... at sizes a 2-core CPU runs in seconds.
    assert max(dryrun.grid.input_lens) <= max(gpu.grid.input_lens) // 8
    assert dryrun.grid.num_prompts < gpu.grid.num_prompts


def test_gpu_dryrun_model_is_a_small_grouped_query_qwen2():
    from infer.models import MODEL_SPECS

    config = MODEL_SPECS[PROFILES["gpu-dryrun"].model_name].config()
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention, as in Qwen2.5
    assert config.tie_word_embeddings
    assert config.hidden_size * config.num_hidden_layers <= 1024  # seconds, not minutes, on two cores


def test_gpu_check_is_the_gpu_profile_at_smaller_sizes():
    gpu, check = PROFILES["gpu"], PROFILES["gpu-check"]
    assert (check.model_name, check.dtype, check.device, check.slo) == (gpu.model_name, gpu.dtype, gpu.device, gpu.slo)
    assert check.grid.input_lens == gpu.grid.input_lens, "the seed's prompt lengths, as the gpu profile's"
    assert max(check.grid.output_lens) < max(gpu.grid.output_lens) and check.grid.num_prompts < gpu.grid.num_prompts


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_profile_refused_without_cuda():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        pick_profile("gpu-check")
