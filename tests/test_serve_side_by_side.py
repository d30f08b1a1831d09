"""infer.experiments.side_by_side without servers: medians over interleaved rounds, the ratios
taken within each round, the table and the figure from given runs, the cores read from the servers'
logs; and the commands it would run for vLLM."""

import pytest

from infer.experiments.side_by_side import (
    CONCURRENCY,
    KEPT_KEYS,
    cores_used,
    format_table,
    median_rows,
    plot_side_by_side,
    run_row,
    summarize,
)
from infer.provenance import provenance
from infer.serve.vllm_server import bench_command, gpu_commands, server_command

ROUNDS = 3
BASE = {
    "transformers-sequential": 100.0,
    "course-server": 300.0,
    "course-server-in-process": 250.0,
    "vllm-server": 400.0,
}
COURSE_SPEED_BY_ROUND = (1.0, 1.1, 0.8)  # course / vLLM: 0.75, 0.825, 0.6 in rounds 0, 1, 2
TPOT_MS = {"course-server": 30.0, "vllm-server": 20.0}  # course / vLLM: 1.5


def run(system, concurrency, round_index, num_prompts=128):
    speed = COURSE_SPEED_BY_ROUND[round_index] if system == "course-server" else 1.0
    throughput = BASE[system] * concurrency**0.5 * speed
    result = {key: 1.0 for key in KEPT_KEYS}
    result.update(
        num_prompts=num_prompts,
        completed=num_prompts,
        failed=0,
        output_throughput=throughput,
        request_throughput=throughput / 64,
        median_tpot_ms=TPOT_MS.get(system, 10.0),
    )
    if system.startswith("course-server"):
        result["breakdown"] = {"forward": 10.0 + round_index, "sse": 1.0, "steps": 100.0}
    return run_row(system, concurrency, round_index, result)


RUNS = [run(system, c, r) for c in CONCURRENCY for r in range(ROUNDS) for system in BASE]


def test_ratios_are_taken_within_each_round_then_summarized():
    summary = summarize(RUNS, ROUNDS)
    assert summary["concurrency"] == max(CONCURRENCY) and summary["rounds"] == ROUNDS
    ratio = summary["course_vs_vllm_output_throughput"]
    assert ratio["per_round"] == pytest.approx([0.75, 0.825, 0.6])
    assert (ratio["median"], ratio["min"], ratio["max"]) == pytest.approx((0.75, 0.6, 0.825))
    assert summary["course_vs_sequential_output_throughput"]["median"] == pytest.approx(3.0)
    assert summary["split_vs_in_process_output_throughput"]["median"] == pytest.approx(1.2)
    assert summary["course_vs_vllm_median_tpot_c1"]["median"] == pytest.approx(1.5)
    assert summary["target_met"] == {"output_throughput_c32": False, "median_tpot_c1": False}
    assert "course_vs_vllm_output_throughput" not in summarize([r for r in RUNS if r["system"] != "vllm-server"], 3)


def test_medians_over_rounds_keep_the_throughputs_range():
    rows = {(r["system"], r["max_concurrency"]): r for r in median_rows(RUNS)}
    course = rows[("course-server", 4)]
    assert course["rounds"] == ROUNDS
    assert course["output_throughput"] == pytest.approx(600.0)
    assert (course["output_throughput_min"], course["output_throughput_max"]) == pytest.approx((480.0, 660.0))
    assert course["breakdown"] == {"forward": 11.0, "sse": 1.0, "steps": 100.0}, "each part's median over the rounds"
    assert "breakdown" not in rows[("vllm-server", 4)]


def test_table_shows_a_p90_only_where_the_requests_support_it_and_the_figure(tiny):
    medians = median_rows(RUNS)
    table = format_table(medians)
    assert table.count("\n") == len(medians) and "vllm-server" in table and " - " not in table
    few = format_table(median_rows([run("course-server", 1, r, num_prompts=10) for r in range(ROUNDS)]))
    assert " - " in few  # 10 requests: one beyond p90, too few to place it
    path = plot_side_by_side(medians, provenance(tiny))
    assert path.exists() and path.stat().st_size > 10_000


def test_cores_are_read_from_the_servers_logs(tmp_path):
    course, in_process, vllm = tmp_path / "course.log", tmp_path / "in_process.log", tmp_path / "vllm.log"
    course.write_text("device: cpu (2 threads) | model: tiny\nengine core: process 123, 1 torch thread(s)\n")
    in_process.write_text("device: cpu (2 threads) | model: tiny (3.0M params) | weights: random\n")
    vllm.write_text(
        "INFO OpenMP thread binding info:\n\tlocal_rank=0, core ids=[1]\n\treserved_cpus=[0]\n"
        "INFO Reducing Torch threads from 2 to 1 for serving.\n"
    )
    cores = cores_used(course, vllm, in_process)
    assert "engine core on 1 torch thread(s), in a process of its own" in cores["course-server"]
    assert cores["course-server-in-process"].startswith("cpu (2 threads), in one process")
    assert "cores [1]" in cores["vllm-server"] and "cores [0] reserved" in cores["vllm-server"]
    assert "from 2 to 1" in cores["vllm-server"]
    assert set(cores_used(course, None)) == {"course-server"}


def test_vllm_commands_stay_on_loopback_and_carry_the_workload():
    serve = server_command("folder", "tiny", 8123)
    assert serve[serve.index("--host") + 1] == "127.0.0.1" and "--served-model-name" in serve
    bench = bench_command(
        "http://127.0.0.1:8123",
        "tiny",
        "folder",
        num_prompts=8,
        input_len=32,
        output_len=4,
        max_concurrency=2,
        result_dir="out",
        result_filename="r.json",
        goodput={"ttft": 200},
    )
    for flag, value in (
        ("--random-input-len", "32"),
        ("--random-output-len", "4"),
        ("--max-concurrency", "2"),
        ("--goodput", "ttft:200"),
        ("--num-prompts", "8"),
    ):
        assert bench[bench.index(flag) + 1] == value
    assert "--ignore-eos" in bench
    commands = gpu_commands()
    assert "--max-num-batched-tokens" in commands["serve"] and "--goodput" in commands["bench"]
    assert "vllm bench sweep serve" in commands["sweep"] and "budgets.json" in commands["sweep"]
    assert "--ignore-eos" in commands["bench"], "a fixed-length benchmark must not stop at an end-of-sequence token"
