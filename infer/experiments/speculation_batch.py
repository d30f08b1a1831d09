"""Speculation inside the engine, as the batch grows (week 10, issue 34 item 4).

    python -m infer.experiments.speculation_batch        # about 2 minutes on two cores

The course's own weights (tiny, and tiny-draft as the draft) serve B requests at once, greedy, 64
new tokens each, on the engine with no speculation, with n-gram prompt lookup and with the draft
model (`Engine(..., speculative=SpeculativeConfig(...))`), for B = 1, 4, 16 and 32, on two kinds of
prompt: windows of held-out Python (code repeats its identifiers, so lookup finds guesses) and the
same windows with their bytes shuffled (nothing in them to look up). Every configuration runs once
per round, in turn, on one thread; every speculative output is checked against the plain engine's.

Reported per configuration: output tokens per second and the speed-up over the plain engine
(medians over the rounds), the acceptance rate, the tokens a sequence gains per verifying step,
and two predictions of the speed-up from the acceptance and the step costs:

- `predicted_speedup`: tokens per verifying step x (a plain step's time / a speculative step's
  time), both step times measured in the same rounds: what the speed-up must be if the rest of the
  run costs nothing;
- `predicted_speedup_iid`: the same with the tokens per step of the textbook model (Leviathan et
  al. 2023), (1 - a^(k+1)) / (1 - a) for an acceptance rate a that is the same at every position.

Beside the measurements, what a roofline predicts for prompt lookup at the batch-1 acceptance
rate, batch by batch: on this CPU's measured roofline, and on an H100's datasheet roofline with the
gpu profile's model (SIMULATED: nothing of it runs here). A verifying step's K + 1 rows a sequence
ride on the same weight read as a plain step's one, so speculation is nearly free while the step is
memory-bound and costs K + 1 times the arithmetic once it is compute-bound.

Writes results/10_speculation_batch_<profile>.json and figures/10_speculation_batch.png.
"""

import argparse
import random
import statistics
import time
from dataclasses import dataclass

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from infer.engine import Engine
from infer.engine.sequence import SamplingParams
from infer.engine.speculation import SpeculativeConfig
from infer.experiments.chunked_prefill_run import GPU_ROOFLINE
from infer.experiments.rounds import spread
from infer.experiments.speculation import course_models, held_out_prompts
from infer.experiments.step_roofline import decode_step_cost, floor_ms
from infer.metrics import save_results
from infer.models import MODEL_SPECS
from infer.plotting import save_figure
from infer.profiles import PROFILES, pick_profile
from infer.provenance import provenance
from infer.roofline import measure_roofline
from infer.timing import cpu_threads

THREADS = 1
BATCHES = (1, 4, 16, 32)
ROOFLINE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ROOFLINE_CONTEXT = 256  # cached tokens a sequence, for the predicted steps
PROMPT_BYTES, NEW_TOKENS, K = 192, 64, 3
METHODS = ("none", "ngram", "draft_model")
PROMPT_KINDS = ("python", "shuffled")


def shuffled(prompts: list[list[int]], seed: int = 0) -> list[list[int]]:
    """The same bytes in a random order: the text's statistics without its repeats."""
    rng = random.Random(seed)
    return [rng.sample(prompt, len(prompt)) for prompt in prompts]


def expected_tokens_per_step(acceptance_rate: float, k: int) -> float:
    """Tokens a verifying step yields when each guess is accepted with the same probability, on its
    own: 1 + a + a^2 + ... + a^k (the last term counts the target's own token after k right guesses)."""
    return sum(acceptance_rate**i for i in range(k + 1))


@dataclass(frozen=True)
class Roof:
    peak_flops: float
    bandwidth: float  # bytes/s


def roofline_speedups(config, bytes_per_element: int, roof, overhead_ms: float, tokens_per_step: float) -> list[dict]:
    """The speed-up a roofline predicts for prompt lookup (a proposer that costs nothing) at each batch
    of ROOFLINE_BATCHES: `tokens_per_step` x (a plain decode step's floor / a verifying step's floor),
    each floor the longer of its FLOPs at `roof.peak_flops` and its bytes at `roof.bandwidth`, plus a
    fixed `overhead_ms` per step. The verifying step's K + 1 rows a sequence share the plain step's
    weight read; they multiply its FLOPs."""
    rows = []
    for batch in ROOFLINE_BATCHES:
        plain, verify = (
            floor_ms(decode_step_cost(config, batch, ROOFLINE_CONTEXT, bytes_per_element, new_tokens), roof)
            for new_tokens in (1, K + 1)
        )
        rows.append(
            {
                "batch": batch,
                "plain_step_ms": plain[0] + overhead_ms,
                "verifying_step_ms": verify[0] + overhead_ms,
                "verifying_step_bound_by": verify[1],
                "speedup": tokens_per_step * (plain[0] + overhead_ms) / (verify[0] + overhead_ms),
            }
        )
    return rows


