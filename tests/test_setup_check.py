import torch

from infer.course.setup_check import hardware, optional_parts, smoke_test


def test_optional_parts_cover_every_gpu_only_piece():
    parts = {part.name: part for part in optional_parts()}
    assert set(parts) == {"CUDA", "vLLM", "flash-attn", "Triton"}
    assert parts["CUDA"].available == torch.cuda.is_available()
    for part in parts.values():
        assert part.line.count("\n") == 0 and part.consequence, f"{part.name}: one line that says what it means"
        if not torch.cuda.is_available() and part.name != "vLLM":  # vLLM has a CPU build (week 07 uses it)
            assert not part.available, f"{part.name} cannot be available without CUDA"


def test_vllm_is_available_exactly_when_its_venv_has_it():
    from infer.provenance import vllm_version

    vllm = next(part for part in optional_parts() if part.name == "vLLM")
    assert vllm.available == (vllm_version() is not None)
    assert ("skip" in vllm.consequence) != vllm.available, vllm.line


def test_hardware_reports_cores_and_cuda():
    facts = hardware()
    assert int(facts["cpu cores"]) >= 1
    assert ("cuda" in facts) != torch.cuda.is_available()


def test_smoke_test_passes_on_a_working_install():
    verdict = smoke_test()
    assert verdict.ok, verdict.line
