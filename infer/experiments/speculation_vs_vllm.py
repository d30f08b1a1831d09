"""Speculative decoding in the course engine beside vLLM's CPU build (week 10, issue 34 item 4).

    python -m infer.experiments.speculation_vs_vllm        # about 6 minutes on two cores; needs `make vllm`

The same weights (the course's tiny model, trained here, exported as a Hugging Face folder), the
same 12 windows of held-out Python, greedy, 64 new tokens each, one request at a time (batch 1),
each system without speculation and with n-gram prompt lookup (k = 3 guesses, n-grams of 1 to 3
tokens: vLLM's `ngram` method with `prompt_lookup_min` 1 and `prompt_lookup_max` 3). vLLM runs
offline (`vllm.LLM`, token ids in, no tokenizer) in its own venv, in a fresh process for each
configuration and round, with its default CPU settings and a 2 GiB KV cache; its start-up (model
load and compilation) is not timed. The course engine runs in this process on one thread. Rounds
take the four configurations in turn. Reported per configuration: the median over rounds of the
median milliseconds per output token over the prompts, speculation's speed-up within each system,
the acceptance rate (vLLM's from its own counters), and whether the outputs agree: each system's
speculative outputs with its plain ones, and the two systems' plain outputs with each other.

Writes results/10_speculation_vs_vllm_<profile>.json.
"""

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

from infer.engine import Engine
from infer.engine.sequence import SamplingParams
from infer.engine.speculation import SpeculativeConfig
from infer.experiments.rounds import spread
from infer.experiments.speculation import held_out_prompts
from infer.metrics import save_results
from infer.model import Transformer
from infer.models import load_model
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.serve.export import export_model
from infer.serve.vllm_server import vllm_environment, vllm_missing_reason, vllm_python
from infer.timing import cpu_threads

PROMPTS, PROMPT_BYTES, NEW_TOKENS, K = 12, 192, 64, 3
THREADS = 1

# What each vLLM process runs: the prompts one at a time, then vLLM's own speculation counters.
VLLM_CHILD = """
import json, statistics, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
job = json.load(open(sys.argv[1]))
spec = job["speculative_config"]
llm = LLM(model=job["model"], dtype="float32", max_model_len=512, seed=0, skip_tokenizer_init=True,
          speculative_config=spec, disable_log_stats=False)
params = SamplingParams(max_tokens=job["new_tokens"], temperature=0.0, ignore_eos=True, detokenize=False)
llm.generate([TokensPrompt(prompt_token_ids=job["prompts"][0])], params, use_tqdm=False)  # warm-up
def counters():
    return {m.name: getattr(m, "value", None) or 0 for m in llm.get_metrics() if "spec_decode_num" in m.name}
before = counters()  # the warm-up's drafts are not the measurement's
tokens, ms = [], []
for prompt in job["prompts"]:
    start = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0]
    ms.append((time.perf_counter() - start) * 1e3 / job["new_tokens"])
    tokens.append(list(out.outputs[0].token_ids))
after = counters()
counted = {name: after[name] - before.get(name, 0) for name in after if isinstance(after[name], (int, float))}
print("RESULT " + json.dumps({"ms_per_token": statistics.median(ms), "tokens": tokens, "counters": counted}))
"""


