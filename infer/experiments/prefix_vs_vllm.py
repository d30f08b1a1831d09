"""Week 08 against vLLM: requests that share a long system prompt, served by vLLM's CPU server and
by the course server with its paged store and prefix caching, both measured by vLLM's own client.

    python -m infer.experiments.prefix_vs_vllm      # writes results/08_prefix_vs_vllm_<profile>.json

Every prompt is one 1,024-token system prompt, the same for all, then 32 tokens of its own, and
asks for 64 tokens (`vllm bench serve --dataset-name random --random-prefix-len 1024
--random-input-len 32 --random-output-len 64`), 4 in flight at a time. Both servers cache
prefixes: vLLM's V1 engine by default, the course server with `kv_store="paged",
enable_prefix_caching=True`, in blocks of 16; vLLM's CPU build in its default blocks of 128 (no
`--block-size` is passed), and 1,024 is a multiple of both. The client's ready check and warm-up
send the first prompt before its timed run, so the timed prompts find the system prompt cached and
compute only their own tokens: what is compared is how fast each server serves a warm system
prompt. Each server's /metrics says how much of the prompts it found cached, so that a server that
missed the prefix shows.

Rounds: vLLM, then the course server, three times, both servers running throughout (the harness of
side_by_side.py: the exported weights, the servers' logs and cores). Each round draws new prompts
(its own seed, so its own system prompt): a round never finds a previous round's whole prompts
cached. The summary holds each server's output throughput, median TTFT and median TPOT, median
over the rounds with their range, and course / vLLM of throughput and TTFT, taken within each round.
"""

import argparse
import itertools
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import httpx

from infer.experiments.rounds import MIN_ROUNDS, format_spread, interleaved_rounds, ratio_spread, spread
from infer.experiments.side_by_side import cores_used
from infer.metrics import save_results
from infer.models import load_model
from infer.profiles import dtype_name, pick_profile
from infer.provenance import provenance
from infer.serve.export import export_model
from infer.serve.metrics import read_metrics
from infer.serve.server import EngineSettings, running_server_process
from infer.serve.vllm_server import KV_CACHE_GIB, run_vllm_bench, running_vllm_server