def serve(target, draft, prompts: list[list[int]], method: str) -> dict:
    """One run: every prompt at once, greedy, NEW_TOKENS each."""
    speculative = None
    if method != "none":
        speculative = SpeculativeConfig(method, K, draft_model=draft if method == "draft_model" else None)
    batch = len(prompts)
    engine = Engine(
        target,
        "continuous",
        max_num_seqs=batch,
        max_num_batched_tokens=batch * (PROMPT_BYTES + K + 1),
        max_model_len=PROMPT_BYTES + NEW_TOKENS + K + 16,
        speculative=speculative,
    )
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    results = engine.generate(prompts, params, progress=False)
    seconds = time.perf_counter() - start
    stats = engine.stats()
    return {
        "tokens": [r.token_ids for r in results],
        "seconds": seconds,
        "steps": stats.num_steps,
        "draft_tokens": stats.num_draft_tokens,
        "accepted_tokens": stats.num_accepted_tokens,
        "drafts": stats.num_drafts,
    }


def summarize(runs: dict, batch: int, kind: str, method: str) -> dict:
    """Medians over the rounds of one configuration, against the plain engine's runs of its batch and prompts."""
    mine, plain = runs[(batch, kind, method)], runs[(batch, kind, "none")]
    output_tokens = batch * NEW_TOKENS
    throughput = [output_tokens / r["seconds"] for r in mine]
    row = {
        "batch": batch,
        "prompts": kind,
        "method": method,
        "k": 0 if method == "none" else K,
        "output_throughput": spread(throughput),
        "speedup": spread([p["seconds"] / r["seconds"] for p, r in zip(plain, mine)]),
        "steps": mine[0]["steps"],
        "same_tokens_as_plain": all(r["tokens"] == p["tokens"] for p, r in zip(plain, mine)),
    }
    if method != "none":
        drafted, accepted, drafts = mine[0]["draft_tokens"], mine[0]["accepted_tokens"], mine[0]["drafts"]
        rate = accepted / drafted if drafted else 0.0
        # a sequence's verifying step yields its accepted guesses and one token of the target's own
        per_step = (accepted + drafts) / drafts if drafts else 1.0
        plain_step = statistics.median(p["seconds"] / p["steps"] for p in plain)
        spec_step = statistics.median(r["seconds"] / r["steps"] for r in mine)
        row.update(
            acceptance_rate=rate,
            guesses_per_verifying_step=drafted / drafts if drafts else 0.0,
            tokens_per_verifying_step=per_step,
            step_cost_ratio=spec_step / plain_step,
            predicted_speedup=per_step * plain_step / spec_step,
            predicted_speedup_iid=expected_tokens_per_step(rate, K) * plain_step / spec_step,
        )
    return row


