"""infer.experiments.side_by_side without servers: the summary's ratios, the table and the figure from
given runs; and the commands it would run for vLLM."""

import pytest

from infer.provenance import provenance
from infer.experiments.side_by_side import CONCURRENCY, format_table, plot_side_by_side, summarize
from infer.serve.vllm_server import bench_command, gpu_commands, server_command


def run(system, concurrency, throughput):
    return {"system": system, "max_concurrency": concurrency, "input_len": 256, "output_len": 64, "num_prompts": 64,
            "completed": 64, "failed": 0, "duration": 1.0, "total_output_tokens": 4096,
            "output_throughput": throughput, "request_throughput": throughput / 64, "median_ttft_ms": 10.0,
            "p99_ttft_ms": 20.0, "median_tpot_ms": 2.0, "p99_tpot_ms": 3.0, "median_itl_ms": 2.0, "p99_itl_ms": 4.0,
            "median_e2el_ms": 140.0, "p99_e2el_ms": 200.0}


RUNS = [run(system, c, base * c ** 0.5) for system, base in
        (("transformers-sequential", 100.0), ("course-server", 300.0), ("vllm-server", 400.0)) for c in CONCURRENCY]


def test_summary_ratios_at_the_top_concurrency():
    summary = summarize(RUNS)
    assert summary["concurrency"] == max(CONCURRENCY)
    assert summary["course_vs_vllm_output_throughput"] == pytest.approx(0.75)
    assert summary["course_vs_sequential_output_throughput"] == pytest.approx(3.0)
    assert "course_vs_vllm_output_throughput" not in summarize([r for r in RUNS if r["system"] != "vllm-server"])


def test_table_and_figure(tiny):
    table = format_table(RUNS)
    assert table.count("\n") == len(RUNS) and "vllm-server" in table
    path = plot_side_by_side(RUNS, provenance(tiny))
    assert path.exists() and path.stat().st_size > 10_000


def test_vllm_commands_stay_on_loopback_and_carry_the_workload():
    serve = server_command("folder", "tiny", 8123)
    assert serve[serve.index("--host") + 1] == "127.0.0.1" and "--served-model-name" in serve
    bench = bench_command("http://127.0.0.1:8123", "tiny", "folder", num_prompts=8, input_len=32, output_len=4,
                          max_concurrency=2, result_dir="out", result_filename="r.json", goodput={"ttft": 200})
    for flag, value in (("--random-input-len", "32"), ("--random-output-len", "4"), ("--max-concurrency", "2"),
                        ("--goodput", "ttft:200"), ("--num-prompts", "8")):
        assert bench[bench.index(flag) + 1] == value
    assert "--ignore-eos" in bench
    commands = gpu_commands()
    assert "--max-num-batched-tokens" in commands["serve"] and "--goodput" in commands["bench"]
    assert "vllm bench sweep serve" in commands["sweep"] and "budgets.json" in commands["sweep"]
