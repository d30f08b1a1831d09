"""infer.experiments.prefix_vs_vllm without servers: the workload each run asks vLLM's client for,
a new one each round, the ratios taken within each round, and the hit rates read from both
servers' /metrics."""

from types import SimpleNamespace

import pytest

from infer.experiments import prefix_vs_vllm
from infer.experiments.prefix_vs_vllm import (
    KEPT_KEYS,
    MAX_MODEL_LEN,
    OUTPUT_LEN,
    PREFIX_LEN,
    SETTINGS,
    SUFFIX_LEN,
    format_summary,
    prefix_hit_rates,
    seeded_by_round,
    summarize,
)
from infer.experiments.rounds import interleaved_rounds


def result(output_throughput: float, median_ttft_ms: float, median_tpot_ms: float = 1.0) -> dict:
    return {key: 1.0 for key in KEPT_KEYS} | {
        "failed": 0,
        "output_throughput": output_throughput,
        "median_ttft_ms": median_ttft_ms,
        "median_tpot_ms": median_tpot_ms,
    }


RUNS = {
    "vllm-server": [result(100.0, 20.0), result(200.0, 10.0), result(100.0, 20.0)],
    "course-server": [result(80.0, 30.0, 6.0), result(100.0, 30.0, 9.0), result(90.0, 40.0, 8.0)],
}


def test_ratios_are_taken_within_each_round_then_summarized():
    summary = summarize(RUNS)
    assert summary["rounds"] == 3 and summary["round_order"] == ["vllm-server", "course-server"]
    throughput = summary["course_vs_vllm"]["output_throughput"]
    assert throughput["per_round"] == pytest.approx([0.8, 0.5, 0.9])
    assert (throughput["median"], throughput["min"], throughput["max"]) == pytest.approx((0.8, 0.5, 0.9))
    assert summary["course_vs_vllm"]["median_ttft_ms"]["per_round"] == pytest.approx([1.5, 3.0, 2.0])
    vllm = summary["servers"]["vllm-server"]
    assert (vllm["output_throughput"]["median"], vllm["output_throughput"]["max"]) == (100.0, 200.0)
    assert vllm["failed"] == 0
    text = format_summary({**summary, "prefix_cache_hit_rate": {"vllm-server": 0.93, "course-server": 0.9}})
    assert "output throughput 0.80 (0.50-0.90 over 3 rounds)" in text and "course-server 90%" in text

    course = summary["servers"]["course-server"]
    assert course.get("median_tpot_ms") == {"median": 8.0, "min": 6.0, "max": 9.0, "per_round": [6.0, 9.0, 8.0]}, (
        "each server's median TPOT over the rounds belongs in the summary: it says how much of a throughput gap is "
        "time per token"
    )
    assert "median TPOT 8.00 (6.00-9.00 over 3 rounds) ms" in text, f"the printed summary shows the TPOT:\n{text}"
    for server in summary["servers"].values():
        del server["median_tpot_ms"]
    older = format_summary({**summary, "prefix_cache_hit_rate": {"vllm-server": 0.93, "course-server": 0.9}})
    assert "median TPOT" not in older, "a results file saved before the TPOT was summarized still prints"


def test_each_run_asks_for_the_shared_prefix_workload_with_its_rounds_seed(monkeypatch):
    calls = []

    def fake_bench(url, model, tokenizer, result_dir, name, **kwargs):
        calls.append((name, kwargs))
        return result(50.0, 5.0) | {"extra": "not kept"}

    monkeypatch.setattr(prefix_vs_vllm, "run_vllm_bench", fake_bench)
    lm = SimpleNamespace(name="tiny")
    run = seeded_by_round(lambda seed: prefix_vs_vllm.bench("url", lm, "folder", "out", f"run{seed}", seed))
    runs = interleaved_rounds({"course-server": run}, rounds=3)
    assert [name for name, _ in calls] == ["run0", "run1", "run2"]
    assert [kwargs["seed"] for _, kwargs in calls] == [0, 1, 2], "each round draws new prompts, a new prefix too"
    assert calls[0][1] | {"seed": None} == {
        "num_prompts": 32,
        "input_len": SUFFIX_LEN,
        "output_len": OUTPUT_LEN,
        "random_prefix_len": PREFIX_LEN,
        "max_concurrency": 4,
        "seed": None,
    }
    assert set(runs["course-server"][0]) == set(KEPT_KEYS)


def test_the_course_server_caches_prefixes_and_fits_a_whole_request():
    assert SETTINGS.kv_store == "paged" and SETTINGS.enable_prefix_caching
    assert MAX_MODEL_LEN >= PREFIX_LEN + SUFFIX_LEN + OUTPUT_LEN


def test_hit_rates_come_from_each_servers_own_counters():
    vllm = "\n".join(
        [
            "# TYPE vllm:prefix_cache_queries counter",
            'vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 4000.0',
            'vllm:prefix_cache_queries_created{engine="0",model_name="tiny"} 1.7e9',
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 3000.0',
        ]
    )
    course = 'infer:prefix_cache_hit_rate{model_name="tiny"} 0.9'
    assert prefix_hit_rates(course, vllm) == pytest.approx({"vllm-server": 0.75, "course-server": 0.9})
