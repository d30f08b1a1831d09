"""How `make gpu-check` spends its 10 minutes, planned before anything runs.

A GPU is lent for minutes, and a notebook that runs past them leaves the rest unchecked. So the
check first estimates each notebook's time on the GPU: its work counted in steps (decode steps,
prompt tokens, requests) from the very size tables the notebook reads, times what a step costs.
Until gpu-check has measured the GPU it runs on, each step time is an assumption for one H100
(ASSUMED_H100), printed with where it comes from. The notebooks run on the `gpu-check` profile,
the gpu profile at smaller sizes (infer/profiles.py); the plan shows both estimates. In course
order, a notebook runs while its estimate fits what is left of the budget; one that does not fit
is skipped with its estimate and the reason, never silently cut.

Each phase of the check also has a time limit derived from the plan (phase_limits): the GPU-only
tests and the step-time measurement get twice their estimate (within bounds), the notebooks what
is left of the budget less a reserve for the summary. A phase past its limit is stopped and the
summary says so, so that a run always brings back summary.txt within the 10 minutes.

    make gpu-check DRY=1        # this plan, on any machine (python -m infer.course.gpu_check --dry-run)
"""

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from infer.attention import tiled_attention
from infer.experiments.attention_bench import sweep_config
from infer.experiments.batching_study import STUDY_SIZES
from infer.experiments.cache_speed import speed_sizes
from infer.experiments.prefill_decode import phase_sizes
from infer.experiments.sequential_baseline import BASELINE_SIZES, BaselineSizes, prompts_per_cell
from infer.profiles import PROFILES, BenchmarkGrid, Profile
from infer.serve.vllm_server import vllm_grid_missing_reason, vllm_missing_reason

BUDGET_S = 600  # the promise of README.md: one H100 or H200 runs the whole check within 10 minutes
CHECK_PROFILE = "gpu-check"  # the profile the notebooks run on
STUDENT_PROFILE = "gpu"  # the sizes of a student's full run, shown beside for comparison


@dataclass(frozen=True)
class StepTimes:
    """What a unit of work costs on the GPU, for the gpu profile's model (Qwen2.5-1.5B, bf16, eager)."""

    hf_decode_ms: float  # one decode step of transformers' generate(), batch 1
    course_step_ms: float  # one step of the course's own model (infer.model) for a few tokens
    prefill_ms_per_1k: float  # a long prompt's forward pass, per 1,000 tokens
    notebook_start_s: float  # kernel start, imports, CUDA context, loading the model
    tests_s: float  # before the notebooks: the GPU-only tests
    step_times_s: float  # then measuring these step times
    fast_paths_s: float  # then the decode fast paths side by side (infer.experiments.decode_fast_paths)
    vllm_start_s: float  # vLLM's server or benchmark client, from launch to ready
    sources: dict[str, str] = field(default_factory=dict)  # field name -> where the number comes from

    @property
    def setup_s(self) -> float:
        """Everything before the notebooks: the GPU-only tests, the step times, the fast paths."""
        return self.tests_s + self.step_times_s + self.fast_paths_s

    def forward_ms(self, tokens: int, step_ms: float) -> float:
        """A forward pass over `tokens` tokens: launch-bound (a step) when short, compute-bound when long."""
        return max(step_ms, tokens / 1000 * self.prefill_ms_per_1k)


TRITON_COMPILE_S = 3.0  # estimate: one compile of the Triton kernel for a dtype, mask and head size
# tests/test_attention.py's CUDA test: 3 dtypes x 2 masks x 3 head sizes; then the paged decode
# kernel's (infer.paged_decode_triton): 5 shapes in bf16, one captured in a graph, 2 in the engine
GPU_TEST_COMPILES = 18 + 8

