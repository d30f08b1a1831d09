"""Where one engine step's time goes, op by op, grouped so that it teaches (week 09).

    python -m infer.experiments.step_profile        # under a minute on two cores

torch.profiler records every PyTorch operator of a few engine steps; each operator's own time
(without the operators it calls) goes to one group:

- GEMM: the matrix multiplies of the linear layers and the output head;
- attention: the attention kernel itself;
- KV gather: reading a paged store's blocks into one tensor per layer (`index_select`, indexing);
- cache writes: writing the new tokens' keys and values into the cache (`index_put_`);
- copies and layout: copies, concatenations, views, reshapes, new tensors;
- norms and activations: the elementwise work (RMSNorm, rotary, SwiGLU, residual adds);
- sampling: picking the next tokens;
- other ops: anything else;
- host: the step's wall time that no operator accounts for (Python: the scheduler, building the
  batch, the engine's bookkeeping, and dispatching each operator).

A decode step (32 sequences of 288 cached tokens) and a mixed step (16 decodes and a 128-token
prompt chunk), on the slot store and on the paged store, with each decode attention (PyTorch's
after a gather, and the in-place kernel: the breakdown before and after it), one thread. The
profiler adds its own
cost to every operator, so the steps' mean time under it (`profiled_step_ms`) is longer than the
same steps of a twin engine unprofiled (`step_ms`); read the groups as shares.
Writes results/09_step_profile_<profile>.json and figures/09_step_profile.png.
"""

import itertools
import statistics
import time
from functools import partial

import matplotlib.pyplot as plt
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from infer.engine import Engine
from infer.engine.sequence import benchmark_params
from infer.metrics import save_results
from infer.model import Transformer
from infer.models import load_model
from infer.plotting import save_figure
from infer.profiles import pick_profile
from infer.provenance import provenance
from infer.timing import cpu_threads

