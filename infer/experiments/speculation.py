"""How much does speculation buy on the course's own weights? (week 10)

    python -m infer.experiments.speculation        # about 3 minutes on two cores

The target is the tiny model and the draft its one-layer sibling, both trained on the standard
library's source (infer.experiments.course_weights). Prompts are windows of held-out Python files.
For each proposer (none, n-gram prompt lookup, the draft) and each k, every prompt is continued
greedily by `speculative_greedy_generate`; the outputs are checked to equal plain greedy decoding,
and we report how many guesses the target accepted, how many tokens each target pass yielded, and
the wall time per generated token. The timings come from interleaved rounds (every configuration
once per round, in turn), on one thread. Writes results/10_speculation_<profile>.json.
"""

import argparse
import statistics
import time

import torch
from tqdm.auto import tqdm

from infer.experiments.rounds import spread
from infer.metrics import save_results
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.speculative import DraftProposer, NgramProposer, speculative_greedy_generate
from infer.timing import cpu_threads
from infer.training import stdlib_corpus

THREADS = 1
PROMPTS, PROMPT_BYTES, NEW_TOKENS = 12, 192, 64
SETTINGS = (("none", 0), ("ngram", 3), ("ngram", 5), ("draft", 3), ("draft", 5))


def course_models(profile) -> tuple[Transformer, Transformer]:
    """The course's trained tiny model and its one-layer draft (infer.experiments.course_weights)."""
    return tuple(
        Transformer.from_hf(load_model(name, profile=profile, weights="course", quiet=True).model)
        for name in ("tiny", "tiny-draft")
    )


def held_out_prompts(count: int, length: int, seed: int = 0) -> list[list[int]]:
    """`count` windows of held-out Python, each starting at a line's beginning."""
    text = stdlib_corpus().held_out
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    while len(prompts) < count:
        start = int(torch.randint(0, len(text) - 2 * length, (1,), generator=generator))
        line = bytes(text[start : start + length].tolist()).find(b"\n") + 1
        prompts.append(text[start + line : start + line + length].tolist())
    return prompts


def run_setting(target, draft, prompts, proposer_name: str, k: int) -> tuple[list[list[int]], dict, float]:
    """(outputs, acceptance, seconds) of one pass over every prompt."""
    outputs, proposed, accepted, passes = [], 0, 0, 0
    start = time.perf_counter()
    for prompt in prompts:
        proposer = (
            DraftProposer(draft, len(prompt) + NEW_TOKENS + 8) if proposer_name == "draft" else NgramProposer()
        )  # with k = 0 ("none") nothing is proposed
        tokens, stats = speculative_greedy_generate(target, prompt, NEW_TOKENS, proposer, k)
        outputs.append(tokens)
        proposed, accepted, passes = proposed + stats.proposed, accepted + stats.accepted, passes + stats.target_passes
    seconds = time.perf_counter() - start
    acceptance = {
        "proposed": proposed,
        "accepted": accepted,
        "acceptance_rate": accepted / proposed if proposed else None,
        "target_passes": passes,
        "tokens_per_target_pass": len(prompts) * NEW_TOKENS / passes,
    }
    return outputs, acceptance, seconds


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.speculation", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    profile = pick_profile()
    with cpu_threads(THREADS if profile.device == "cpu" else None):
        target, draft = course_models(profile)
        prompts = held_out_prompts(PROMPTS, PROMPT_BYTES)
        reference, acceptance, seconds = None, {}, {setting: [] for setting in SETTINGS}
        for _ in tqdm(range(args.rounds), desc="rounds"):
            for setting in SETTINGS:
                outputs, acceptance[setting], took = run_setting(target, draft, prompts, *setting)
                reference = reference or outputs  # the first setting is plain greedy decoding
                if outputs != reference:
                    raise AssertionError(f"{setting} changed a greedy token: speculation must not")
                seconds[setting].append(took / (len(prompts) * NEW_TOKENS) * 1e3)
        meta = provenance(profile, cpu_threads=THREADS if profile.device == "cpu" else None)
    plain = statistics.median(seconds[("none", 0)])
    rows = [
        {
            "proposer": name,
            "k": k,
            **acceptance[(name, k)],
            "ms_per_token": spread(seconds[(name, k)]),
            "speedup_over_greedy": plain / statistics.median(seconds[(name, k)]),
        }
        for name, k in SETTINGS
    ]
    for row in rows:
        rate = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.0%}"
        print(
            f"{row['proposer']:>5} k={row['k']}: accepted {rate}, {row['tokens_per_target_pass']:.2f} tokens a pass, "
            f"{row['ms_per_token']['median']:.2f} ms a token ({row['speedup_over_greedy']:.2f}x greedy)"
        )
    path = save_results(
        f"10_speculation_{profile.name}",
        rows,
        meta,
        prompts=PROMPTS,
        prompt_bytes=PROMPT_BYTES,
        new_tokens=NEW_TOKENS,
        rounds=args.rounds,
        same_tokens_as_greedy=True,  # checked above, every round: the run stops otherwise
    )
    print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