PREFIX_LEN, SUFFIX_LEN, OUTPUT_LEN = 1024, 32, 64
CONCURRENCY, NUM_PROMPTS = 4, 32  # 32 prompts: 8 per slot, and three beyond a p90
# 1,120 tokens a request, and room for the few that the client's decode and re-encode of a random prompt may add
MAX_MODEL_LEN = 1152
SETTINGS = EngineSettings(
    max_num_seqs=CONCURRENCY, max_model_len=MAX_MODEL_LEN, kv_store="paged", enable_prefix_caching=True
)
KEPT_KEYS = ("completed", "failed", "duration", "output_throughput", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms")
COMPARED = ("output_throughput", "median_ttft_ms")
SUMMARIZED = (*COMPARED, "median_tpot_ms")  # each server's, over the rounds


def bench(url: str, lm, folder: Path, result_dir: Path, name: str, seed: int) -> dict:
    """vLLM's client with the shared-prefix workload of `seed` against the server at `url`."""
    result = run_vllm_bench(
        url,
        lm.name,
        folder,
        result_dir,
        name,
        num_prompts=NUM_PROMPTS,
        input_len=SUFFIX_LEN,
        output_len=OUTPUT_LEN,
        random_prefix_len=PREFIX_LEN,
        max_concurrency=CONCURRENCY,
        seed=seed,
    )
    return {key: result[key] for key in KEPT_KEYS}


def seeded_by_round(run: Callable[[int], dict]) -> Callable[[], dict]:
    """`run`, called with its round's index (the workload's seed) each time it is called."""
    rounds = itertools.count()
    return lambda: run(next(rounds))


def prefix_hit_rates(course_metrics: str, vllm_metrics: str) -> dict:
    """Prompt tokens each server found in its prefix cache over those it looked up, since it
    started (the clients' warm-ups included), from the text of each server's /metrics."""
    vllm = read_metrics(vllm_metrics)
    return {
        "vllm-server": vllm["vllm:prefix_cache_hits_total"] / vllm["vllm:prefix_cache_queries_total"],
        "course-server": read_metrics(course_metrics)["infer:prefix_cache_hit_rate"],
    }


def run_servers(lm, rounds: int, log_dir: Path) -> tuple[dict[str, list[dict]], dict, dict]:
    """Both servers, each a process of its own (logs in `log_dir`), serving the workload in
    interleaved rounds; then each one's prefix-cache hit rate, and the cores each computed on."""
    log_dir.mkdir(parents=True, exist_ok=True)
    folder, bench_dir = export_model(lm), log_dir / "bench"
    course_log, vllm_log = log_dir / "course_server_prefix.log", log_dir / "vllm_server_prefix.log"
    with (
        running_server_process(lm.profile.name, SETTINGS, course_log) as course_url,
        # vLLM last: on a GPU it claims a share of what the course server left free (cuda_memory_share)
        running_vllm_server(
            folder, lm.name, vllm_log, dtype=dtype_name(lm.dtype), max_model_len=MAX_MODEL_LEN
        ) as vllm_url,
    ):
        servers = {"vllm-server": vllm_url, "course-server": course_url}
        runs = interleaved_rounds(
            {
                name: seeded_by_round(
                    lambda seed, name=name, url=url: bench(url, lm, folder, bench_dir, f"{name}_prefix_{seed}", seed)
                )
                for name, url in servers.items()
            },
            rounds,
        )
        hit_rates = prefix_hit_rates(httpx.get(f"{course_url}/metrics").text, httpx.get(f"{vllm_url}/metrics").text)
    return runs, hit_rates, cores_used(course_log, vllm_log)


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Each server's output throughput, median TTFT and median TPOT over the rounds (median and
    range), its failed requests, and course / vLLM of throughput and TTFT, taken within each round."""
    return {
        "rounds": len(runs["course-server"]),
        "round_order": list(runs),
        "servers": {
            name: {
                **{key: spread([r[key] for r in results]) for key in SUMMARIZED},
                "failed": sum(r["failed"] for r in results),
            }
            for name, results in runs.items()
        },
        "course_vs_vllm": {key: ratio_spread(runs["course-server"], runs["vllm-server"], key) for key in COMPARED},
    }


def format_summary(summary: dict) -> str:
    lines = [
        f"{name:>13}: {format_spread(s['output_throughput'], '.1f')} output tok/s, median TTFT "
        f"{format_spread(s['median_ttft_ms'], '.1f')} ms, "
        # results saved before the TPOT was summarized lack it
        + (f"median TPOT {format_spread(s['median_tpot_ms'], '.2f')} ms, " if "median_tpot_ms" in s else "")
        + f"{s['failed']} failed"
        for name, s in summary["servers"].items()
    ]
    ratios = summary["course_vs_vllm"]
    lines.append(
        f"course / vLLM, within each round: output throughput {format_spread(ratios['output_throughput'])}, "
        f"median TTFT {format_spread(ratios['median_ttft_ms'])}"
    )
    lines.append(
        "prefix-cache hit rate since start: "
        + ", ".join(f"{name} {rate:.0%}" for name, rate in summary["prefix_cache_hit_rate"].items())
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        prog="python -m infer.experiments.prefix_vs_vllm",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS, help=f"interleaved rounds (default {MIN_ROUNDS})")
    parser.add_argument("--log-dir", default="_build/serve_logs")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    profile = pick_profile()
    lm = load_model(profile=profile, weights="random")
    runs, hit_rates, cores = run_servers(lm, args.rounds, Path(args.log_dir))
    summary = {**summarize(runs), "prefix_cache_hit_rate": hit_rates}
    path = save_results(
        f"08_prefix_vs_vllm_{profile.name}",
        [{"system": name, "round": index, **r} for name, results in runs.items() for index, r in enumerate(results)],
        provenance(lm),
        summary=summary,
        workload={
            "client": "vllm bench serve, random dataset, greedy, EOS ignored",
            "prefix_len": PREFIX_LEN,
            "suffix_len": SUFFIX_LEN,
            "output_len": OUTPUT_LEN,
            "max_concurrency": CONCURRENCY,
            "num_prompts": NUM_PROMPTS,
            "seed": "the round's index",
        },
        settings={
            "engine": asdict(SETTINGS),
            "vllm": {"dtype": dtype_name(lm.dtype), "VLLM_CPU_KVCACHE_SPACE_GiB": KV_CACHE_GIB},
            "cores": cores,
            "wall_s": time.perf_counter() - started,
        },
    )
    print(format_summary(summary))
    print(f"saved {path} in {(time.perf_counter() - started) / 60:.1f} minutes")
    return summary


if __name__ == "__main__":
    main()
