"""The machinery of the GPU path that a CPU can check: gpu-check's refusal without CUDA, the
notebook runner it shares with the gpu-dryrun test, and gpu-env-check's verdicts on pip reports."""

import os
import subprocess
import sys

import nbformat
import pytest
import torch

from infer.course.gpu_env_check import course_requirements, judge, resolved_versions
from infer.course.profile_run import profile_environment, run_notebook
from tests.notebook_files import REPO_ROOT


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_check_without_cuda_says_so_in_one_line_and_fails(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "infer.course.gpu_check", "--out", str(tmp_path / "out")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stdout.count("\n") == 1 and "needs a CUDA GPU" in done.stdout, done.stdout
    assert not (tmp_path / "out").exists(), "nothing runs, so nothing is written"


def test_profile_environment_is_set_for_kernels_and_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("INFER_PROFILE", "cpu")
    with profile_environment("gpu-dryrun", tmp_path):
        assert os.environ["INFER_PROFILE"] == "gpu-dryrun"
        assert os.environ["INFER_FIGURES_DIR"] == str(tmp_path / "figures")
    assert os.environ["INFER_PROFILE"] == "cpu"
    with pytest.raises(ValueError, match="valid profiles"):
        with profile_environment("tpu", tmp_path):
            pass


def _notebook(tmp_path, *sources, name="probe"):
    path = tmp_path / f"{name}.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources]), path)
    return path


def test_a_failing_notebook_is_reported_and_kept(tmp_path):
    path = _notebook(
        tmp_path,
        "import os; print('profile:', os.environ['INFER_PROFILE'])",
        "print('Skipped: the allocator check needs a CUDA GPU')",
        "1 / 0",
        "print('never')",
    )
    run = run_notebook(path, "gpu-dryrun", tmp_path / "out")
    assert run.error == "ZeroDivisionError: division by zero"
    assert run.executed.exists(), "the half-run copy is kept for reading"
    assert "profile: gpu-dryrun" in run.output_text and "never" not in run.output_text
    assert run.skip_lines == ("Skipped: the allocator check needs a CUDA GPU",)
    assert run.line.startswith("FAILED")


def test_a_failed_check_line_fails_the_notebook(tmp_path):
    """Lab 02's check caught the device error of a CPU prompt and printed it as a ❌ line, and the
    notebook counted as run (issue 22, item 5): a check that fails on the stand-in fails the run."""
    run = run_notebook(
        _notebook(tmp_path, "print('❌ 02.lab.cached_loop: raised RuntimeError: devices')"),
        "gpu-dryrun",
        tmp_path / "out",
    )
    assert run.error == "a check failed: ❌ 02.lab.cached_loop: raised RuntimeError: devices"


def test_a_cell_past_its_limit_or_a_dead_kernel_fails_that_notebook_only(tmp_path):
    """nbclient raises these instead of CellExecutionError; before issue 22 they ended make gpu-check."""
    slow = run_notebook(
        _notebook(tmp_path, "import time; time.sleep(60)", name="slow"),
        "gpu-dryrun",
        tmp_path / "out",
        cell_timeout_s=3,
    )
    assert slow.error and slow.error.startswith("CellTimeoutError") and "3 seconds" in slow.error, slow.error
    dead = run_notebook(_notebook(tmp_path, "import os; os._exit(1)", name="dead"), "gpu-dryrun", tmp_path / "out")
    assert dead.error and dead.error.startswith("DeadKernelError"), dead.error
    assert slow.executed.exists() and dead.executed.exists(), "the half-run copies are kept for reading"


def _report(**packages):
    return {"install": [{"metadata": {"name": name, "version": version}} for name, version in packages.items()]}


def test_gpu_env_verdicts():
    cuda = {"torch": "2.14.0", "nvidia_cuda_runtime": "13.0.96"}
    assert not judge("course", resolved_versions(_report(**cuda, transformers="5.30.0"))).problems
    cpu_torch = judge("course", resolved_versions(_report(torch="2.13.0+cpu")))
    assert "CPU build" in cpu_torch.problems[0]
    vllm_beside = judge("course", resolved_versions(_report(**cuda, vllm="0.30.0")))
    assert "belongs in .venv-vllm" in vllm_beside.problems[0]
    backtracked = judge("vllm", resolved_versions(_report(**cuda, vllm="0.30.0")), expect_vllm="vllm==0.33.0")
    assert "not the documented 0.33.0" in backtracked.problems[0]
    assert not judge("vllm", resolved_versions(_report(**cuda, vllm="0.33.0")), expect_vllm="vllm==0.33.0").problems


def test_course_requirements_come_from_pyproject():
    requirements = course_requirements()
    assert any(r.startswith("transformers") for r in requirements)
    assert any(r.startswith("jupyterlab") for r in requirements), "environment.yml installs the lab extra"
    assert not any(r.startswith("vllm") for r in requirements)


def test_week03_finds_vllm_in_its_own_venv(tmp_path, monkeypatch):
    from infer.serve import vllm_server
    from infer.serve.vllm_server import vllm_executable

    venv = tmp_path / ".venv-vllm"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "vllm").write_text("#!/bin/sh\n")
    monkeypatch.setattr(vllm_server, "VLLM_VENV", venv)
    assert vllm_executable() == str(venv / "bin" / "vllm"), "make vllm's venv comes first"
    monkeypatch.setattr(vllm_server, "VLLM_VENV", tmp_path / "absent")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vllm_executable() is None
