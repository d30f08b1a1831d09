"""Linear layers on pre-packed weights against F.linear, inside one engine (week 09; issue 32).

    python -m infer.experiments.packed_linear       # about 4 minutes on two cores

The same decode steps on two engines whose models differ only in their linear layers: PyTorch's
`F.linear`, and the same weights packed once for oneDNN (infer.cpu_linear). On the tiny model
(32 sequences of 288 tokens) and on Qwen2.5-0.5B's shapes (random weights; 32 sequences of 64
tokens, and one sequence), one thread, in interleaved rounds, with their greedy tokens compared.
Writes results/09_packed_linear_<profile>.json.
"""

import argparse
import copy

from infer.cpu_linear import pack_linears
from infer.experiments.decode_steps import STEPS, WARMUP_STEPS, decode_engine, side_by_side
from infer.metrics import save_results
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.timing import cpu_threads

THREADS = 1
# (model, batch, context): 32 sequences, where the packed product should pay, and one, where it should not
CASES = (("tiny", 32, 288), ("tiny", 1, 288), ("qwen2.5-0.5b", 32, 64), ("qwen2.5-0.5b", 1, 64))


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.packed_linear", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    profile = pick_profile()
    steps = WARMUP_STEPS + args.rounds * STEPS
    runs, models = [], {}
    with cpu_threads(THREADS):
        for name, batch, context in CASES:
            if name not in models:
                plain = Transformer.from_hf(load_model(name, profile, weights="random", quiet=True).model)
                packed = copy.deepcopy(plain)
                pack_linears(packed)
                models[name] = {"F.linear": plain, "packed": packed}
            engines = {
                kernel: decode_engine(model, "slots", steps, batch, context) for kernel, model in models[name].items()
            }
            result = side_by_side(engines, args.rounds, first="F.linear")
            runs.append({"model": name, "batch": batch, "context": context, **result})
            ratio = result["ratio_to_F.linear"]["packed"]
            print(
                f"{name}, {batch} x {context} tokens: F.linear {result['step_ms']['F.linear']['median']:.2f} ms, "
                f"packed {result['step_ms']['packed']['median']:.2f} ms a step; packed / F.linear "
                f"{ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f}); "
                f"same greedy tokens: {result['same_greedy_tokens']}"
            )
    meta = provenance(profile, cpu_threads=THREADS)
    settings = {"rounds": args.rounds, "steps_per_round": STEPS, "warmup_steps": WARMUP_STEPS, "threads": THREADS}
    path = save_results(f"09_packed_linear_{profile.name}", runs, meta, settings=settings)
    print(f"saved {path}")
    return runs


if __name__ == "__main__":
    main()
