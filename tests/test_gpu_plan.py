"""make gpu-check's 10 minutes, checked on a CPU: the plan (make gpu-check DRY=1), the budget it
keeps, what it skips and why, and a run that goes on past a failing notebook and always leaves
its summary (issue 22, items 1 and 2)."""

import re
import subprocess
import sys
from dataclasses import replace

import nbformat

from infer.course import gpu_check
from infer.course.gpu_plan import (
    ASSUMED_H100,
    BUDGET_S,
    ESTIMATES,
    estimate_notebook,
    format_plan,
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
    monkeypatch.setattr(gpu_check, "run_gpu_tests", lambda out: ([], ["test_vllm: no .venv-vllm"]))
    monkeypatch.setattr(gpu_check, "measure_step_times", lambda profile, assumed: assumed)
    monkeypatch.setattr(gpu_check, "cell_limit_s", lambda estimate_s, left_s: 3)
    status = gpu_check.run_check(tmp_path / "out", [slow, fast], weights="random")
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert status == 1
    assert re.search(r"^FAILED +01_slow.ipynb .*CellTimeoutError", summary, re.MULTILINE), summary
    assert re.search(r"^ran +02_fast.ipynb ", summary, re.MULTILINE), "the notebook after it still ran"
    assert "random weights" in summary and "test_vllm: no .venv-vllm" in summary
    assert (tmp_path / "out" / "plan.txt").exists()
