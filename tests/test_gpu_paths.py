"""The CUDA-only paths of the review of gpu-paths (/work/shared/reviews/gpu-paths.md, F1-F11),
each checked on a CPU where a CPU can show it: a device stands in as the `meta` device (reading a
value from it fails, as reading one from a GPU waits for it), SDPA's arguments are inspected where
CUDA would pick another kernel, and the command lines vLLM would get are read."""

import contextlib
import copy
import json
import re

import tomllib
import torch
import torch.nn.functional as F

from infer.course import gpu_check
from infer.course.gpu_plan import ASSUMED_H100, StepTimes
from infer.experiments.paged_kv import near_tie
from infer.generate import cached_greedy_generate
from infer.kv_cache import KVCache
from infer.paged_attention import PagedKV, SeqRun, causal_attention
from infer.profiles import PROFILES
from infer.serve import vllm_server
from infer.serve.vllm_server import running_vllm_server, server_command, vllm_commands
from tests.notebook_files import REPO_ROOT

GiB = 2**30


def test_a_step_plan_never_reads_back_from_the_device():
    """F1: `int(decode_lengths.max())` on the device waits for every queued kernel each step."""
    cache = KVCache(num_layers=1, max_seqs=4, max_len=16, kv_heads=2, head_dim=8, device="meta")
    runs = [SeqRun(0, 0, 5, 1), SeqRun(1, 1, 0, 3), SeqRun(2, 4, 9, 1)]
    try:
        kv = PagedKV.for_runs(cache, runs, [[0], [1], [2]])
    except (NotImplementedError, RuntimeError) as exc:
        raise AssertionError(
            f"PagedKV.for_runs read a value back from the device ({exc}); on a GPU that is a synchronization "
            f"every step: take the longest decode from the runs on the host and pass it to __init__"
        ) from exc
    assert kv.longest_decode == 10, "the longest decode's length: position 9 + 1"


def test_a_shifted_chunk_never_asks_sdpa_for_gqa_with_a_mask(monkeypatch):
    """F2: on CUDA only flash implements enable_gqa, and flash takes no mask: the pair falls back to
    the math kernel. A chunk that starts mid-prompt must reach SDPA with equal head counts."""
    calls = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, enable_gqa=False, **kwargs):
        calls.append((attn_mask is not None, enable_gqa, q.shape[1] == k.shape[1]))
        return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, enable_gqa=enable_gqa, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    generator = torch.Generator().manual_seed(0)
    n, start, heads, kv_heads, d = 5, 7, 12, 2, 16
    q = torch.randn(n, heads, d, generator=generator)
    k, v = (torch.randn(kv_heads, start + n, d, generator=generator) for _ in range(2))
    out = causal_attention(q, k, v, start)
    masked = [call for call in calls if call[0]]
    assert masked and not any(gqa or not equal for _, gqa, equal in masked), (
        f"a chunk at position {start} called SDPA with (mask, enable_gqa, equal heads) = {calls}: on CUDA a mask "
        f"with enable_gqa=True runs the math kernel; stack each KV head's query heads into one head instead"
    )
    group = heads // kv_heads
    mask = torch.ones(n, start + n, dtype=torch.bool).tril(diagonal=start)
    expected = real(
        q.transpose(0, 1)[None], k.repeat_interleave(group, 0)[None], v.repeat_interleave(group, 0)[None], mask
    )[0].transpose(0, 1)
    torch.testing.assert_close(out, expected, msg="query head h must read KV head h // group")


class _MetaModel(torch.nn.Module):
    """A model whose weights live on a device that cannot be read back (the meta device)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4, device="meta")
        self.rows = []

    def forward(self, token_ids, positions, cache, seq_ids=None, logits_rows=None):
        self.rows.append(logits_rows)
        return torch.zeros(token_ids.shape[0] if logits_rows is None else len(logits_rows), 10, device="meta")


def test_the_cached_loop_never_indexes_the_device_with_a_host_tensor():
    """F3: x[cpu_index] with x on CUDA copies the index with a blocking copy: a sync every step."""
    model = _MetaModel()
    cached_greedy_generate(model, torch.tensor([[1, 2, 3]]), 4, cache=None)
    devices = [rows.device.type for rows in model.rows if rows is not None]
    assert devices and all(device == "meta" for device in devices), (
        f"logits_rows were on {devices}: build the last position's index on the model's device once, outside "
        f"the loop (a decode step has one row: no index needed)"
    )


def test_the_torch_floor_has_enable_gqa():
    """F5: scaled_dot_product_attention(enable_gqa=...) arrived in torch 2.5; 2.4 raises TypeError."""
    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    torch_floor = next(d for d in dependencies if re.match(r"torch\b", d))
    version = tuple(int(x) for x in re.search(r">=\s*(\d+)\.(\d+)", torch_floor).groups())
    assert version >= (2, 5), f"pyproject.toml asks for {torch_floor}: the model calls enable_gqa, torch >= 2.5"


def test_the_vllm_grid_server_is_on_loopback_with_room_to_spare():
    """F6: no --host bound vLLM to every interface; --max-model-len had no margin for a re-tokenized prompt."""
    profile = PROFILES["gpu"]
    serve, benches = vllm_commands(profile, "model")
    assert serve[serve.index("--host") + 1] == "127.0.0.1", "vLLM's default host is every interface"
    longest = max(profile.grid.input_lens) + max(profile.grid.output_lens)
    assert int(serve[serve.index("--max-model-len") + 1]) > longest, (
        "a random prompt can re-tokenize a token longer: leave --max-model-len a margin past the longest request"
    )


def test_run_vllm_grid_takes_a_free_port(monkeypatch, tmp_path):
    """F6 (b): on port 8000 another server could answer /health in vLLM's place."""
    seen = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (18 * GiB, 24 * GiB))
    monkeypatch.setattr(vllm_server, "vllm_executable", lambda: "vllm")
    monkeypatch.setattr(vllm_server, "free_port", lambda: 54321)

    @contextlib.contextmanager
    def server(command, port, log_path, timeout_s):
        seen.append(port)
        yield f"http://127.0.0.1:{port}"

    monkeypatch.setattr(vllm_server, "server_process", server)
    monkeypatch.setattr(vllm_server.subprocess, "run", lambda command, check: None)
    vllm_server.run_vllm_grid(PROFILES["gpu-check"], "model", result_dir=str(tmp_path))
    assert seen == [54321], "run_vllm_grid must take a free port unless given one"