ASSUMED_H100 = StepTimes(
    hf_decode_ms=20.0,
    course_step_ms=30.0,
    prefill_ms_per_1k=10.0,
    notebook_start_s=15.0,
    tests_s=45.0 + GPU_TEST_COMPILES * TRITON_COMPILE_S,
    step_times_s=20.0,
    fast_paths_s=60.0,
    vllm_start_s=90.0,
    sources={
        "hf_decode_ms": "estimate: 28 layers of eager kernels, launch-bound; issue 22 puts a step at 15-25 ms",
        "course_step_ms": "estimate: more Python per layer than transformers, and host-device syncs per layer "
        "until issue 22 item 8 lands",
        "prefill_ms_per_1k": "estimate: 2 x 1.54e9 FLOP per token at ~300 TFLOP/s, a third of the H100's "
        "989 TFLOP/s dense bf16",
        "notebook_start_s": "estimate: kernel, imports and CUDA context ~8 s, the random-weight model ~5 s; "
        "issue 22 puts 15 notebooks' start-up at 2.5-5 minutes",
        "tests_s": f"estimate: pytest's start-up, one model load and two float32 copies, vLLM's import (~45 s), "
        f"and {GPU_TEST_COMPILES} Triton compiles (week 04's kernel: 3 dtypes x 2 masks x 3 head sizes; the paged "
        f"decode kernel: 8), {TRITON_COMPILE_S:.0f} s each",
        "step_times_s": "estimate: a fresh interpreter, imports and one model load (~10 s), then the measured "
        "steps (~10 s)",
        "fast_paths_s": "estimate: one model load and a bandwidth probe (~15 s); at batch 1, 8 and 32, up to 3 "
        "kernels x eager and graphs, each 70 steps at ~30 ms (~40 s in all) and its graphs' capture",
        "vllm_start_s": "estimate: vLLM's start-up (weights, torch.compile, CUDA graphs) takes 1-2 minutes",
    },
)

FIGURE_S = 1.0  # estimate: one matplotlib figure drawn and saved on the host
TILE_PAIR_MS = 0.1  # estimate: one (query block, key block) step of plain-PyTorch tiled attention: ~10 launches
UNKNOWN_NOTEBOOK_S = 60.0  # a notebook this plan has no estimate for yet (a new week), until one is written


@dataclass(frozen=True)
class Part:
    what: str
    seconds: float


@dataclass(frozen=True)
class Estimate:
    sizes: str  # the sizes the notebook runs at on the profile, as the notebook reads them
    parts: tuple[Part, ...]

    @property
    def seconds(self) -> float:
        return sum(part.seconds for part in self.parts)


# ---------------------------------------------------------------- counting steps


def _steps(what: str, count: float, ms: float) -> Part:
    return Part(f"{what}: {count:,.0f} x {ms:.0f} ms", count * ms / 1e3)


def _naive_loop_ms(t: StepTimes, prompt_len: int, new_tokens: int) -> float:
    """Week 01's naive loop: every step recomputes the whole sequence so far."""
    return sum(t.forward_ms(prompt_len + i, t.hf_decode_ms) for i in range(new_tokens))


def _request_ms(t: StepTimes, input_len: int, output_len: int) -> float:
    """One generate() request: the prefill gives the first token, then output_len - 1 decode steps."""
    return t.forward_ms(input_len, t.hf_decode_ms) + (output_len - 1) * t.hf_decode_ms


def _sizes(table: dict, name: str, profile: Profile):
    """A profile's row of a size table, or KeyError naming the table (the plan then skips the notebook)."""
    if profile.name not in table:
        raise KeyError(f"{name} has no {profile.name!r} row")
    return table[profile.name]


def _baseline_requests(grid: BenchmarkGrid, sizes: BaselineSizes) -> list[tuple[int, int]]:
    """Every (input_len, output_len) request of week 03's sequential baseline: warm-ups, ramp-up, measured."""
    return [(i, o) for i, o, c in grid.cells() for _ in range(sizes.warmup + c - 1 + prompts_per_cell(grid, sizes, c))]


def _baseline_part(t: StepTimes, what: str, grid: BenchmarkGrid, sizes: BaselineSizes) -> Part:
    requests = _baseline_requests(grid, sizes)
    tokens = sum(o for _, o in requests)
    return Part(
        f"{what}: {len(requests)} requests, {tokens:,} output tokens",
        sum(_request_ms(t, i, o) for i, o in requests) / 1e3,
    )


# ---------------------------------------------------------------- one estimate per notebook


