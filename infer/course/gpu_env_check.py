"""`make gpu-env-check`: do the two environments of a GPU instance resolve as README.md says?

A GPU student has two environments, because vLLM pins an older `transformers` than the course
needs (vllm 0.33 wants transformers < 5.21 and torch == 2.14.0; the course wants transformers
>= 5.24). Installed together, pip backtracks to an old vLLM without a word. So:

- the course's environment (environment.yml): the project with its test, site and lab extras,
  and the CUDA build of torch from PyPI;
- vLLM's environment (.venv-vllm, `make vllm`): the pinned CUDA `vllm`, with the torch and
  transformers it asks for. Week 07 starts vLLM's server from there, as a separate process.

This asks pip to resolve both (`pip install --dry-run --ignore-installed --report`): it installs
nothing, but it downloads the metadata, and wheels where the index offers no metadata file, of
some 200 packages. That takes minutes, which is why it is a make target and not a CI test. It
fails when either environment cannot be resolved, when vLLM is not the pinned version, or when the
course's torch is not a CUDA build (the nvidia-* runtime wheels did not come with it).

    python -m infer.course.gpu_env_check --vllm vllm==0.33.0 --out _build/gpu-env"""

import argparse
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import tomllib

from infer.paths import REPO_ROOT

COURSE_EXTRAS = ("test", "site", "lab")  # what environment.yml installs with the project
CUDA_RUNTIME = re.compile(r"^nvidia-cuda-runtime(-cu\d+)?$")  # the wheel that makes a torch a CUDA torch


def course_requirements(pyproject: Path = REPO_ROOT / "pyproject.toml") -> list[str]:
    """The project's own requirements plus its GPU-environment extras, as pip arguments (the project
    itself is left out: resolving it would build it)."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project.get("optional-dependencies", {})
    missing = [e for e in COURSE_EXTRAS if e not in extras]
    if missing:
        raise ValueError(f"pyproject.toml lacks the extras environment.yml installs: {missing}")
    return [*project["dependencies"], *(req for extra in COURSE_EXTRAS for req in extras[extra])]


@dataclass(frozen=True)
class Resolution:
    name: str  # which environment
    versions: dict[str, str]  # normalized package name -> version pip chose
    problems: tuple[str, ...]  # why it does not match what README.md documents; empty when it does

    @property
    def line(self) -> str:
        main = ", ".join(f"{p} {self.versions[p]}" for p in ("vllm", "torch", "transformers") if p in self.versions)
        cuda = next((f"{p} {v}" for p, v in self.versions.items() if CUDA_RUNTIME.match(p)), "no CUDA runtime")
        status = "ok    " if not self.problems else "FAILED"
        text = f"{status} {self.name}: {len(self.versions)} packages; {main}; {cuda}"
        return text + "".join(f"\n       {problem}" for problem in self.problems)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolved_versions(report: dict) -> dict[str, str]:
    """{package: version} from a `pip install --report` file."""
    return {normalize(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def judge(name: str, versions: dict[str, str], *, expect_vllm: str | None = None) -> Resolution:
    """What is wrong with a resolved environment, measured against what README.md documents."""
    problems = []
    if "torch" not in versions:
        problems.append("torch is not in the resolution")
    elif not any(CUDA_RUNTIME.match(p) for p in versions) or "+cpu" in versions["torch"]:
        problems.append(f"torch {versions['torch']} is a CPU build: no nvidia-cuda-runtime wheel came with it")
    if expect_vllm is not None:
        pinned = expect_vllm.split("==", 1)[1]
        if versions.get("vllm") != pinned:
            problems.append(f"vllm resolved to {versions.get('vllm', 'nothing')}, not the documented {pinned}")
    elif "vllm" in versions:
        problems.append(f"vllm {versions['vllm']} is in the course's environment; it belongs in .venv-vllm")
    return Resolution(name, versions, tuple(problems))


def resolve(name: str, requirements: list[str], report_path: Path, *, expect_vllm: str | None = None) -> Resolution:
    """Ask pip to resolve `requirements` for this Python and platform, installing nothing."""
    report_path.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        str(report_path),
        *requirements,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()[
            -3:
        ]
        return Resolution(name, {}, (f"pip could not resolve it: {' / '.join(errors)[:600]}",))
    return judge(name, resolved_versions(json.loads(report_path.read_text())), expect_vllm=expect_vllm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--vllm", required=True, help="the pinned CUDA vLLM, e.g. vllm==0.33.0 (the Makefile's VLLM_CUDA)"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "gpu-env", help="where pip's reports go")
    args = parser.parse_args(argv)
    if "==" not in args.vllm:
        parser.error(f"--vllm must pin one version (vllm==X.Y.Z), not {args.vllm!r}: a range lets pip backtrack")
    print(
        f"Resolving for Python {sys.version.split()[0]} on {sys.platform} (installs nothing; takes minutes)", flush=True
    )
    results = [
        resolve("course environment (environment.yml)", [*course_requirements(), "torch"], args.out / "course.json"),
        resolve(
            f"vLLM environment (.venv-vllm: {args.vllm})", [args.vllm], args.out / "vllm.json", expect_vllm=args.vllm
        ),
    ]
    for result in results:
        print(result.line)
    print(f"pip's full reports: {args.out}")
    return 0 if all(not r.problems for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
