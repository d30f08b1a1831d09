"""`make gpu-check`: the course's first run on a real GPU, in one command, within 10 minutes.

1. The plan (infer/course/gpu_plan.py): each notebook's estimated time, the sizes it runs at,
   what fits and what is skipped and why. Printed first; `--dry-run` (make gpu-check DRY=1)
   prints it on any machine and stops there.
2. The GPU-only tests (tests/test_gpu_only.py: the gpu profile's model in bf16, SDPA backends,
   flash-attn, the CUDA allocator, lab 01's check of synchronized timestamps, vLLM's CUDA build;
   and the Triton kernel on CUDA), with a JUnit report.
3. This GPU's step times, measured in seconds, and the plan made again with them.
   Then the decode fast paths (infer.experiments.decode_fast_paths): eager steps against CUDA
   graphs at batch 1, 8 and 32 for each attention kernel installed, with their tokens compared
   and their share of the HBM roofline; results/09_gpu_fast_paths_gpu-check.json.
4. The notebooks on the `gpu-check` profile (the gpu profile's model at smaller sizes), in course
   order, each while its estimate fits what is left of the budget, each cell within a time limit.
   Every notebook loads random weights unless --weights says otherwise: no download surprises the
   budget, and the summary says which.

Everything lands in one folder (default _build/gpu-check): plan.txt, tests.xml and tests.log,
notebooks/ (the executed copies), figures/ and results/ (each stamped with its provenance),
provenance.json (GPU, driver, versions, commit) and summary.txt, written even when something
fails: each notebook ran, FAILED or was skipped, with its time and why. Each phase (the tests, the
step times, the notebooks) runs within a time limit derived from the plan (gpu_plan.phase_limits);
one past it is stopped, and the summary says which, so that it comes back within the 10 minutes.
Without CUDA (and without --dry-run) it says so in one line and exits with status 2: nothing here
fakes a GPU result."""

import argparse
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from infer.availability import error_line
from infer.course.gpu_plan import (
    ASSUMED_H100,
    BUDGET_S,
    CHECK_PROFILE,
    NotebookPlan,
    PhaseLimits,
    StepTimes,
    format_plan,
    phase_limits,
    plan,
)
from infer.course.notebooks import CELL_TIMEOUT_S
from infer.course.profile_run import REPO_ROOT, course_notebooks, run_notebook, shown_path, skipped_line, write_summary
from infer.profiles import PROFILES, Profile
from infer.provenance import git_commit, nvidia_driver_version, versions, vllm_version

GPU_TESTS = [
    "tests/test_gpu_only.py",
    "tests/test_attention.py::test_triton_kernel_on_cuda",
    # the fast paths: the paged Triton kernel in bf16 and inside a graph, flash-attn's paged kernels,
    # and the engine's tokens with graphs and each kernel against its eager steps
    "tests/test_paged_decode_triton.py::test_the_kernel_on_cuda[torch.bfloat16]",
    "tests/test_paged_decode_triton.py::test_the_kernel_replays_in_a_cuda_graph_with_new_lengths_and_tables",
    "tests/test_flash_attn_paged.py",
    "tests/test_cuda_graphs.py::test_cuda_graphs_give_the_eager_engines_tokens",
]
MIN_CELL_LIMIT_S = 60  # a notebook's cells get twice its estimate, never less than this, never past the budget


def no_cuda_reason() -> str | None:
    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    return (
        f"make gpu-check needs a CUDA GPU, and torch {torch.__version__} ({build}) sees none; nothing was run "
        f"(make gpu-check DRY=1 prints its plan)."
    )


def machine_provenance() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpu_memory_gb": round(props.total_memory / 1e9, 1),
        "compute_capability": f"{props.major}.{props.minor}",
        "driver": nvidia_driver_version(),
        "cuda_runtime": torch.version.cuda,
        "vllm": vllm_version(),
        "commit": git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **versions(),
    }


