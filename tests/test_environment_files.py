"""environment.yml (students' GPU instance) and pyproject.toml must describe the same project."""

import re

import tomllib
import yaml

from infer.course.gpu_env_check import COURSE_EXTRAS
from tests.notebook_files import REPO_ROOT

PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
ENVIRONMENT = yaml.safe_load((REPO_ROOT / "environment.yml").read_text())


def _pip_entries():
    pip_sections = [d["pip"] for d in ENVIRONMENT["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip section"
    return pip_sections[0]


def test_environment_installs_this_project_with_known_extras():
    entries = _pip_entries()
    project = [e for e in entries if e.startswith("-e .")]
    assert project, "environment.yml must install the project itself (-e .[...])"
    extras = set(re.search(r"\[(.*)\]", project[0]).group(1).split(","))
    known = set(PYPROJECT["project"]["optional-dependencies"])
    assert extras <= known, f"environment.yml asks for extras pyproject.toml lacks: {sorted(extras - known)}"
    assert extras == set(COURSE_EXTRAS), (
        f"environment.yml installs {sorted(extras)}; make gpu-env-check resolves {COURSE_EXTRAS}"
    )


def test_no_package_is_declared_only_in_environment_yml():
    others = [e for e in _pip_entries() if not e.startswith("-e .")]
    assert not others, f"declare these in pyproject.toml, not in environment.yml: {others}"


def test_python_versions_agree():
    python = next(d for d in ENVIRONMENT["dependencies"] if isinstance(d, str) and d.startswith("python"))
    version = python.split("=")[-1]
    minimum = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert tuple(map(int, version.split("."))) >= tuple(map(int, minimum.split("."))), (
        f"environment.yml's {python} is older than requires-python {minimum}"
    )


def test_vllm_stays_out_of_the_course_environment():
    """vLLM pins an older transformers than the course needs; installed beside it, pip would quietly
    backtrack to an old vLLM. It lives in .venv-vllm (make vllm), with one pinned CUDA version."""
    course = [
        *PYPROJECT["project"]["dependencies"],
        *(req for reqs in PYPROJECT["project"]["optional-dependencies"].values() for req in reqs),
    ]
    assert not [r for r in course if re.match(r"vllm\b", r)], (
        "vLLM belongs in .venv-vllm, not in the course's requirements"
    )
    makefile = (REPO_ROOT / "Makefile").read_text()
    assert re.search(r"^VLLM_CUDA := vllm==\d+\.\d+\.\d+$", makefile, re.M), "make vllm installs one pinned CUDA vLLM"
    assert "gpu-env-check:" in makefile


def test_flash_attn_step_is_documented():
    text = (REPO_ROOT / "environment.yml").read_text()
    assert "pip install flash-attn" in text and "--no-build-isolation" in text


def test_torch_is_a_range_not_a_pin():
    torch_req = next(r for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch"))
    assert "==" not in torch_req, (
        "pin the CPU torch in the Makefile, not in the project: GPU users need their CUDA build"
    )
