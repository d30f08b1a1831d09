"""The course server beside vLLM's CPU build on a larger model's shapes (week 09; issue 32).

    python -m infer.experiments.larger_model_vs_vllm     # about 10 minutes on two cores

Week 07's side by side serves the tiny model, whose steps are mostly fixed per-step work. Here the
same servers serve Qwen2.5-0.5B's shapes (random weights, float32), where a step's time is
mostly its GEMMs: one wave of 32 requests at once (64 prompt tokens, 32 output tokens each,
greedy, EOS ignored), measured by vLLM's own client in interleaved rounds (vLLM, course, course
with packed linears, vLLM, ...), every server up throughout. The course server runs twice: with
PyTorch's F.linear, and with its linear layers on weights packed once for oneDNN
(`--packed-linears`, infer.cpu_linear), as vLLM's CPU backend packs its own. The engine settings
are week 07's; vLLM's CPU build binds one OpenMP thread and reserves the other core, and each
course server's engine core computes on one thread.

The workload is small because each step is slow here (a prompt token costs about 1 GFLOP): one
wave keeps a run under a minute. Writes results/09_larger_model_vs_vllm_<profile>.json.
"""

import argparse
import time
from dataclasses import asdict, replace
from pathlib import Path

from infer.experiments.rounds import MIN_ROUNDS, format_spread, interleaved_rounds, ratio_spread, spread
from infer.experiments.side_by_side import KEPT_KEYS, bench_server, cores_used, course_cores
from infer.metrics import save_results
from infer.models import load_model
from infer.profiles import dtype_name, pick_profile
from infer.provenance import provenance
from infer.serve.export import export_model
from infer.serve.server import EngineSettings, running_server_process
from infer.serve.vllm_server import KV_CACHE_GIB, running_vllm_server

MODEL = "qwen2.5-0.5b"
CONCURRENCY, NUM_PROMPTS, INPUT_LEN, OUTPUT_LEN = 32, 32, 64, 32
ROUND_ORDER = ("vllm-server", "course-server", "course-server-packed")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.larger_model_vs_vllm", description=__doc__)
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--log-dir", default="_build/serve_logs/larger_model")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    profile = pick_profile()
    lm = load_model(MODEL, profile, weights="random")
    settings = EngineSettings(max_num_seqs=CONCURRENCY)
    log_dir = Path(args.log_dir)
    folder, bench_dir = export_model(lm), log_dir / "bench"
    course_log, vllm_log = log_dir / "course_server.log", log_dir / "server.log"
    packed_log = log_dir / "course_server_packed.log"
    workload = dict(num_prompts=NUM_PROMPTS, input_len=INPUT_LEN, output_len=OUTPUT_LEN)
    rounds = {name: iter(range(args.rounds)) for name in ROUND_ORDER}
    packed = replace(settings, packed_linears=True)
    with (
        running_server_process(profile.name, settings, course_log, model=MODEL) as course_url,
        running_server_process(profile.name, packed, packed_log, model=MODEL) as packed_url,
        running_vllm_server(
            folder, lm.name, vllm_log, dtype=dtype_name(lm.dtype), max_model_len=settings.max_model_len
        ) as vllm_url,
    ):
        urls = {"vllm-server": vllm_url, "course-server": course_url, "course-server-packed": packed_url}

        def runner(name: str):
            return lambda: bench_server(
                urls[name], lm, folder, bench_dir, f"{name}_round{next(rounds[name])}", CONCURRENCY, **workload
            )

        results = interleaved_rounds({name: runner(name) for name in ROUND_ORDER}, args.rounds)
    runs = [
        {"system": name, "round": index, **{key: result[key] for key in KEPT_KEYS}}
        for name, by_round in results.items()
        for index, result in enumerate(by_round)
    ]
    summary = {
        "rounds": args.rounds,
        "medians": {
            name: {key: spread([r[key] for r in by_round]) for key in ("output_throughput", "median_tpot_ms")}
            for name, by_round in results.items()
        },
        **{
            f"{course.replace('-server', '').replace('-', '_')}_vs_vllm_{metric}": ratio_spread(
                results[course], results["vllm-server"], metric
            )
            for course in ("course-server", "course-server-packed")
            for metric in ("output_throughput", "median_tpot_ms")
        },
        "failed": sum(r["failed"] for r in runs),
    }
    path = save_results(
        f"09_larger_model_vs_vllm_{profile.name}",
        runs,
        provenance(lm),
        summary=summary,
        settings={
            "workload": {"concurrency": CONCURRENCY, **workload, "greedy": True, "ignore_eos": True},
            "engine": asdict(settings),
            "engine_packed": asdict(packed),
            "vllm": {"dtype": dtype_name(lm.dtype), "VLLM_CPU_KVCACHE_SPACE_GiB": KV_CACHE_GIB},
            "client": "vllm bench serve for both servers",
            "cores": {**cores_used(course_log, vllm_log), "course-server-packed": course_cores(packed_log)},
            "wall_s": time.perf_counter() - started,
        },
    )
    for name, medians in summary["medians"].items():
        print(
            f"{name}: {format_spread(medians['output_throughput'], '.1f')} output tok/s, "
            f"median TPOT {format_spread(medians['median_tpot_ms'], '.0f')} ms"
        )
    for key in (k for k in summary if "_vs_vllm_" in k):
        print(f"{key}: {format_spread(summary[key])}")
    print(f"failed requests: {summary['failed']}; saved {path}")
    return summary


if __name__ == "__main__":
    main()