def vllm_run(folder: Path, prompts: list[list[int]], speculative: bool) -> dict:
    """One fresh vLLM process: median ms per output token over the prompts, its tokens and counters."""
    spec = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    job = {
        "model": str(folder),
        "prompts": prompts,
        "new_tokens": NEW_TOKENS,
        "speculative_config": spec if speculative else None,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(job, file)
        file.flush()
        done = subprocess.run(
            [str(vllm_python()), "-c", VLLM_CHILD, file.name], capture_output=True, text=True, env=vllm_environment()
        )
    result = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode or result is None:
        raise RuntimeError(f"vLLM ({'ngram' if speculative else 'plain'}) failed:\n{done.stderr[-3000:]}")
    return json.loads(result.removeprefix("RESULT "))


def course_run(model, prompts: list[list[int]], speculative: bool) -> dict:
    """The course engine, one request at a time: median ms per output token, tokens, acceptance."""
    config = SpeculativeConfig("ngram", K) if speculative else None
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    tokens, ms, drafted, accepted = [], [], 0, 0
    for prompt in prompts:
        engine = Engine(model, "continuous", 1, 512, 512, speculative=config)
        start = time.perf_counter()
        [result] = engine.generate([prompt], params, progress=False)
        ms.append((time.perf_counter() - start) * 1e3 / NEW_TOKENS)
        tokens.append(result.token_ids)
        drafted, accepted = drafted + result.num_draft_tokens, accepted + result.num_accepted_tokens
    return {"ms_per_token": statistics.median(ms), "tokens": tokens, "drafted": drafted, "accepted": accepted}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m infer.experiments.speculation_vs_vllm", description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    reason = vllm_missing_reason()
    if reason:
        raise SystemExit(f"vLLM cannot run here: {reason}")
    profile = pick_profile()
    lm = load_model("tiny", profile=profile, weights="course", quiet=True)
    folder = export_model(lm)
    model = Transformer.from_hf(lm.model)
    prompts = held_out_prompts(PROMPTS, PROMPT_BYTES)
    configs = [("vllm", False), ("vllm", True), ("course", False), ("course", True)]
    runs: dict[tuple, list[dict]] = {config: [] for config in configs}
    with cpu_threads(THREADS), tqdm(total=args.rounds * len(configs), desc="vLLM and the course, in turns") as bar:
        for _ in range(args.rounds):
            for system, speculative in configs:
                run = (
                    vllm_run(folder, prompts, speculative)
                    if system == "vllm"
                    else course_run(model, prompts, speculative)
                )
                runs[(system, speculative)].append(run)
                bar.update(1)
        meta = provenance(lm, cpu_threads=THREADS)
    rows = []
    for system in ("vllm", "course"):
        plain, spec = runs[(system, False)], runs[(system, True)]
        if system == "vllm":
            counters = spec[0]["counters"]
            drafted = counters.get("vllm:spec_decode_num_draft_tokens") or 0
            accepted = counters.get("vllm:spec_decode_num_accepted_tokens") or 0
        else:
            drafted, accepted = spec[0]["drafted"], spec[0]["accepted"]
        rows.append(
            {
                "system": system,
                "ms_per_token_plain": spread([r["ms_per_token"] for r in plain]),
                "ms_per_token_ngram": spread([r["ms_per_token"] for r in spec]),
                "speedup": spread([p["ms_per_token"] / s["ms_per_token"] for p, s in zip(plain, spec)]),
                "acceptance_rate": accepted / drafted if drafted else None,
                "draft_tokens": drafted,
                "accepted_tokens": accepted,
                "ngram_outputs_equal_plain": all(p["tokens"] == s["tokens"] for p, s in zip(plain, spec)),
            }
        )
    same_plain = runs[("vllm", False)][0]["tokens"] == runs[("course", False)][0]["tokens"]
    for row in rows:
        print(
            f"{row['system']:>6}: plain {row['ms_per_token_plain']['median']:.2f} ms a token, ngram "
            f"{row['ms_per_token_ngram']['median']:.2f}: {row['speedup']['median']:.2f}x "
            f"({row['speedup']['min']:.2f}-{row['speedup']['max']:.2f}); accepted "
            f"{row['acceptance_rate'] if row['acceptance_rate'] is None else format(row['acceptance_rate'], '.0%')}; "
            f"ngram outputs equal plain: {row['ngram_outputs_equal_plain']}",
            flush=True,
        )
    print(f"vLLM's and the course's plain greedy outputs equal: {same_plain}")
    path = save_results(
        f"10_speculation_vs_vllm_{profile.name}",
        rows,
        meta,
        plain_outputs_equal_across_systems=same_plain,
        prompts=PROMPTS,
        prompt_bytes=PROMPT_BYTES,
        new_tokens=NEW_TOKENS,
        k=K,
        rounds=args.rounds,
        settings="batch 1; vLLM offline (vllm.LLM, float32, max_model_len 512, 2 GiB KV cache, its default CPU "
        "thread binding), a fresh process a configuration and round, start-up not timed; the course engine on "
        "1 thread, a fresh engine a prompt",
    )
    print(f"wrote {path}")
    return {"rows": rows, "plain_outputs_equal_across_systems": same_plain}


if __name__ == "__main__":
    main()