def plot(ax, rows: list[dict]) -> None:
    for (kind, method), style in {
        ("python", "ngram"): "o-",
        ("python", "draft_model"): "s-",
        ("shuffled", "ngram"): "o--",
        ("shuffled", "draft_model"): "s--",
    }.items():
        mine = [r for r in rows if (r["prompts"], r["method"]) == (kind, method)]
        ax.errorbar(
            [r["batch"] for r in mine],
            [r["speedup"]["median"] for r in mine],
            yerr=[
                [r["speedup"]["median"] - r["speedup"]["min"] for r in mine],
                [r["speedup"]["max"] - r["speedup"]["median"] for r in mine],
            ],
            fmt=style,
            capsize=3,
            label=f"{method} (k={K}), {kind} prompts",
        )
    ax.axhline(1.0, color="0.4", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(BATCHES, [str(b) for b in BATCHES])
    ax.set_xlabel("requests served at once (batch)")
    ax.set_ylabel("speed-up over the same engine without speculation (x)")
    ax.set_title("Speculation pays at small batches and stops paying as the batch grows")
    ax.legend(fontsize="small")


def plot_predicted(ax, predictions: dict) -> None:
    for name, label in (("cpu", "this CPU's measured roofline"), ("gpu_simulated", "H100 roofline, SIMULATED")):
        part = predictions[name]
        rows = part["rows"]
        ax.plot([r["batch"] for r in rows], [r["speedup"] for r in rows], "o-", label=f"{label}: {part['model']}")
    ax.axhline(1.0, color="0.4", lw=1)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests served at once (batch)")
    ax.set_ylabel("predicted speed-up of prompt lookup (x)")
    ax.set_title(
        f"What a roofline predicts at {predictions['acceptance_rate']:.0%} acceptance (k={K}, "
        f"{predictions['context']} cached tokens)"
    )
    ax.legend(fontsize="small")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.speculation_batch", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    profile = pick_profile()
    with cpu_threads(THREADS if profile.device == "cpu" else None):
        target, draft = course_models(profile)
        python = held_out_prompts(max(BATCHES), PROMPT_BYTES)
        prompts = {"python": python, "shuffled": shuffled(python)}
        configs = [(b, kind, m) for b in BATCHES for kind in PROMPT_KINDS for m in METHODS]
        runs: dict[tuple, list[dict]] = {config: [] for config in configs}
        with tqdm(total=args.rounds * len(configs), desc="speculation, in turns") as bar:
            for _ in range(args.rounds):
                for batch, kind, method in configs:
                    runs[(batch, kind, method)].append(serve(target, draft, prompts[kind][:batch], method))
                    bar.update(1)
        roof = measure_roofline(profile)
        meta = provenance(profile, cpu_threads=THREADS if profile.device == "cpu" else None)
    rows = [summarize(runs, *config) for config in configs if config[2] != "none"]
    for row in rows:
        print(
            f"batch {row['batch']:>2}, {row['prompts']:>8}, {row['method']:>11}: "
            f"accepted {row['acceptance_rate']:.0%}, "
            f"{row['tokens_per_verifying_step']:.2f} tokens a verifying step, speed-up {row['speedup']['median']:.2f}x "
            f"(predicted {row['predicted_speedup']:.2f}x, i.i.d. {row['predicted_speedup_iid']:.2f}x); "
            f"same tokens: {row['same_tokens_as_plain']}",
            flush=True,
        )
    plain = [summarize(runs, *config) for config in configs if config[2] == "none"]
    lookup = next(r for r in rows if (r["batch"], r["prompts"], r["method"]) == (1, "python", "ngram"))
    tokens_per_step = expected_tokens_per_step(lookup["acceptance_rate"], K)
    gpu = PROFILES["gpu"]
    predictions = {
        "acceptance_rate": lookup["acceptance_rate"],
        "tokens_per_step": tokens_per_step,
        "context": ROOFLINE_CONTEXT,
        "cpu": {
            "roof": {"peak_flops": roof.peak_flops, "bandwidth": roof.bandwidth, "overhead_ms": 0.0},
            "model": "tiny, float32",
            "rows": roofline_speedups(target.config, 4, roof, 0.0, tokens_per_step),
        },
        "gpu_simulated": {
            "roof": GPU_ROOFLINE,
            "model": f"{gpu.model_name}, {gpu.dtype}",
            "rows": roofline_speedups(
                MODEL_SPECS[gpu.model_name].config(),
                gpu.dtype.itemsize,
                Roof(GPU_ROOFLINE["peak_flops"], GPU_ROOFLINE["bandwidth"]),
                GPU_ROOFLINE["overhead_ms"],
                tokens_per_step,
            ),
        },
    }
    path = save_results(
        f"10_speculation_batch_{profile.name}",
        rows,
        meta,
        plain=plain,
        k=K,
        prompt_bytes=PROMPT_BYTES,
        new_tokens=NEW_TOKENS,
        rounds=args.rounds,
        model="tiny (course weights); draft tiny-draft (course weights)",
        roofline_predictions=predictions,
    )
    print(f"wrote {path}")
    fig, (measured_ax, predicted_ax) = plt.subplots(1, 2, figsize=(14, 4.5))
    plot(measured_ax, rows)
    plot_predicted(predicted_ax, predictions)
    print(f"wrote {save_figure(fig, '10_speculation_batch', meta)}")
    return rows


if __name__ == "__main__":
    main()
