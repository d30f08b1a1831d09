"""Does `torch.compile` make the engine's step faster on this machine? (week 09, issue 32 item 3)

    python -m infer.experiments.compiled_step        # about 3 minutes on two cores

vLLM's CPU build compiles its model at startup and caches the result on disk. Here the course's
model is compiled the same way, with `torch.compile(..., dynamic=True)` (one graph for every batch
size), but only where a compiler has something to fuse: each RMSNorm (square, mean, rsqrt, two
products, two casts) and each MLP (its activation and product between the GEMMs). Attention over
the KV store stays eager: the step's index tensors and its per-sequence prefill loop change from
step to step, and compiled they would recompile.

Measured, one thread, decode steps of 32 sequences of 288 tokens on the tiny model:
- the first steps of a compiled engine, in a fresh process, with an empty compile cache (cold)
  and again with the cache the cold run left (warm): what a server's start pays;
- eager against compiled, on the slot store and on the paged store, in interleaved rounds;
- whether the compiled engine's greedy tokens are the eager engine's.
Writes results/09_compiled_step_<profile>.json.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from infer.experiments.decode_steps import BATCH, CONTEXT, STEPS, WARMUP_STEPS, decode_engine, side_by_side
from infer.metrics import save_results
from infer.model import MLP, RMSNorm, Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.timing import cpu_threads

THREADS = 1  # as every CPU measurement of the engine's steps in this course
STORES = ("slots", "paged")


def compiled(model: Transformer) -> Transformer:
    """A copy of `model` whose norms and MLPs are compiled for any number of tokens; its attention
    and projections stay as they are."""
    copied = copy.deepcopy(model)
    for module in copied.modules():
        if isinstance(module, (RMSNorm, MLP)):
            module.forward = torch.compile(module.forward, dynamic=True)
    return copied


def first_steps_s(store: str) -> float:
    """Seconds for a compiled engine's prefill and first decodes, in this process (run in a child)."""
    model = compiled(Transformer.from_hf(load_model(quiet=True).model))
    engine = decode_engine(model, store, WARMUP_STEPS)
    start = time.perf_counter()
    for _ in range(WARMUP_STEPS):
        engine.step()
    return time.perf_counter() - start


def start_times(store: str) -> dict:
    """A compiled engine's first steps in fresh processes: with an empty inductor cache, then with
    the one that run left on disk (the persistent cache a restarted server finds)."""
    with tempfile.TemporaryDirectory(prefix="inductor-cache-") as cache:
        env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS=str(THREADS))
        code = f"from infer.experiments.compiled_step import first_steps_s; print(first_steps_s({store!r}))"
        seconds = {}
        for start in ("cold", "warm"):
            done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            seconds[start] = float(done.stdout.strip().splitlines()[-1])
    return seconds


def eager_against_compiled(model: Transformer, store: str, rounds: int) -> dict:
    """Median ms of a decode step, eager and compiled, in interleaved rounds, and whether the two
    engines' greedy tokens agree over every step they ran."""
    engines = {
        "eager": decode_engine(model, store, WARMUP_STEPS + rounds * STEPS),
        "compiled": decode_engine(compiled(model), store, WARMUP_STEPS + rounds * STEPS),  # compiles in its warm-up
    }
    result = side_by_side(engines, rounds, first="eager")
    return {
        "store": store,
        "decode_step_ms": result["step_ms"],
        "ratio_compiled_over_eager": result["ratio_to_eager"]["compiled"]["median"],
        "same_greedy_tokens": result["same_greedy_tokens"],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.compiled_step", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    profile = pick_profile()
    with cpu_threads(THREADS if profile.device == "cpu" else None):
        starts = {store: start_times(store) for store in STORES}
        print("first steps of a compiled engine (s):", json.dumps(starts), flush=True)
        model = Transformer.from_hf(load_model(profile=profile, quiet=True).model)
        cases = [eager_against_compiled(model, store, args.rounds) for store in STORES]
        for case in cases:
            ms = case["decode_step_ms"]
            print(
                f"{case['store']}: eager {ms['eager']['median']:.2f} ms, compiled {ms['compiled']['median']:.2f} ms "
                f"a step ({case['ratio_compiled_over_eager']:.2f}x); same greedy tokens: {case['same_greedy_tokens']}",
                flush=True,
            )
        meta = provenance(profile, cpu_threads=THREADS if profile.device == "cpu" else None)
    path = save_results(
        f"09_compiled_step_{profile.name}",
        cases,
        meta,
        first_steps_s=starts,
        batch=BATCH,
        context=CONTEXT,
        steps_per_round=STEPS,
        rounds=args.rounds,
        warmup_steps=WARMUP_STEPS,
    )
    print(f"wrote {path}")
    return {"first_steps_s": starts, "cases": cases}


if __name__ == "__main__":
    main()
