"""Week 03's grid against vLLM's CUDA server, checked without a GPU: the command line it starts,
the memory share it claims beside the course's own process, and which profiles run it at all; and
the benchmark client's shared prefix (week 08)."""

import contextlib

import pytest
import torch

from infer.profiles import PROFILES
from infer.serve import vllm_server
from infer.serve.vllm_server import bench_command, gpu_memory_share, vllm_commands, vllm_grid_missing_reason

GiB = 2**30


def test_vllm_claims_what_is_free_beside_the_course_process():
    assert gpu_memory_share(74 * GiB, 80 * GiB) == 0.9, "a roomy card: vLLM's own default"
    assert gpu_memory_share(18 * GiB, 24 * GiB) == 0.66, "(18 - 2 GiB margin) / 24, rounded down"
    with pytest.raises(RuntimeError, match="no room for vLLM"):
        gpu_memory_share(1 * GiB, 24 * GiB)


def test_the_share_reaches_the_command_line():
    serve, _ = vllm_commands(PROFILES["gpu"], "Qwen/Qwen2.5-1.5B-Instruct", gpu_memory_utilization=0.66)
    assert serve[serve.index("--gpu-memory-utilization") + 1] == "0.66"
    printed, _ = vllm_commands(PROFILES["gpu"], "Qwen/Qwen2.5-1.5B-Instruct")
    assert "--gpu-memory-utilization" not in printed, "the commands printed for a terminal keep vLLM's default"


def test_run_vllm_grid_frees_the_cache_then_starts_vllm_within_what_is_free(monkeypatch, tmp_path):
    """Issue 22, item 12: on a GPU the course process held 4-6 GiB and vLLM asked for 0.9 of the card."""
    events = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (18 * GiB, 24 * GiB))
    monkeypatch.setattr(vllm_server, "vllm_executable", lambda: "vllm")

    @contextlib.contextmanager
    def server(command, port, log_path, timeout_s):
        events.append(command)
        yield f"http://127.0.0.1:{port}"

    monkeypatch.setattr(vllm_server, "server_process", server)
    monkeypatch.setattr(vllm_server.subprocess, "run", lambda command, check: events.append("bench"))
    vllm_server.run_vllm_grid(PROFILES["gpu-check"], "model", result_dir=str(tmp_path))
    assert events[0] == "empty_cache", "the course's cached blocks go back to the driver before vLLM measures"
    serve = events[1]
    assert serve[serve.index("--gpu-memory-utilization") + 1] == "0.66"
    assert events.count("bench") == len(PROFILES["gpu-check"].grid.cells())


def test_gpu_check_leaves_the_vllm_grid_out_and_says_why():
    assert "leaves vLLM's grid to a full gpu run" in vllm_grid_missing_reason(PROFILES["gpu-check"])
    gpu_reason = vllm_grid_missing_reason(PROFILES["gpu"])
    assert gpu_reason is None or "leaves" not in gpu_reason, "the gpu profile runs it wherever vLLM's CUDA build can"


def test_the_bench_command_sends_a_shared_prefix_only_when_asked():
    workload = dict(num_prompts=32, input_len=32, output_len=64, result_dir="out", result_filename="run.json")
    shared = bench_command("http://127.0.0.1:8000", "tiny", "folder", random_prefix_len=1024, **workload)
    assert shared[shared.index("--random-prefix-len") + 1] == "1024"
    assert shared[shared.index("--random-input-len") + 1] == "32", "the input length is each prompt's own part"
    assert "--random-prefix-len" not in bench_command("http://127.0.0.1:8000", "tiny", "folder", **workload)