def _week00(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate("-", (Part("hardware and versions, the smoke test's tiny model: a few steps", 3.0),))


def _week01(profile: Profile, t: StepTimes) -> Estimate:
    s = phase_sizes(profile)
    # per length: the timed prefills after a warm-up; then one prefill of context, and the decode steps
    sweep_ms = sum(
        (2 + s.prefill_repeats) * t.forward_ms(n, t.hf_decode_ms) + (1 + s.decode_repeats) * t.hf_decode_ms
        for n in s.sweep_prompt_lens
    )
    return Estimate(
        f"prompts {s.sweep_prompt_lens}, repeats {s.prefill_repeats}/{s.decode_repeats}, "
        f"naive loop {s.naive_prompt_len} + {s.naive_new_tokens} tokens",
        (
            Part(
                f"naive loop: {s.naive_new_tokens + 1} forward passes of ~{s.naive_prompt_len} tokens",
                _naive_loop_ms(t, s.naive_prompt_len, s.naive_new_tokens + 1) / 1e3,
            ),
            _steps("naive loop vs generate() in float32, 3 prompts x 12 tokens x 2", 72, t.hf_decode_ms),
            Part(f"prefill/decode sweep over {len(s.sweep_prompt_lens)} prompt lengths", sweep_ms / 1e3),
            Part("measured roofline: a matmul and a copy, ten times each", 1.0),
            Part("4 figures and a widget", 5 * FIGURE_S),
        ),
    )


def _week02(profile: Profile, t: StepTimes) -> Estimate:
    s = speed_sizes(profile)
    runs = [n for n in s.output_lens for _ in range(s.repeats)] + [min(s.output_lens)]  # the race, and its warm-up
    naive_ms = sum(_naive_loop_ms(t, s.prompt_len, n) for n in runs)
    return Estimate(
        f"race: prompt {s.prompt_len}, outputs {s.output_lens}, {s.repeats} run(s) each",
        (
            Part("float32 copies of the model for the logits and loop checks", 3.0),
            _steps("cached loop vs generate(), 8 prompts x 12 tokens", 96, t.course_step_ms + t.hf_decode_ms),
            Part("cache write cost, 4 contexts x 2 caches x 17 writes of every layer", 2.0),
            Part("the allocator's view: a 2048-token prompt and 64 tokens", _request_ms(t, 2048, 64) / 1e3),
            Part(f"race, naive loop: {len(runs)} runs", naive_ms / 1e3),
            _steps("race, the two cached loops", 2 * sum(runs), t.course_step_ms),
            _steps("race, generate()", sum(runs), t.hf_decode_ms),
            Part("4 figures", 4 * FIGURE_S),
        ),
    )


def _week03(profile: Profile, t: StepTimes) -> Estimate:
    grid, sizes = profile.grid, _sizes(BASELINE_SIZES, "sequential_baseline.BASELINE_SIZES", profile)
    parts = [
        _steps("one request's timeline: 2 requests of 8 tokens and a warm-up", 18, t.hf_decode_ms),
        _baseline_part(t, f"sequential baseline over {len(grid.cells())} grid cells", grid, sizes),
        Part("3 figures", 3 * FIGURE_S),
    ]
    reason = vllm_grid_missing_reason(profile)
    if reason:
        parts.append(Part(f"vLLM's grid: not run ({reason})", 0.0))
    else:
        vllm_request_s = (t.forward_ms(max(grid.input_lens), t.hf_decode_ms) + max(grid.output_lens) * 5.0) / 1e3
        parts += [
            Part("vLLM's server start-up", t.vllm_start_s),
            Part(
                f"vLLM's grid: {len(grid.cells())} runs of {grid.num_prompts} prompts "
                f"(estimate: 5 ms a step with CUDA graphs)",
                sum(math.ceil(grid.num_prompts / c) * vllm_request_s for _, _, c in grid.cells()),
            ),
        ]
    return Estimate(
        f"grid {grid.input_lens} in x {grid.output_lens} out x concurrency {grid.concurrency}, {sizes}", tuple(parts)
    )


def _week04(profile: Profile, t: StepTimes) -> Estimate:
    config = sweep_config(profile)
    calls = config.warmup + config.repeats + 1  # and one more for the peak memory
    block = inspect.signature(tiled_attention).parameters["block_q"].default
    tiled_ms = 0.0
    for n in config.seq_lens:
        call_ms = (n / block) ** 2 / 2 * TILE_PAIR_MS  # causal: half of the (query block, key block) pairs
        if call_ms / 1e3 > config.max_call_s:  # the sweep's time guard skips it from here on
            break
        tiled_ms += calls * call_ms
    return Estimate(
        f"sweep N = {config.seq_lens}, {config.heads} heads, d={config.head_dim}, "
        f"{config.warmup} + {config.repeats} calls, at most {config.max_call_s:g} s a call",
        (
            Part("Triton compiles: 3 dtypes x 2 masks for exactness, 1 for the sweep", 7 * TRITON_COMPILE_S),
            Part(
                "tiled attention in plain PyTorch, the sweep's slowest (estimate: 0.1 ms per block pair)",
                tiled_ms / 1e3,
            ),
            Part("the other implementations (fused kernels: milliseconds a call)", 5.0),
            Part("2 figures and the I/O table", 3.0),
        ),
    )


def _week05(profile: Profile, t: StepTimes) -> Estimate:
    s = _sizes(STUDY_SIZES, "batching_study.STUDY_SIZES", profile)
    mean_in, mean_out = sum(s.mixed_input) / 2, sum(s.mixed_output) / 2
    static_steps = math.ceil(s.mixed_prompts / s.mixed_slots) * s.mixed_output[1]
    continuous_steps = s.mixed_prompts * mean_out / s.mixed_slots
    prefill_s = s.mixed_prompts * mean_in / 1000 * t.prefill_ms_per_1k / 1e3
    sweep_tokens = sum(s.sweep_rounds * c * s.sweep_input_len for c in s.sweep_concurrency)
    baseline = [(s.sweep_input_len, s.sweep_output_len)] * (1 + 2 * (1 + 2 + 4))  # warm-up, then 2 rounds at 1, 2, 4
    return Estimate(
        f"{s}",
        (
            _steps(
                "static vs continuous, 3 times each: engine steps",
                3 * (static_steps + continuous_steps),
                t.course_step_ms,
            ),
            Part("static vs continuous: their prefills", 6 * prefill_s),
            _steps(
                f"concurrency sweep {s.sweep_concurrency}: engine steps",
                len(s.sweep_concurrency) * s.sweep_rounds * s.sweep_output_len,
                t.course_step_ms,
            ),
            Part(f"concurrency sweep: {sweep_tokens:,} prompt tokens", sweep_tokens / 1000 * t.prefill_ms_per_1k / 1e3),
            Part(
                f"week 03's baseline again: {len(baseline)} requests",
                sum(_request_ms(t, i, o) for i, o in baseline) / 1e3,
            ),
            Part("2 figures", 2 * FIGURE_S),
        ),
    )


def _week06(profile: Profile, t: StepTimes) -> Estimate:
    long_len = 4 * profile.grid.input_lens[-1]
    return Estimate(
        f"the live stall demo's long prompt: {long_len} tokens",
        (
            _steps("stall demo: 8 streams of 24 tokens, twice", 2 * 28, t.course_step_ms),
            Part(
                f"stall demo: the {long_len}-token prompt at once, then in 64-token chunks",
                (t.forward_ms(long_len, t.course_step_ms) + long_len / 64 * t.course_step_ms) / 1e3,
            ),
            Part("saved results and figures, read back", 3.0),
        ),
    )


def _week07(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate(
        "24 requests of 128 + 32 tokens on 8 slots (fixed in the notebook)",
        (
            _steps("the server's view: 3 waves of 32 steps, and their prefills", 100, t.course_step_ms),
            Part("the raw stream, the hang-up, the errors", 2.0),
            Part("saved side-by-side results and figures", 3.0),
        ),
    )


def _week08(profile: Profile, t: StepTimes) -> Estimate:
    prefix = 4 * profile.grid.input_lens[-1]
    prefill_s = (12 + 1) * (prefix + 16) / 1000 * t.prefill_ms_per_1k / 1e3  # off: all 12; on: one, then hits
    return Estimate(
        f"12 requests sharing one {prefix}-token prefix; the rest fixed in the notebook",
        (
            _steps("paged engine runs, under pressure too, and their single-request checks", 400, t.course_step_ms),
            Part(f"prefix caching off and on: the prefills of {prefix}-token prompts", prefill_s),
            _steps("prefix caching off and on: their decode steps", 2 * 3 * 8, t.course_step_ms),
            Part("saved results and figures", 3.0),
        ),
    )


def _solution01(profile: Profile, t: StepTimes) -> Estimate:
    lens = (profile.grid.input_lens[0], profile.grid.input_lens[-1])
    return Estimate(
        f"timed prompts {lens}, 8 tokens, a warm-up and 5 runs",
        (
            _steps("naive-loop check in float32: 5 prompts x 12 tokens x 2, and two more runs", 144, t.hf_decode_ms),
            Part("the same, with the device kept busy 50 ms a step to test the timestamps (CUDA)", 12 * 0.05),
            Part("timed naive loop", sum(6 * _naive_loop_ms(t, n, 8) for n in lens) / 1e3),
            Part("1 figure", FIGURE_S),
        ),
    )


def _solution02(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate(
        "16-token prompt, 16 and 128 new tokens, a warm-up and 3 runs (fixed in the notebook)",
        (
            _steps(
                "cache and cached-loop checks in float32: ~6 prompts x 12 tokens x 2",
                150,
                t.course_step_ms + t.hf_decode_ms,
            ),
            Part("naive loop, 16 and 128 tokens", 4 * (_naive_loop_ms(t, 16, 16) + _naive_loop_ms(t, 16, 128)) / 1e3),
            _steps("your cached loop, 16 and 128 tokens", 4 * (16 + 128), t.course_step_ms),
        ),
    )


def _solution03(profile: Profile, t: StepTimes) -> Estimate:
    grid = BenchmarkGrid((profile.grid.input_lens[-1],), profile.grid.output_lens, (1, 4), 8)  # as the notebook's
    sizes = BaselineSizes(min_prompts=8, rounds=2, warmup=1)
    return Estimate(f"{grid}, {sizes} (fixed in the notebook)", (_baseline_part(t, "your metrics' run", grid, sizes),))


def _solution04(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate("-", (Part("checks and the memory measurement, on the CPU (as on the cpu profile)", 10.0),))


def _solution05(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate("-", (_steps("the trace and the step-forward check: a few engine steps", 60, t.course_step_ms),))


def _solution06(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate(
        "-",
        (
            _steps("two engines over 5 prompts, and the budget check", 80, t.course_step_ms),
            Part("the simulated sweep (no GPU work)", 2.0),
        ),
    )


def _solution07(profile: Profile, t: StepTimes) -> Estimate:
    parts = [
        Part("recorded streams, then a live one", 2.0),
        _steps("16 requests of 128 + 32 tokens on 8 slots", 70, t.course_step_ms),
    ]
    reason = vllm_missing_reason()
    if reason:
        parts.append(Part(f"vLLM's benchmark client: not run ({reason})", 0.0))
    else:
        parts += [
            Part("export the model for vLLM's client (3 GB of bf16 weights)", 10.0),
            Part("vLLM's benchmark client: start-up", 30.0),
            _steps("its 16 requests of 128 + 32 tokens on 8 slots", 70, t.course_step_ms),
        ]
    return Estimate("fixed in the notebook", tuple(parts))


def _week09(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate(
        "-",
        (
            Part("reads the CPU results; one decode step profiled", 15.0),
            Part("builds the in-place CPU kernel (C++), if it is not in the extension cache", 30.0),
            Part("the GPU section: a tiny engine eager and replayed, and the model's figure", 3.0 + FIGURE_S),
        ),
    )


def _week10(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate("-", (Part("reads the CPU results; loads the course's trained weights", 10.0),))


def _solution09(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate(
        "fixed in the notebook",
        (
            Part("the paged decode check: CPU tensors, and the engine on the CPU-side weights", 10.0),
            Part("the timing: 2 engines x 70 decode steps of 32 sequences (a Python loop per block column)", 60.0),
        ),
    )


def _solution10(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate(
        "-",
        (
            Part("the greedy check: the tiny model's speculative loop on the CPU-side weights", 5.0),
            Part("4,000 draws of the rejection-sampling check", 5.0),
        ),
    )


def _solution08(profile: Profile, t: StepTimes) -> Estimate:
    return Estimate("-", (Part("the allocator and prefix-chain checks: plain Python, no model", 2.0),))


ESTIMATES: dict[str, Callable[[Profile, StepTimes], Estimate]] = {
    "weeks/00_setup.ipynb": _week00,
    "weeks/01_prefill_decode.ipynb": _week01,
    "weeks/02_kv_cache.ipynb": _week02,
    "weeks/03_measuring.ipynb": _week03,
    "weeks/04_flash_attention.ipynb": _week04,
    "weeks/05_continuous_batching.ipynb": _week05,
    "weeks/06_chunked_prefill.ipynb": _week06,
    "weeks/07_serving.ipynb": _week07,
    "weeks/08_paged_kv.ipynb": _week08,
    "weeks/09_kernels.ipynb": _week09,
    "weeks/10_speculative.ipynb": _week10,
    "solutions/01_prefill_decode.ipynb": _solution01,
    "solutions/02_kv_cache.ipynb": _solution02,
    "solutions/03_measuring.ipynb": _solution03,
    "solutions/04_flash_attention.ipynb": _solution04,
    "solutions/05_continuous_batching.ipynb": _solution05,
    "solutions/06_chunked_prefill.ipynb": _solution06,
    "solutions/07_serving.ipynb": _solution07,
    "solutions/08_paged_kv.ipynb": _solution08,
    "solutions/09_kernels.ipynb": _solution09,
    "solutions/10_speculative.ipynb": _solution10,
}


# ---------------------------------------------------------------- the plan


PHASE_MIN_S = 60  # no phase's limit is shorter: a fresh interpreter and one model load take tens of seconds
PER_TEST_S = 120  # pytest-timeout's limit for one GPU-only test (pyproject's 900 s would eat the budget)
SUMMARY_RESERVE_S = 20  # after the notebooks: stopping a kernel, writing summary.txt


@dataclass(frozen=True)
class PhaseLimits:
    """How long each phase of the check may run before it is stopped (seconds)."""

    tests_s: float  # the GPU-only tests, all together
    per_test_s: float  # one of them
    step_times_s: float  # measuring the step times
    fast_paths_s: float  # the decode fast paths side by side
    notebooks_until_s: float  # the notebooks: until this long after the check started


def phase_limits(times: StepTimes = ASSUMED_H100, budget_s: float = BUDGET_S) -> PhaseLimits:
    """Twice each setup phase's estimate (at least PHASE_MIN_S; the tests at most a third of the
    budget); the notebooks until the budget's end, less SUMMARY_RESERVE_S to write the summary."""
    tests = min(max(PHASE_MIN_S, 2 * times.tests_s), budget_s / 3)
    return PhaseLimits(
        tests_s=tests,
        per_test_s=min(PER_TEST_S, tests),
        step_times_s=max(PHASE_MIN_S, 2 * times.step_times_s),
        fast_paths_s=max(PHASE_MIN_S, 2 * times.fast_paths_s),
        notebooks_until_s=budget_s - SUMMARY_RESERVE_S,
    )


@dataclass(frozen=True)
class NotebookPlan:
    notebook: str  # relative to the repository
    estimate: Estimate | None  # on the check's profile; None when it cannot run there
    student_estimate: Estimate | None  # at a student's full gpu sizes, for comparison
    skip_reason: str | None  # why it will not run (it does not fit, or has no sizes for the profile)

    @property
    def seconds(self) -> float:
        return self.estimate.seconds if self.estimate else 0.0


def estimate_notebook(notebook: str, profile: Profile, times: StepTimes) -> Estimate:
    """Its start-up plus its own work; KeyError when it has no sizes for `profile`."""
    start = Part("start: kernel, imports, CUDA context, the model", times.notebook_start_s)
    if notebook not in ESTIMATES:
        return Estimate(
            "?",
            (start, Part(f"no estimate written for it yet: assumed {UNKNOWN_NOTEBOOK_S:.0f} s", UNKNOWN_NOTEBOOK_S)),
        )
    own = ESTIMATES[notebook](profile, times)
    return replace(own, parts=(start, *own.parts))


def _try_estimate(notebook: str, profile: Profile, times: StepTimes) -> tuple[Estimate | None, str | None]:
    try:
        return estimate_notebook(notebook, profile, times), None
    except (KeyError, ValueError) as exc:  # a size table without a row for the profile
        return None, f"no sizes for {profile.name}: {exc.args[0]}"


def course_order(notebooks: list[str]) -> list[str]:
    """Week by week, each lecture before its lab's solution: "weeks/01_x", "solutions/01_x", "weeks/02_y"..."""
    return sorted(notebooks, key=lambda path: (path.rsplit("/", 1)[-1][:2], not path.startswith("weeks/"), path))


def plan(notebooks: list[str], times: StepTimes = ASSUMED_H100) -> list[NotebookPlan]:
    """In course order: each notebook's estimate on the check's profile, and whether it fits in the
    budget left after the setup (the GPU-only tests, the step times) and the notebooks before it
    (less the reserve for writing the summary: the notebooks' limit of phase_limits)."""
    check, student = PROFILES[CHECK_PROFILE], PROFILES[STUDENT_PROFILE]
    left = phase_limits(times).notebooks_until_s - times.setup_s
    plans = []
    for notebook in course_order(notebooks):
        estimate, missing = _try_estimate(notebook, check, times)
        student_estimate, _ = _try_estimate(notebook, student, times)
        reason = missing
        if estimate and estimate.seconds > left:
            reason = f"does not fit: estimated {estimate.seconds:.0f} s, {max(left, 0):.0f} s of the budget left"
        if reason is None:
            left -= estimate.seconds
        plans.append(NotebookPlan(notebook, estimate, student_estimate, reason))
    return plans


def planned_seconds(plans: list[NotebookPlan], times: StepTimes) -> float:
    """The whole check's estimate: the setup and every notebook that will run."""
    return times.setup_s + sum(p.seconds for p in plans if p.skip_reason is None)


def format_plan(plans: list[NotebookPlan], times: StepTimes, budget_s: float = BUDGET_S) -> str:
    """The plan as printed before the check runs (and by make gpu-check DRY=1)."""
    lines = [
        f"gpu-check plan: {budget_s / 60:.0f} minutes on one GPU; the notebooks run on the {CHECK_PROFILE} "
        f"profile (the {STUDENT_PROFILE} profile's model at smaller sizes: infer/profiles.py)",
        "",
        "Step times (every number below is steps x one of these):",
    ]
    for name in (
        "hf_decode_ms",
        "course_step_ms",
        "prefill_ms_per_1k",
        "notebook_start_s",
        "tests_s",
        "step_times_s",
        "fast_paths_s",
        "vllm_start_s",
    ):
        lines.append(f"  {name:<18} {getattr(times, name):>6.1f}  {times.sources.get(name, '')}")
    limits = phase_limits(times, budget_s)
    lines += [
        "",
        f"Time limits (a phase past its limit is stopped and the summary says so): the GPU-only tests "
        f"{limits.tests_s:.0f} s ({limits.per_test_s:.0f} s a test), the step times {limits.step_times_s:.0f} s, "
        f"the fast paths {limits.fast_paths_s:.0f} s, "
        f"the notebooks until {limits.notebooks_until_s:.0f} s from the start",
        "",
        f"{'setup':<46} {times.setup_s:>5.0f} s  the GPU-only tests, measuring the step times, the fast paths",
    ]
    for p in plans:
        student = f"; at {STUDENT_PROFILE} sizes ~{p.student_estimate.seconds:.0f} s" if p.student_estimate else ""
        if p.skip_reason:
            lines.append(f"{'skip ' + p.notebook:<46} {p.seconds:>5.0f} s  {p.skip_reason}{student}")
            continue
        lines.append(f"{'run  ' + p.notebook:<46} {p.seconds:>5.0f} s  sizes: {p.estimate.sizes}{student}")
        lines += [f"{'':<54}{part.seconds:>6.1f} s  {part.what}" for part in p.estimate.parts]
    total = planned_seconds(plans, times)
    lines += [
        "",
        f"total: {total:.0f} s of {budget_s:.0f} s ({total / 60:.1f} of {budget_s / 60:.0f} minutes), "
        f"{sum(p.skip_reason is None for p in plans)} of {len(plans)} notebooks",
    ]
    return "\n".join(lines)
