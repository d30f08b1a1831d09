"""The course server and client against vLLM's (its CPU build, from `.venv-vllm`; `make vllm`).

- vLLM's own benchmark client completes every request against the course server;
- on one workload, run back to back on the course server, vLLM's client and the course client
  agree on output throughput and median TPOT within 25% (see AGREEMENT);
- the course client completes every request against vLLM's server, with exact token counts.

Skipped, with one line, when `.venv-vllm` is absent. The vLLM server takes about a minute to start."""

import math

import pytest

from infer.serve.client import run_benchmark, workload_for_model
from infer.serve.export import export_model
from infer.serve.server import EngineSettings, running_server_process
from infer.serve.vllm_server import run_vllm_bench, running_vllm_server, vllm_missing_reason

pytestmark = pytest.mark.skipif(vllm_missing_reason() is not None, reason=str(vllm_missing_reason()))

INPUT_LEN, OUTPUT_LEN, NUM_PROMPTS, CONCURRENCY = 128, 32, 64, 8
ROUNDS = 4  # a run lasts seconds, and in CI another test worker shares the 2 cores: best of several
# Both clients measure one server; the course's client is asyncio Python in the test worker, vLLM's
# an aiohttp process of its own. With the other test worker busy on the same 2 cores, the Python
# client was seen to read up to 20% less (444 vs 538 tok/s, best of 4): a starved client, not a
# different definition. A wrong duration or token count would be off by far more.
AGREEMENT = 0.25


@pytest.fixture(scope="module")
def model_folder(tiny, tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("INFER_EXPORT_DIR", str(tmp_path_factory.mktemp("export")))
    return export_model(tiny)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def course_server_url(tmp_path_factory):
    """The course server in a process of its own, as vLLM's runs: no client shares its interpreter."""
    settings = EngineSettings(max_num_seqs=CONCURRENCY, max_model_len=512, max_num_batched_tokens=512)
    log = tmp_path_factory.mktemp("course_server") / "server.log"
    with running_server_process("cpu", settings, log) as url:
        yield url


def vllm_bench(url, model_folder, result_dir, name, **kwargs):
    return run_vllm_bench(
        url,
        "tiny",
        model_folder,
        result_dir,
        name,
        num_prompts=NUM_PROMPTS,
        input_len=INPUT_LEN,
        output_len=OUTPUT_LEN,
        max_concurrency=CONCURRENCY,
        **kwargs,
    )


def test_vllm_bench_serve_against_the_course_server_agrees_with_the_course_client(
    course_server_url, model_folder, tiny, tmp_path
):
    workload = workload_for_model(tiny.config, NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN)
    theirs, ours = [], []
    for round_ in range(ROUNDS):  # interleaved, so that a slow spell of the machine hits both clients
        theirs.append(vllm_bench(course_server_url, model_folder, tmp_path, f"vllm_client_{round_}"))
        ours.append(run_benchmark(course_server_url, "tiny", workload, max_concurrency=CONCURRENCY, progress=False)[0])
    for result in theirs:
        assert result["failed"] == 0 and result["completed"] == NUM_PROMPTS
        assert result["total_output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
    for key in ("output_throughput", "median_tpot_ms"):
        theirs_best = max(r[key] for r in theirs) if "throughput" in key else min(r[key] for r in theirs)
        ours_best = max(r[key] for r in ours) if "throughput" in key else min(r[key] for r in ours)
        assert math.isclose(ours_best, theirs_best, rel_tol=AGREEMENT), (
            f"{key}: course client {ours_best:.2f}, vLLM's client {theirs_best:.2f} (each the best of {ROUNDS} runs)"
        )


def test_the_course_client_against_vllms_server(model_folder, tiny, tmp_path):
    workload = workload_for_model(tiny.config, 16, INPUT_LEN, OUTPUT_LEN, seed=1)
    with running_vllm_server(model_folder, "tiny", tmp_path / "vllm_server.log", max_model_len=512) as url:
        result, records = run_benchmark(url, "tiny", workload, max_concurrency=CONCURRENCY, progress=False)
    assert result["failed"] == 0 and result["completed"] == 16, result["errors"]
    assert result["total_input_tokens"] == 16 * INPUT_LEN and result["total_output_tokens"] == 16 * OUTPUT_LEN
    assert all(r.num_output_tokens == OUTPUT_LEN for r in records)