def run_phase(command: list[str], limit_s: float, log_path: Path) -> str | None:
    """Run `command` (output to `log_path`) for at most `limit_s` seconds; None when it ended by
    itself, else the line saying it was stopped. It runs in a session of its own, so that stopping
    it stops what it started too (a notebook kernel, a vLLM import)."""
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=limit_s)
            return None
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return f"stopped after {limit_s:.0f} s, its time limit (see {log_path.name} for how far it got)"


def gpu_tests_command(report: Path, per_test_s: float) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-rs", f"--timeout={per_test_s:.0f}",
            f"--junitxml={report}", *GPU_TESTS]  # fmt: skip


def run_gpu_tests(out_dir: Path, limits: PhaseLimits) -> tuple[list[str], list[str]]:
    """Run the GPU-only tests within `limits`; (failures, skips), one line each with the reason."""
    report = out_dir / "tests.xml"
    stopped = run_phase(gpu_tests_command(report, limits.per_test_s), limits.tests_s, out_dir / "tests.log")
    if stopped:
        return [f"GPU-only tests: {stopped}"], []
    if not report.exists():
        return [f"pytest wrote no report; see {out_dir / 'tests.log'}"], []
    failures, skips = [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        for tag, bucket in (("failure", failures), ("error", failures), ("skipped", skips)):
            element = case.find(tag)
            if element is not None:
                message = (element.get("message") or element.text or "").strip().splitlines()
                bucket.append(f"{name}: {message[0][:300] if message else tag}")
    return failures, skips


def measure_step_times(profile: Profile, assumed: StepTimes, prompt_len: int = 4096) -> StepTimes:
    """The plan's step times, measured here on `profile`'s model with random weights (seconds):
    a transformers decode step, a step of the course's model, and a long prefill per 1,000 tokens."""
    from infer.experiments.prefill_decode import decode_step_ms, prefill_ms
    from infer.generate import cached_greedy_generate
    from infer.kv_cache import KVCache
    from infer.model import Transformer
    from infer.models import describe_device, load_model
    from infer.prompts import random_prompt_ids

    lm = load_model(profile=profile, weights="random", quiet=True)
    prompt = random_prompt_ids(lm.config, prompt_len, seed=0).to(lm.device)
    hf_decode = decode_step_ms(lm.model, prompt[:, :256], repeats=10).median_ms
    prefill = prefill_ms(lm.model, prompt, repeats=3).median_ms
    model = Transformer.from_hf(lm.model)
    stamps: list[float] = []
    for _ in range(2):  # the first run pays for allocations and kernel selection
        stamps.clear()
        cached_greedy_generate(model, prompt[:, :16], 17, KVCache.for_model(model, 1, 33), timestamps=stamps)
    course_step = statistics.median(later - earlier for earlier, later in zip(stamps, stamps[1:])) * 1e3
    where = f"measured on {describe_device(lm.device)}"
    del lm, model
    gc.collect()
    torch.cuda.empty_cache()  # the notebooks that follow get the whole card
    return replace(
        assumed,
        hf_decode_ms=hf_decode,
        course_step_ms=course_step,
        prefill_ms_per_1k=prefill / prompt_len * 1000,
        sources={
            **assumed.sources,
            "hf_decode_ms": f"{where}: median of 10 steps on a 256-token context",
            "course_step_ms": f"{where}: median gap between 16 tokens of cached_greedy_generate",
            "prefill_ms_per_1k": f"{where}: a {prompt_len}-token prefill, median of 3",
        },
    )


def step_times_command(json_path: Path) -> list[str]:
    return [sys.executable, "-m", "infer.course.gpu_check", "--measure-step-times", str(json_path)]


def measure_step_times_within(out_dir: Path, limit_s: float) -> StepTimes:
    """measure_step_times in a process of its own, stopped after `limit_s` seconds (RuntimeError)."""
    path = out_dir / "step_times.json"
    stopped = run_phase(step_times_command(path), limit_s, out_dir / "step_times.log")
    if stopped:
        raise RuntimeError(stopped)
    if not path.exists():
        raise RuntimeError(f"the measurement wrote no {path.name}; see step_times.log")
    return StepTimes(**json.loads(path.read_text()))


def cell_limit_s(estimate_s: float, left_s: float) -> int:
    """A notebook's cells get twice its estimate (at least MIN_CELL_LIMIT_S), never past what is left."""
    return int(max(1, min(CELL_TIMEOUT_S, max(MIN_CELL_LIMIT_S, 2 * estimate_s), left_s)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "gpu-check")
    parser.add_argument("--dry-run", action="store_true", help="print the plan (assumed step times) and stop")
    parser.add_argument("--measure-step-times", type=Path, metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument(
        "--weights",
        choices=("random", "auto", "pretrained"),
        default="random",
        help="the weights every notebook loads (default: random, no download)",
    )
    args = parser.parse_args(argv)
    if args.measure_step_times:  # the check's step-time phase, in a process it can stop
        times = measure_step_times(PROFILES[CHECK_PROFILE], ASSUMED_H100)
        args.measure_step_times.write_text(json.dumps(asdict(times), indent=2) + "\n")
        return 0
    notebooks = [str(shown_path(p)) for p in course_notebooks()]
    if args.dry_run:
        print(format_plan(plan(notebooks, ASSUMED_H100), ASSUMED_H100))
        print("\nA dry run: nothing was run. On a GPU, make gpu-check measures the step times first and plans again.")
        return 0
    reason = no_cuda_reason()
    if reason:
        print(reason)
        return 2
    return run_check(args.out, notebooks, args.weights)


@dataclass
class Report:
    """What summary.txt will say, gathered as the check goes (and printed as it goes)."""

    lines: list[str] = field(default_factory=list)  # one per step: the tests, then each notebook
    failures: list[str] = field(default_factory=list)
    skips: list[str] = field(default_factory=list)  # what could not run inside a test or notebook, and why

    def add(self, line: str) -> None:
        self.lines.append(line)
        print(line, flush=True)


def run_check(out: Path, notebooks: list[str], weights: str) -> int:
    started = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    meta = machine_provenance()
    (out / "provenance.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"gpu-check on {meta['gpu']} (driver {meta['driver']}, torch {meta['torch']}) -> {out}", flush=True)
    print(format_plan(plan(notebooks, ASSUMED_H100), ASSUMED_H100) + "\n", flush=True)
    limits = phase_limits(ASSUMED_H100)  # fixed before anything runs: measured step times change only the plan
    report = Report()
    try:
        report.failures, report.skips = run_gpu_tests(out, limits)
        tests_s = time.perf_counter() - started
        report.add(
            f"GPU-only tests: {len(report.failures)} failed, {len(report.skips)} skipped ({tests_s:.0f} s of "
            f"{limits.tests_s:.0f} s allowed; tests.log)"
        )
        times = step_times_here(out, report, limits.step_times_s)
        step_times_s = time.perf_counter() - started - tests_s
        run_fast_paths(out, report, limits.fast_paths_s)
        times = replace(
            times,
            tests_s=tests_s,
            step_times_s=step_times_s,
            fast_paths_s=time.perf_counter() - started - tests_s - step_times_s,
            sources={
                **times.sources,
                "tests_s": "measured: the GPU-only tests above",
                "step_times_s": "measured: the step times above",
                "fast_paths_s": "measured: the fast paths above",
            },
        )
        plans = plan(notebooks, times)
        (out / "plan.txt").write_text(format_plan(plans, times) + "\n")
        print(f"\nThe plan again, with this GPU's step times (plan.txt):\n{format_plan(plans, times)}\n", flush=True)
        run_planned(plans, out, weights, started + limits.notebooks_until_s, report)
    except Exception as exc:  # noqa: BLE001 - the summary is written whatever stops the check
        report.failures.append(f"gpu-check itself stopped: {type(exc).__name__}: {exc}")
        raise
    finally:
        elapsed = time.perf_counter() - started
        header = [
            f"gpu-check: {meta['gpu']}, {meta['date']}, commit {meta['commit']}, {elapsed / 60:.1f} min of "
            f"{BUDGET_S / 60:.0f}{'' if elapsed <= BUDGET_S else ' (OVER the budget)'}",
            f"notebooks on the {CHECK_PROFILE} profile (the gpu profile's model at the sizes of plan.txt), "
            f"{weights} weights (--weights)",
        ]
        tail = [
            "",
            "Failed:",
            *(report.failures or ["nothing"]),
            "",
            "Could not run, and why:",
            *(report.skips or ["nothing"]),
        ]
        summary = write_summary(out, header, report.lines + tail)
        print("\n".join(tail[1:]))
        print(f"Everything is in {out}; {summary.name} holds this list.")
    return 0 if not report.failures else 1


def step_times_here(out: Path, report: Report, limit_s: float) -> StepTimes:
    """This GPU's step times, measured within `limit_s` seconds, or the assumed ones (said in the
    report) when measuring them fails or overruns."""
    try:
        return measure_step_times_within(out, limit_s)
    except Exception as exc:  # noqa: BLE001 - the notebooks can still run on the assumed step times
        report.add(f"step times not measured ({error_line(exc)}): the plan keeps its assumptions")
        return ASSUMED_H100


def fast_paths_command(results: Path) -> list[str]:
    experiment = "infer.experiments.decode_fast_paths"
    return [sys.executable, "-m", experiment, "--profile", CHECK_PROFILE, "--out", str(results)]


def run_fast_paths(out: Path, report: Report, limit_s: float) -> None:
    """The decode fast paths side by side (eager against CUDA graphs, for each attention kernel
    installed), within `limit_s` seconds: its lines go into the summary; replayed tokens that
    differ from eager ones, or a run that fails or overruns, are failures."""
    started = time.perf_counter()
    stopped = run_phase(fast_paths_command(out / "results"), limit_s, out / "fast_paths.log")
    path = out / "results" / f"09_gpu_fast_paths_{CHECK_PROFILE}.json"
    if stopped or not path.exists():
        failure = f"fast paths: {stopped or 'wrote no results; see fast_paths.log'}"
        report.add(failure)
        report.failures.append(failure)
        return
    from infer.experiments.decode_fast_paths import summary_lines

    result = json.loads(path.read_text())
    lines = summary_lines(result)
    lines[0] += f" ({time.perf_counter() - started:.0f} s of {limit_s:.0f} s allowed; {path.name})"
    for line in lines:
        report.add(line)
    report.skips += [f"fast paths: {kernel}: {why}" for kernel, why in result["unavailable"].items()]
    report.failures += [
        f"fast paths, batch {case['batch']}: {kernel}'s replayed decode steps changed a greedy token"
        for case in result["cases"]
        for kernel, same in case["graphs_same_tokens_as_eager"].items()
        if not same
    ]


def run_planned(plans: list[NotebookPlan], out: Path, weights: str, deadline: float, report: Report) -> None:
    """Each planned notebook while its estimate fits before `deadline` (a perf_counter time), the
    notebooks' time limit: no cell runs past it, and a notebook stopped there is reported so."""
    for p in plans:
        left = deadline - time.perf_counter()
        if p.skip_reason or p.seconds > left:
            report.add(
                skipped_line(
                    p.notebook, p.skip_reason or f"estimated {p.seconds:.0f} s, {max(left, 0):.0f} s of the budget left"
                )
            )
            continue
        run = run_notebook(
            REPO_ROOT / p.notebook,
            CHECK_PROFILE,
            out,
            weights=weights,
            cell_timeout_s=cell_limit_s(p.seconds, left),
            deadline=deadline,
        )
        if run.error and time.perf_counter() >= deadline:
            run = replace(run, error=f"stopped at the notebooks' time limit: {run.error}")
        report.add(run.summary_line(estimated_s=p.seconds))
        report.failures += [run.line] if run.error else []
        report.skips += [f"{run.notebook}: {line}" for line in run.skip_lines]


if __name__ == "__main__":
    sys.exit(main())
