"""One engine step, before and after a change to the library (week 09, issue 32 item 3).

    python -m infer.experiments.step_versions BASELINE --label NAME [--rounds 5]   # about 3 minutes

A change to the step is kept only if it pays, and what it pays is measured against the library
as it was: BASELINE (a git commit) is checked out into a temporary worktree, and fresh processes of
the two versions take turns (baseline, current, baseline, current, ...), each timing decode steps
of 32 sequences of 288 tokens on one thread, on the slot store and on the paged store. Fresh
processes, so that neither version inherits the other's warm caches or allocator; in turns, so
that this machine's drift meets both alike. Each process also reports its greedy tokens: a change
that moves a single token is a change of the model, not of its speed.

Writes results/09_step_versions_<label>_<profile>.json (both commits in it), one file per change.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tqdm.auto import tqdm

from infer.experiments.rounds import ratio_spread, spread
from infer.metrics import save_results
from infer.paths import REPO_ROOT
from infer.profiles import pick_profile
from infer.provenance import provenance

THREADS = 1
BATCH, CONTEXT, WARMUP_STEPS, STEPS = 32, 288, 10, 20
STORES = ("slots", "paged")

# What each process runs: only the engine's public calls, which both versions have.
CHILD = """
import json, statistics, sys, time, torch
torch.set_num_threads({threads})
from infer.engine import Engine
from infer.engine.sequence import benchmark_params
from infer.model import Transformer
from infer.models import load_model
model = Transformer.from_hf(load_model(quiet=True).model)
prompt = [1 + i % (model.arch.vocab_size - 1) for i in range({context})]
engine = Engine(model, max_num_seqs={batch}, max_num_batched_tokens={batch} * {context},
                max_model_len={context} + {steps} + {warmup} + 16, kv_store="{store}")
for _ in range({batch}):
    engine.add_request(prompt, benchmark_params({steps} + {warmup} + 8))
tokens, times = {{}}, []
for step in range({warmup} + {steps}):
    start = time.perf_counter()
    outputs = engine.step()
    if step >= {warmup}:
        times.append((time.perf_counter() - start) * 1e3)
    for out in outputs:
        tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
print(json.dumps({{"step_ms": statistics.median(times), "tokens": tokens}}))
"""


def commit_of(ref: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", "rev-parse", ref], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def run_version(root: Path, store: str) -> dict:
    """One fresh process of the library at `root`: its median decode step and its greedy tokens."""
    code = CHILD.format(threads=THREADS, context=CONTEXT, batch=BATCH, steps=STEPS, warmup=WARMUP_STEPS, store=store)
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS=str(THREADS))
    done = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the step at {root} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(baseline: Path, current: Path, rounds: int) -> list[dict]:
    """Per store: each version's median step per round, the current/baseline ratio within each
    round, and whether every round's greedy tokens were the same."""
    cases = []
    with tqdm(total=len(STORES) * rounds * 2, desc="baseline and current, in turns") as bar:
        for store in STORES:
            runs: dict[str, list[dict]] = {"baseline": [], "current": []}
            for _ in range(rounds):
                for name, root in (("baseline", baseline), ("current", current)):
                    runs[name].append(run_version(root, store))
                    bar.update(1)
            cases.append(
                {
                    "store": store,
                    "step_ms": {name: spread([r["step_ms"] for r in rs]) for name, rs in runs.items()},
                    "current_over_baseline": ratio_spread(runs["current"], runs["baseline"], "step_ms"),
                    "same_greedy_tokens": all(
                        b["tokens"] == c["tokens"] for b, c in zip(runs["baseline"], runs["current"])
                    ),
                }
            )
    return cases


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.step_versions", description=__doc__)
    parser.add_argument("baseline", help="the git commit to measure against (e.g. HEAD~1)")
    parser.add_argument("--label", required=True, help="what changed, for the results file's name")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    profile = pick_profile()
    baseline_commit = commit_of(args.baseline)
    with tempfile.TemporaryDirectory(prefix="infer-baseline-") as folder:
        worktree = Path(folder) / "baseline"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(worktree), baseline_commit],
            cwd=REPO_ROOT,
            capture_output=True,
            check=True,
        )
        try:
            cases = compare(worktree, REPO_ROOT, args.rounds)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO_ROOT, check=False)
    for case in cases:
        ms, ratio = case["step_ms"], case["current_over_baseline"]
        print(
            f"{case['store']}: baseline {ms['baseline']['median']:.2f} ms, current {ms['current']['median']:.2f} ms "
            f"a step; current/baseline {ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f}); "
            f"same greedy tokens: {case['same_greedy_tokens']}",
            flush=True,
        )
    meta = provenance(profile, cpu_threads=THREADS if profile.device == "cpu" else None)
    path = save_results(
        f"09_step_versions_{args.label}_{profile.name}",
        cases,
        meta,
        change=args.label,
        baseline_commit=baseline_commit,
        current_commit=commit_of("HEAD"),
        current_has_uncommitted_changes=bool(
            subprocess.run(
                ["git", "status", "--porcelain", "infer"], cwd=REPO_ROOT, capture_output=True, text=True
            ).stdout.strip()
        ),
        batch=BATCH,
        context=CONTEXT,
        warmup_steps=WARMUP_STEPS,
        steps_per_process=STEPS,
        rounds=args.rounds,
    )
    print(f"wrote {path}")
    return {"cases": cases}


if __name__ == "__main__":
    main()