THREADS = 1
CPU_DECODE_ATTENTION = ("sdpa", "in_place")  # the two the CPU profile compares
# (group, substrings of operator names), first match wins: cache writes before the gather's "index"
GROUPS = (
    ("GEMM", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear")),
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention", "in_place_decode_attention")),
    ("cache writes", ("index_put",)),
    ("KV gather", ("index_select", "aten::index", "aten::gather")),
    ("sampling", ("argmax", "softmax", "multinomial", "topk", "aten::sort")),
    (
        "copies and layout",
        (
            "copy_",
            "aten::cat",
            "clone",
            "contiguous",
            "aten::empty",
            "aten::view",
            "reshape",
            "transpose",
            "as_strided",
            "aten::slice",
            "unsqueeze",
            "expand",
            "aten::select",
            "aten::stack",
            "aten::to",
            "aten::_to_copy",
            "aten::permute",
            "aten::split",
            "aten::chunk",
            "aten::narrow",
            "aten::squeeze",
        ),
    ),  # fmt: skip
    (
        "norms and activations",
        (
            "aten::mul",
            "aten::add",
            "silu",
            "aten::pow",
            "rsqrt",
            "aten::mean",
            "aten::div",
            "aten::neg",
            "aten::where",
            "aten::sum",
            "sigmoid",
            "rms_norm",
            "aten::sub",
            "aten::exp",
            "aten::sqrt",
        ),
    ),  # fmt: skip
)
HOST = "host"
OTHER = "other ops"
GROUP_NAMES = (*(name for name, _ in GROUPS), OTHER, HOST)
STEPS = 10


def op_group(name: str) -> str:
    """The group of a profiled operator, by its name."""
    return next((group for group, needles in GROUPS if any(n in name for n in needles)), OTHER)


def profile_steps(make_engine, steps: int = STEPS) -> dict:
    """ms per step of each group over the first `steps` steps of an engine from `make_engine`, the
    steps' wall time under the profiler, and the same steps of a twin engine timed unprofiled."""
    twin, unprofiled = make_engine(), []
    for _ in range(steps):
        start = time.perf_counter()
        twin.step()
        unprofiled.append((time.perf_counter() - start) * 1e3)
    engine = make_engine()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            engine.step()
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    groups = dict.fromkeys(GROUP_NAMES, 0.0)
    for event in prof.key_averages():
        groups[op_group(event.key)] += event.self_cpu_time_total / 1e3 / steps
    groups[HOST] = max(0.0, wall_ms - sum(groups.values()))
    return {"step_ms": statistics.mean(unprofiled), "profiled_step_ms": wall_ms, "groups_ms": groups}


class _CountingMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def operator_calls(engine: Engine) -> int:
    """How many PyTorch operators the engine's next step dispatches (each one a trip through the
    dispatcher on the host, and on a GPU a kernel launch). Ops a composite op expands into are
    counted, not the composite: what reaches a kernel."""
    with torch.no_grad(), _CountingMode() as mode:
        engine.step()
    return mode.calls


def plot_step_profile(ax, rows: list[dict]) -> None:
    """One bar per profiled configuration, its step time split into the groups: each group's share
    of the profiled step, times the step's unprofiled time (the profiler's own cost taken out)."""
    labels = [f"{r['step']}, {r['store']}, {r['decode_attention']}" for r in rows]
    left = [0.0] * len(rows)
    for index, group in enumerate(GROUP_NAMES):
        widths = [r["groups_ms"][group] * r["step_ms"] / r["profiled_step_ms"] for r in rows]
        ax.barh(labels, widths, left=left, label=group, color=plt.get_cmap("tab10")(index))
        left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()  # the first configuration on top
    ax.set_xlabel("ms per step (each group's share of the profiled step x the unprofiled step time)")
    ax.set_title("Where a step's time goes: tiny model, one thread")
    ax.legend(loc="lower right", fontsize="small")


def engine_for(model, store: str, step: str, decode_attention: str = "sdpa") -> Engine:
    """An engine whose next STEPS steps are all of one kind: pure decodes, or decodes with a prompt chunk."""
    prompt = [1 + i % (model.arch.vocab_size - 1) for i in range(288)]
    if step == "decode":
        engine = Engine(
            model,
            "chunked",
            max_num_seqs=32,
            max_num_batched_tokens=32 * 288,
            max_model_len=512,
            kv_store=store,
            decode_attention=decode_attention,
        )
        for _ in range(32):
            engine.add_request(prompt, benchmark_params(2 * STEPS + 4))
        engine.step()  # the prefills; from here on every step decodes 32 sequences
        engine.step()
        return engine
    # mixed: 16 decoding sequences, then long prompts that each step continues by one chunk of 128
    engine = Engine(
        model,
        "chunked",
        max_num_seqs=32,
        max_num_batched_tokens=16 + 128,
        max_model_len=4096,
        kv_store=store,
        decode_attention=decode_attention,
    )
    for _ in range(16):
        engine.add_request(prompt[:64], benchmark_params(4 * STEPS + 8))
    while any(s.is_prefilling for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    engine.step()
    engine.add_request([7] * (128 * 2 * STEPS + 1), benchmark_params(1))
    return engine


def main() -> list[dict]:
    profile_ = pick_profile()
    with cpu_threads(THREADS if profile_.device == "cpu" else None):
        lm = load_model("tiny", profile=profile_, weights="random")
        model = Transformer.from_hf(lm.model)
        rows = []
        for step, store, attention in itertools.product(("decode", "mixed"), ("slots", "paged"), CPU_DECODE_ATTENTION):
            result = profile_steps(partial(engine_for, model, store, step, attention))
            rows.append({"step": step, "store": store, "decode_attention": attention, **result})
            shares = ", ".join(
                f"{g} {ms:.2f}" for g, ms in sorted(result["groups_ms"].items(), key=lambda kv: -kv[1]) if ms >= 0.05
            )
            print(
                f"{step:>6} step, {store:>5}, {attention:>8}: {result['step_ms']:.2f} ms unprofiled; "
                f"profiled, ms: {shares}",
                flush=True,
            )
        meta = provenance(lm, cpu_threads=THREADS if profile_.device == "cpu" else None)
    path = save_results(f"09_step_profile_{profile_.name}", rows, meta, steps_profiled=STEPS, groups=list(GROUP_NAMES))
    print(f"wrote {path}")
    fig, ax = plt.subplots(figsize=(9, 5))
    plot_step_profile(ax, rows)
    print(f"wrote {save_figure(fig, '09_step_profile', meta)}")
    return rows


if __name__ == "__main__":
    main()
