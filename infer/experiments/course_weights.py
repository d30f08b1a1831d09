"""Train the course's own weights (week 10): the tiny model and a one-layer draft of it, on the
Python standard library's source, byte by byte.

    python -m infer.experiments.course_weights       # about 16 minutes on two cores

Writes infer/weights/tiny.safetensors and infer/weights/tiny-draft.safetensors (bfloat16, which
`load_model(name, weights="course")` loads), and results/10_course_weights.json: the corpus and its
digest, each model's settings, loss curve, held-out bits per byte before and after (scored on the
saved bfloat16 weights), its training time, and a greedy sample. CI never trains; a test trains a
few steps and checks that the loss falls."""

import argparse
import math
import platform
import time

import torch
from safetensors.torch import save_file

from infer.metrics import save_results
from infer.models import COURSE_WEIGHTS, load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.training import bits_per_byte, stdlib_corpus, train

MODELS = ("tiny", "tiny-draft")
SAMPLE_PROMPT = "def "
SAMPLE_BYTES = 160
LOSS_EVERY = 10  # steps between the loss curve's points
BATCH, LENGTH = 16, 256  # windows of bytes a step


def plot_training(ax, runs: list[dict]) -> None:
    """Each model's training loss, in bits per byte (the held-out score's unit), against its steps."""
    for run in runs:
        steps = [i * run["loss_every"] for i in range(len(run["loss_nats"]))]
        ax.plot(steps, [loss / math.log(2) for loss in run["loss_nats"]], label=f"{run['model']} (training batches)")
        ax.axhline(run["held_out_bits_per_byte"]["trained"], ls="--", lw=1, color=ax.lines[-1].get_color())
    ax.set_yscale("log")
    ax.set_xlabel(f"training step ({BATCH} windows of {LENGTH} bytes each)")
    ax.set_ylabel("loss (bits per byte, log scale)")
    ax.set_title("The course's weights, trained here; dashed: held-out bits per byte after training")
    ax.legend()


@torch.no_grad()
def greedy_sample(lm, prompt: str, new_bytes: int) -> str:
    ids = lm.tokenizer(prompt, return_tensors="pt").input_ids
    out = lm.model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_bytes, do_sample=False, pad_token_id=0
    )
    return lm.tokenizer.decode(out[0], skip_special_tokens=True)


def train_one(name: str, corpus, steps: int, seed: int) -> dict:
    lm = load_model(name, weights="random", seed=seed, quiet=True)
    lm.model.float()
    before = bits_per_byte(lm.model, corpus.held_out)
    start = time.perf_counter()
    losses = train(lm.model, corpus.train, steps, batch=BATCH, length=LENGTH, seed=seed)
    seconds = time.perf_counter() - start
    COURSE_WEIGHTS.mkdir(exist_ok=True)
    path = COURSE_WEIGHTS / f"{name}.safetensors"
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in lm.model.state_dict().items()}, str(path))
    saved = load_model(name, weights="course", quiet=True)  # what students load: the bfloat16 weights
    saved.model.float()
    return {
        "model": name,
        "parameters": sum(p.numel() for p in saved.model.parameters()),
        "steps": steps,
        "seed": seed,
        "train_seconds": seconds,
        "loss_every": LOSS_EVERY,
        "loss_nats": losses[::LOSS_EVERY],
        "held_out_bits_per_byte": {"random": before, "trained": bits_per_byte(saved.model, corpus.held_out)},
        "sample": {"prompt": SAMPLE_PROMPT, "greedy": greedy_sample(saved, SAMPLE_PROMPT, SAMPLE_BYTES)},
        "file": str(path.relative_to(COURSE_WEIGHTS.parent.parent)),
        "file_bytes": path.stat().st_size,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.course_weights", description=__doc__)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    profile = pick_profile()
    corpus = stdlib_corpus()
    print(f"corpus: {corpus.files} files, {len(corpus.train):,} bytes to train on, {len(corpus.held_out):,} held out")
    runs = []
    for name in MODELS:
        runs.append(train_one(name, corpus, args.steps, args.seed))
        run = runs[-1]
        bits = run["held_out_bits_per_byte"]
        print(
            f"{name}: {run['parameters']:,} parameters, {run['steps']} steps in {run['train_seconds']:.0f} s, "
            f"held-out {bits['random']:.2f} -> {bits['trained']:.2f} bits per byte; "
            f"sample: {run['sample']['greedy']!r}",
            flush=True,
        )
    meta = provenance(profile, cpu_threads=torch.get_num_threads())
    path = save_results(
        "10_course_weights",
        runs,
        meta,
        corpus={
            "source": "the running interpreter's standard library, *.py, tests and vendored packages left out",
            "python": platform.python_version(),
            "files": corpus.files,
            "train_bytes": len(corpus.train),
            "held_out_bytes": len(corpus.held_out),
            "sha256": corpus.sha256,
        },
        batch=BATCH,
        length=LENGTH,
    )
    print(f"wrote {path}")
    return runs


if __name__ == "__main__":
    main()
