"""How close is one engine step to what this machine allows? (week 09's first measurement)

    python -m infer.experiments.step_roofline        # about 3 minutes on two cores

The roofline of this machine, measured on one thread (a square matmul for the compute roof, a large
copy for memory bandwidth: `infer.roofline.measure_roofline`), gives each engine step a floor: its
FLOPs at the compute roof or its bytes at the bandwidth roof, whichever takes longer. A decode step
of `batch` sequences reads every weight once, and each sequence's cached keys and values
(`decode_step_cost`). Timed on the engine itself (week 08's `indirection_cost`: the slot store and
the paged store, in interleaved rounds, one thread), each step is reported as the fraction of that
floor it reaches: 1.0 would be a step that runs at this machine's limit.

Two models: the cpu profile's tiny one, where the floor is small and every per-step cost of Python
and small kernels shows, and Qwen2.5-0.5B's shapes (random weights), whose GEMMs dominate a batch of
32. Writes results/09_step_roofline_<profile>.json.
"""

import argparse
from dataclasses import asdict

from infer.experiments.paged_kv import indirection_cost
from infer.metrics import save_results
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.roofline import ForwardCost, MeasuredRoofline, forward_cost, measure_roofline
from infer.timing import cpu_threads

THREADS = 1  # as every CPU measurement of the engine's steps in this course (week 06, week 08)
# (model, batch, context, decode steps timed per round): the 0.5B model's steps take ~0.5 s each here
CASES = (("tiny", 32, 288, 20), ("qwen2.5-0.5b", 32, 64, 4))


def decode_step_cost(config, batch: int, context: int, bytes_per_element: int, new_tokens: int = 1) -> ForwardCost:
    """One decode step of `batch` sequences with `context` cached tokens each, `new_tokens` each (more
    than 1: a speculative step verifying guesses): every weight read once for the whole batch;
    FLOPs, KV and activation bytes once per sequence."""
    one = forward_cost(config, new_tokens, context, bytes_per_element)
    return ForwardCost(
        flops=batch * one.flops,
        weight_bytes=one.weight_bytes,
        kv_bytes=batch * one.kv_bytes,
        linear_activation_bytes=batch * one.linear_activation_bytes,
        attention_activation_bytes=batch * one.attention_activation_bytes,
    )


def floor_ms(cost: ForwardCost, roofline: MeasuredRoofline) -> tuple[float, str]:
    """The least time a step of `cost` can take on this roofline, and which roof sets it."""
    compute_s, memory_s = cost.flops / roofline.peak_flops, cost.bytes / roofline.bandwidth
    return max(compute_s, memory_s) * 1e3, "compute" if compute_s >= memory_s else "memory"


def step_against_roofline(lm, roofline: MeasuredRoofline, batch: int, context: int, steps: int, rounds: int) -> dict:
    model = Transformer.from_hf(lm.model)
    timed = indirection_cost(model, batch=batch, context=context, steps=steps, rounds=rounds)
    cost = decode_step_cost(lm.config, batch, context, lm.dtype.itemsize)
    floor, bound_by = floor_ms(cost, roofline)
    return {
        "model": lm.name,
        "batch": batch,
        "context": context,
        "cost": {**asdict(cost), "bytes": cost.bytes},
        "floor_ms": floor,
        "bound_by": bound_by,
        "stores": {
            name: {"step_ms": step, "fraction_of_roofline": floor / step["median"]}
            for name, step in timed["decode_step_ms"].items()
        },
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.step_roofline", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    profile = pick_profile()
    with cpu_threads(THREADS if profile.device == "cpu" else None):
        roofline = measure_roofline(profile)
        print(roofline, flush=True)
        cases = []
        for name, batch, context, steps in CASES:
            lm = load_model(name, profile=profile, weights="random")
            cases.append(step_against_roofline(lm, roofline, batch, context, steps, args.rounds))
            for store, row in cases[-1]["stores"].items():
                print(
                    f"{name}, batch {batch}, context {context}, {store}: {row['step_ms']['median']:.2f} ms a step "
                    f"(floor {cases[-1]['floor_ms']:.2f} ms, {cases[-1]['bound_by']}-bound): "
                    f"{row['fraction_of_roofline']:.0%} of the roofline",
                    flush=True,
                )
        meta = provenance(profile, cpu_threads=THREADS if profile.device == "cpu" else None)
    roof = {"peak_flops": roofline.peak_flops, "bandwidth": roofline.bandwidth, "ridge_point": roofline.ridge_point}
    path = save_results(f"09_step_roofline_{profile.name}", cases, meta, roofline=roof, rounds=args.rounds)
    print(f"wrote {path}")
    return {"roofline": roof, "cases": cases}


if __name__ == "__main__":
    main()
