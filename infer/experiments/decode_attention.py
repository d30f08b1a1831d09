"""The in-place decode kernel against PyTorch's attention, in the engine (week 09, issue 32 item 3).

    python -m infer.experiments.decode_attention        # about a minute on two cores (and the
                                                        # kernel's first build, about 25 s)

The same decode steps (32 sequences of 288 tokens, tiny model, one thread) on two engines that
differ only in `decode_attention`: "sdpa" gathers every sequence's blocks into one tensor and
calls `scaled_dot_product_attention` with a mask (the slot store reads its slots in place when they
lie side by side), "in_place" runs infer/csrc/paged_decode_attention.cpp, which reads each key
where it lies. On the slot store and on the paged store, in interleaved rounds, with the greedy
tokens compared. Writes results/09_decode_attention_<profile>.json.
"""

import argparse

from infer.experiments.decode_steps import BATCH, CONTEXT, STEPS, WARMUP_STEPS, decode_engine, side_by_side
from infer.metrics import save_results
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.timing import cpu_threads

THREADS = 1
STORES = ("slots", "paged")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.decode_attention", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    profile = pick_profile()
    with cpu_threads(THREADS):
        lm = load_model(profile=profile, quiet=True)
        model = Transformer.from_hf(lm.model)
        steps = WARMUP_STEPS + args.rounds * STEPS
        cases = []
        for store in STORES:
            engines = {
                attention: decode_engine(model, store, steps, decode_attention=attention)
                for attention in ("sdpa", "in_place")
            }
            cases.append({"store": store, **side_by_side(engines, args.rounds, first="sdpa")})
            ms, ratio = cases[-1]["step_ms"], cases[-1]["ratio_to_sdpa"]["in_place"]
            print(
                f"{store}: sdpa {ms['sdpa']['median']:.2f} ms, in_place {ms['in_place']['median']:.2f} ms a step; "
                f"in_place/sdpa {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f} over {args.rounds} "
                f"rounds); same greedy tokens: {cases[-1]['same_greedy_tokens']}",
                flush=True,
            )
        meta = provenance(lm, cpu_threads=THREADS)
    path = save_results(
        f"09_decode_attention_{profile.name}",
        cases,
        meta,
        batch=BATCH,
        context=CONTEXT,
        steps_per_round=STEPS,
        warmup_steps=WARMUP_STEPS,
        rounds=args.rounds,
    )
    print(f"wrote {path}")
    return cases


if __name__ == "__main__":
    main()
