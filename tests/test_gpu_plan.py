"""make gpu-check's 10 minutes, checked on a CPU: the plan (make gpu-check DRY=1), the budget it
keeps, what it skips and why, and a run that goes on past a failing notebook and always leaves
its summary (issue 22, items 1 and 2)."""

import json
import re
import subprocess
import sys
import time
from dataclasses import replace

import nbformat

from infer.course import gpu_check
from infer.course.gpu_plan import (
    ASSUMED_H100,
    BUDGET_S,
    ESTIMATES,
    Estimate,
    NotebookPlan,
    Part,
    PhaseLimits,
    estimate_notebook,
    format_plan,
    phase_limits,
    plan,
    planned_seconds,
)
from infer.course.notebooks import CELL_TIMEOUT_S
from infer.course.profile_run import course_notebooks, shown_path
from infer.profiles import PROFILES
from tests.notebook_files import REPO_ROOT

NOTEBOOKS = [str(shown_path(p)) for p in course_notebooks()]


def test_dry_run_prints_a_plan_within_the_budget_and_its_assumptions():
    done = subprocess.run(
        [sys.executable, "-m", "infer.course.gpu_check", "--dry-run"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    total = re.search(r"^total: (\d+) s of 600 s", done.stdout, re.MULTILINE)
    assert total and int(total.group(1)) <= BUDGET_S, done.stdout[-2000:]
    assert "estimate:" in done.stdout and "hf_decode_ms" in done.stdout, "each assumed step time says its source"
    for notebook in NOTEBOOKS:
        assert re.search(rf"^(run |skip) +{re.escape(notebook)} ", done.stdout, re.MULTILINE), f"{notebook} not planned"


def test_make_gpu_check_dry_passes_dry_run():
    planned = subprocess.run(["make", "-n", "gpu-check", "DRY=1"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    assert "infer.course.gpu_check" in planned and "--dry-run" in planned and "--weights random" in planned
    assert (
        "--dry-run"
        not in subprocess.run(["make", "-n", "gpu-check"], cwd=REPO_ROOT, capture_output=True, text=True).stdout
    )


def test_every_course_notebook_has_an_estimate():
    missing = sorted(set(NOTEBOOKS) - set(ESTIMATES))
    assert not missing, f"write an estimate in infer/course/gpu_plan.py (ESTIMATES) for {missing}"


def test_the_gpu_profile_sizes_overrun_a_cell_the_check_sizes_do_not():
    """Week 03's baseline at the gpu profile's sizes: ~31,000 decode steps, past the 300 s cell limit."""
    full = estimate_notebook("weeks/03_measuring.ipynb", PROFILES["gpu"], ASSUMED_H100)
    assert full.seconds > CELL_TIMEOUT_S, full
    for p in plan(NOTEBOOKS):
        if p.skip_reason is None:
            assert p.seconds < CELL_TIMEOUT_S, f"{p.notebook} is planned at {p.seconds:.0f} s: over a cell's limit"


def test_a_notebook_without_check_sizes_is_skipped_and_named():
    week05 = next(p for p in plan(NOTEBOOKS) if p.notebook == "weeks/05_continuous_batching.ipynb")
    assert week05.skip_reason and "batching_study.STUDY_SIZES has no 'gpu-check' row" in week05.skip_reason
    assert week05.student_estimate is not None, "its estimate at the gpu profile's sizes is still shown"


def test_what_does_not_fit_is_skipped_with_its_estimate():
    slow = replace(ASSUMED_H100, hf_decode_ms=500.0, course_step_ms=500.0)
    plans = plan(NOTEBOOKS, slow)
    skipped = [p for p in plans if p.skip_reason and p.skip_reason.startswith("does not fit: estimated")]
    assert skipped, "a GPU 25 times slower than assumed cannot run everything in 10 minutes"
    assert planned_seconds(plans, slow) <= BUDGET_S
    assert all(f"skip {p.notebook}" in format_plan(plans, slow) for p in skipped)


def test_cell_limit_is_twice_the_estimate_within_the_budget():
    assert gpu_check.cell_limit_s(20, 500) == 60
    assert gpu_check.cell_limit_s(100, 500) == 200
    assert gpu_check.cell_limit_s(100, 90) == 90, "never past what is left"
    assert gpu_check.cell_limit_s(400, 550) == CELL_TIMEOUT_S


def test_step_times_are_measured_on_the_profiles_model():
    times = gpu_check.measure_step_times(PROFILES["cpu"], ASSUMED_H100, prompt_len=64)
    assert times.hf_decode_ms > 0 and times.course_step_ms > 0 and times.prefill_ms_per_1k > 0
    assert times.sources["hf_decode_ms"].startswith("measured on cpu"), times.sources


def _notebook(folder, name, *sources):
    path = folder / name
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return str(path)


def test_the_check_goes_on_past_a_timed_out_notebook_and_writes_its_summary(tmp_path, monkeypatch):
    """Before issue 22, a cell past its limit ended gpu-check: no later notebook, no summary.txt."""
    slow = _notebook(tmp_path, "01_slow.ipynb", "import time; time.sleep(60)")
    fast = _notebook(tmp_path, "02_fast.ipynb", "import os; print(os.environ['INFER_WEIGHTS'])")
    monkeypatch.setattr(
        gpu_check,
        "machine_provenance",
        lambda: {"gpu": "a stand-in", "date": "today", "commit": "c", "driver": "-", "torch": "-"},
    )
    monkeypatch.setattr(gpu_check, "run_gpu_tests", lambda out, limits: ([], ["test_vllm: no .venv-vllm"]))
    monkeypatch.setattr(gpu_check, "measure_step_times_within", lambda out, limit_s: ASSUMED_H100)
    monkeypatch.setattr(gpu_check, "cell_limit_s", lambda estimate_s, left_s: 3)
    status = gpu_check.run_check(tmp_path / "out", [slow, fast], weights="random")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert status == 1
    assert re.search(r"^FAILED +01_slow.ipynb .*CellTimeoutError", summary, re.MULTILINE), summary
    assert re.search(r"^ran +02_fast.ipynb ", summary, re.MULTILINE), "the notebook after it still ran"
    assert "random weights" in summary and "test_vllm: no .venv-vllm" in summary
    assert (tmp_path / "out" / "plan.txt").exists()


def _stand_in_machine(monkeypatch):
    monkeypatch.setattr(
        gpu_check,
        "machine_provenance",
        lambda: {"gpu": "a stand-in", "date": "today", "commit": "c", "driver": "-", "torch": "-"},
    )


def test_every_phase_has_a_limit_derived_from_the_plan():
    """Review F4: the GPU-only tests ran with no overall limit (pytest-timeout's 900 s per test)."""
    limits = phase_limits(ASSUMED_H100)
    assert ASSUMED_H100.tests_s >= 18 * 3, "the GPU tests compile the Triton kernel 18 times (3 dtypes x 2 masks x 3 d)"
    assert limits.tests_s >= ASSUMED_H100.tests_s and limits.step_times_s >= ASSUMED_H100.step_times_s
    assert limits.per_test_s <= 120, "one GPU test may not take 900 s (pyproject's pytest-timeout) of a 600 s check"
    assert limits.tests_s + limits.step_times_s < limits.notebooks_until_s < BUDGET_S, (
        "the notebooks must stop before the budget's end, leaving time to write summary.txt"
    )
    assert "--timeout=120" in gpu_check.gpu_tests_command(REPO_ROOT / "r.xml", limits.per_test_s)
    assert "Time limits" in format_plan(plan(NOTEBOOKS), ASSUMED_H100), "make gpu-check DRY=1 prints the limits"


def test_a_phase_past_its_limit_is_stopped_and_the_summary_says_so(tmp_path, monkeypatch):
    """A GPU-only test that hangs, a step-time measurement that hangs, a fast-path measurement that
    hangs and a notebook whose cells each fit their limit but together overrun: each phase stops at
    its limit, and summary.txt comes back in seconds, naming each stop (review F4)."""
    _stand_in_machine(monkeypatch)
    hang = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(gpu_check, "gpu_tests_command", lambda report, per_test_s: hang)
    monkeypatch.setattr(gpu_check, "step_times_command", lambda path: hang)
    monkeypatch.setattr(gpu_check, "fast_paths_command", lambda results: hang)
    monkeypatch.setattr(
        gpu_check,
        "phase_limits",
        lambda times: PhaseLimits(tests_s=2, per_test_s=2, step_times_s=2, fast_paths_s=2, notebooks_until_s=16),
    )
    quick = Estimate("-", (Part("estimated quick", 1.0),))
    monkeypatch.setattr(
        gpu_check, "plan", lambda notebooks, times: [NotebookPlan(n, quick, None, None) for n in notebooks]
    )
    slow = _notebook(tmp_path, "01_slow.ipynb", *["import time; time.sleep(2)"] * 30)
    later = _notebook(tmp_path, "02_later.ipynb", "print('never')")
    started = time.perf_counter()
    status = gpu_check.run_check(tmp_path / "out", [slow, later], weights="random")
    took = time.perf_counter() - started
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert status == 1
    assert took < 40, f"the phases were not stopped at their limits: {took:.0f} s"
    assert re.search(r"^GPU-only tests: stopped after 2 s, its time limit", summary, re.MULTILINE), summary
    assert "step times not measured (RuntimeError: stopped after 2 s, its time limit" in summary, summary
    assert re.search(r"^fast paths: stopped after 2 s, its time limit", summary, re.MULTILINE), summary
    assert re.search(r"^FAILED +01_slow.ipynb .*stopped at the notebooks' time limit", summary, re.MULTILINE), summary
    assert re.search(r"^skipped .*02_later.ipynb: .*0 s of the budget left", summary, re.MULTILINE), summary


def test_the_fast_paths_go_into_the_summary_and_changed_tokens_fail(tmp_path, monkeypatch):
    """gpu-check's fast-path phase: its lines reach the report, a kernel that could not run is a
    skip with its reason, and replayed decode steps that changed a token are a failure."""
    speed = {"median": 2.0, "min": 1.9, "max": 2.1, "per_round": [2.0]}
    result = {
        "kernels": ["sdpa", "triton"],
        "unavailable": {"flash-attn": "flash-attn is not installed"},
        "cases": [
            {
                "batch": 1,
                "step_ms": {
                    f"{k} {m}": {**speed, "median": t}
                    for k in ("sdpa", "triton")
                    for m, t in (("eager", 20.0), ("graphs", 10.0))
                },  # fmt: skip
                "graph_speedup": {"sdpa": speed, "triton": speed},
                "graphs_same_tokens_as_eager": {"sdpa": True, "triton": False},
                "hbm_roofline_share": {"sdpa graphs": 0.4, "triton graphs": 0.6},
            }
        ],
    }
    path = tmp_path / "results" / f"09_gpu_fast_paths_{gpu_check.CHECK_PROFILE}.json"
    write = (
        f"import json, pathlib; p = pathlib.Path({str(path)!r}); p.parent.mkdir(); p.write_text({json.dumps(result)!r})"
    )
    monkeypatch.setattr(gpu_check, "fast_paths_command", lambda results: [sys.executable, "-c", write])
    report = gpu_check.Report()
    gpu_check.run_fast_paths(tmp_path, report, limit_s=60)
    assert report.lines[0].startswith("fast paths: kernels sdpa, triton (")
    assert report.lines[-1] == (
        "  batch 1: sdpa 20.00 -> 10.00 ms (2.00x, same tokens, 40% of HBM roofline); "
        "triton 20.00 -> 10.00 ms (2.00x, TOKENS DIFFER, 60% of HBM roofline)"
    )
    assert report.failures == ["fast paths, batch 1: triton's replayed decode steps changed a greedy token"]
    assert report.skips == ["fast paths: flash-attn: flash-attn is not installed"]
