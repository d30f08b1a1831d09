"""Decode steps on a GPU with and without its fast paths (week 09's GPU section; issue 33).

    python -m infer.experiments.decode_fast_paths      # on a CUDA GPU; make gpu-check runs it

For every attention kernel the engine can run here (sdpa, and triton and flash-attn where
installed: infer.engine.attention_backends), two engines: eager steps, and decode steps replayed
from CUDA graphs (infer.engine.cuda_graphs). At 1, 8 and 32 sequences of CONTEXT prompt tokens,
the same decode steps of each, in interleaved rounds, reported as medians with their spread:
- what graphs buy: each kernel's eager step against its replayed one;
- tokens: the replayed engine must generate exactly the eager one's greedy tokens (same
  kernels, so any difference is a bug); each kernel's tokens against sdpa's are counted, not
  required (bf16 kernels round differently, so a near tie may go either way);
- the HBM roofline: the bytes a decode step must move at least (every weight once, each
  sequence's keys and values: infer.roofline.forward_cost) over its time, as a share of this
  GPU's measured copy bandwidth.
Writes <out>/09_gpu_fast_paths_<profile>.json; prints the lines make gpu-check puts in its summary.
Without CUDA it says so and stops: graphs and these kernels are GPU-only, and nothing is faked.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from infer.engine.attention_backends import choose_attention
from infer.engine.cuda_graphs import CudaGraph
from infer.experiments.decode_steps import CONTEXT, STEPS, WARMUP_STEPS, decode_engine, timed_rounds
from infer.experiments.rounds import spread
from infer.metrics import results_dir
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import PROFILES, pick_profile
from infer.provenance import provenance
from infer.roofline import forward_cost, measure_copy_bandwidth

KERNELS = ("sdpa", "triton", "flash-attn")
BATCH_SIZES = (1, 8, 32)
ROUNDS = 3
BANDWIDTH_PROBE_MB = 1024


def slot_length(steps: int, context: int = CONTEXT) -> int:
    """A slot long enough for the run, rounded up to 256 positions: flash-attn's paged kernels
    take blocks of a multiple of 256, and a slot is one block."""
    return -(-(context + steps + 16) // 256) * 256


def usable_kernels(model, block_size: int) -> tuple[list[str], dict[str, str]]:
    """The kernels that can run here, and why each other one cannot."""
    usable, reasons = [], {}
    for kernel in KERNELS:
        try:
            choose_attention(kernel, model, block_size)
            usable.append(kernel)
        except ValueError as error:
            reasons[kernel] = str(error)
    return usable, reasons


def roofline_share(model, batch: int, step_ms: float, bandwidth: float, context: int = CONTEXT) -> float:
    """The share of `bandwidth` a decode step of `batch` sequences uses if it moves only what it must."""
    cost = forward_cost(model.config, 1, context, model.embed.weight.element_size())
    step_bytes = cost.weight_bytes + batch * (cost.bytes - cost.weight_bytes)
    return step_bytes / (step_ms / 1e3) / bandwidth


def measure(
    model, batch_sizes=BATCH_SIZES, rounds: int = ROUNDS, graph_type=CudaGraph, bandwidth: float | None = None
) -> dict:
    """The side by side at each batch size (see the module's docstring)."""
    steps = WARMUP_STEPS + rounds * STEPS
    max_model_len = slot_length(steps)
    kernels, unavailable = usable_kernels(model, max_model_len)
    cases = []
    for batch in batch_sizes:
        engines, capture_s = {}, {}
        for kernel in kernels:
            for graphs in (False, graph_type):
                started = time.perf_counter()
                name = f"{kernel} {'graphs' if graphs else 'eager'}"
                options = dict(max_model_len=max_model_len, decode_attention=kernel, cuda_graphs=graphs)
                engines[name] = decode_engine(model, "slots", steps, batch, **options)
                capture_s[name] = time.perf_counter() - started
        step_ms, tokens = timed_rounds(engines, rounds)
        case = {
            "batch": batch,
            "step_ms": {name: spread(values) for name, values in step_ms.items()},
            "engine_start_s": capture_s,
            "graph_speedup": {
                kernel: spread([e / g for e, g in zip(step_ms[f"{kernel} eager"], step_ms[f"{kernel} graphs"])])
                for kernel in kernels
            },
            "graphs_same_tokens_as_eager": {
                kernel: tokens[f"{kernel} graphs"] == tokens[f"{kernel} eager"] for kernel in kernels
            },
            "requests_with_sdpas_tokens": {
                name: sum(tokens[name][r] == tokens["sdpa eager"][r] for r in tokens[name]) for name in engines
            },
            "replayed_steps": {name: engine.runner.num_replays for name, engine in engines.items()},
        }
        if bandwidth:
            case["hbm_roofline_share"] = {
                name: roofline_share(model, batch, spread(values)["median"], bandwidth)
                for name, values in step_ms.items()
            }
        cases.append(case)
        del engines
    return {
        "kernels": kernels,
        "unavailable": unavailable,
        "context": CONTEXT,
        "max_model_len": max_model_len,
        "rounds": rounds,
        "steps_per_round": STEPS,
        "bandwidth_bytes_per_s": bandwidth,
        "cases": cases,
    }


def summary_lines(result: dict) -> list[str]:
    """One line per batch size, as make gpu-check's summary shows them."""
    lines = [f"fast paths: kernels {', '.join(result['kernels'])}"]
    lines += [f"  {kernel} not run: {why}" for kernel, why in result["unavailable"].items()]
    for case in result["cases"]:
        parts = []
        for kernel in result["kernels"]:
            eager, graphs = (case["step_ms"][f"{kernel} {mode}"]["median"] for mode in ("eager", "graphs"))
            share = case.get("hbm_roofline_share", {}).get(f"{kernel} graphs")
            same = "same tokens" if case["graphs_same_tokens_as_eager"][kernel] else "TOKENS DIFFER"
            parts.append(
                f"{kernel} {eager:.2f} -> {graphs:.2f} ms ({case['graph_speedup'][kernel]['median']:.2f}x, {same}"
                + (f", {share:.0%} of HBM roofline)" if share is not None else ")")
            )
        lines.append(f"  batch {case['batch']}: " + "; ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.decode_fast_paths", description=__doc__)
    parser.add_argument("--profile", default=None, choices=sorted(PROFILES), help="default: picked from the hardware")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--out", type=Path, default=None, help="the results folder (default: results/)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_fast_paths needs a CUDA GPU (CUDA graphs, GPU kernels); this machine has none: nothing was run")
        return 2
    profile = pick_profile(args.profile)
    lm = load_model(profile=profile, weights="random", quiet=True)
    model = Transformer.from_hf(lm.model)
    del lm
    bandwidth = measure_copy_bandwidth("cuda", BANDWIDTH_PROBE_MB)
    result = measure(model, rounds=args.rounds, bandwidth=bandwidth)
    out = args.out or results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"09_gpu_fast_paths_{profile.name}.json"
    path.write_text(json.dumps({"provenance": provenance(profile), **result}, indent=2) + "\n")
    print("\n".join(summary_lines(result)))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