def test_vllm_beside_the_course_on_cuda_claims_only_what_is_free(monkeypatch, tmp_path):
    """F10: side_by_side and prefix_vs_vllm started vLLM at its default 0.9 share beside the course's
    GPU processes; vLLM refuses to start when less than that share is free."""
    started = []
    monkeypatch.setattr(vllm_server, "vllm_missing_reason", lambda cuda=False: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (40 * GiB, 80 * GiB))

    @contextlib.contextmanager
    def server(command, port, log_path, timeout_s, env=None):
        started.append(command)
        yield f"http://127.0.0.1:{port}"

    monkeypatch.setattr(vllm_server, "server_process", server)
    with running_vllm_server("folder", "model", tmp_path / "log", dtype="bfloat16"):
        pass
    command = started[0]
    assert "--gpu-memory-utilization" in command, (
        "on CUDA, pass --gpu-memory-utilization from what is free (cuda_memory_share), not vLLM's 0.9 default"
    )
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.47", "(40 - 2 GiB margin) / 80"


def test_vllm_on_the_cpu_build_keeps_its_own_cache_cap(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert vllm_server.cuda_memory_share() is None
    assert "--gpu-memory-utilization" not in server_command("folder", "model", 8000)


def test_prefix_vs_vllm_starts_vllm_last():
    """F10: vLLM started first fills 90% of the card, and the course server then runs out of memory."""
    source = (REPO_ROOT / "infer" / "experiments" / "prefix_vs_vllm.py").read_text()
    assert source.index("running_server_process(") < source.index("running_vllm_server(\n"), (
        "start the course server first, then vLLM, so that vLLM's share is taken from what is left"
    )


def _cell_sources(notebook: str) -> list[str]:
    return ["".join(cell["source"]) for cell in json.loads((REPO_ROOT / notebook).read_text())["cells"]]


def test_week07_prints_the_vllm_command_in_the_models_dtype():
    """F11: server_command's default dtype is float32 (the CPU build's); on a GPU the model is bf16."""
    cell = next(s for s in _cell_sources("weeks/07_serving.ipynb") if "server_command(" in s and "print" in s)
    assert "dtype=dtype_name(lm.dtype)" in cell, "week 07's printed vllm command must pass the model's dtype"
    assert "gpu_memory_utilization=cuda_memory_share()" in cell


def test_week03_prints_the_vllm_command_with_the_free_share():
    """F6 (d): the command week 03 prints kept vLLM's 0.9 while the notebook holds the model."""
    cell = next(s for s in _cell_sources("weeks/03_measuring.ipynb") if "vllm_commands(" in s and "print" in s)
    assert "gpu_memory_utilization=cuda_memory_share()" in cell


def test_week05_step_check_compares_tokens_in_float32(monkeypatch, tiny):
    """F8: the student's step (PerSequenceKV) and the library's engine (PagedKV) use different CUDA
    attention kernels; in bf16 a greedy near-tie can flip and fail a correct solution."""
    from infer.course.grading.exercises import week05

    seen = []
    monkeypatch.setattr(week05, "own_model", lambda: copy.deepcopy(tiny.model).to(torch.bfloat16))
    monkeypatch.setattr(week05, "library_verdict", lambda qid, step: None)
    monkeypatch.setattr(week05, "_drive", lambda step, model, cases, name, settings: seen.append(model) or 1)
    week05.grade_step_forward(lambda model, cache, work: [])
    dtypes = {model.embed.weight.dtype for model in seen}
    assert dtypes == {torch.float32}, (
        f"grade_step_forward compared tokens with a {dtypes} model: build its model from hf.float32_copy(own_model())"
    )


def test_a_near_tie_is_judged_at_the_models_precision():
    """F9: 1e-5 is a float32 near-tie; two bf16 logits one step apart (2^-5 near 4) are never that close."""
    best, second = 4.3125, 4.28125  # adjacent bf16 values
    assert near_tie(best, second, torch.bfloat16), "one bf16 step apart: rounding decides, not a bug"
    assert not near_tie(best, second, torch.float32), "in float32 the same gap is a real difference"
    assert near_tie(4.3198438, 4.3198423, torch.float32), "week 08's float32 near-tie stays one"
    assert not near_tie(5.0, 4.0, torch.bfloat16), "a wide gap is a bug in any dtype"


def test_the_step_time_phase_hands_its_times_back(tmp_path, monkeypatch):
    """The step times are measured in a process gpu-check can stop (its --measure-step-times)."""
    monkeypatch.setattr(gpu_check, "measure_step_times", lambda profile, assumed: assumed)
    path = tmp_path / "times.json"
    assert gpu_check.main(["--measure-step-times", str(path)]) == 0
    assert StepTimes(**json.loads(path.read_text())) == ASSUMED_H100
