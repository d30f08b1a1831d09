"""`make gpu-check`: the course's first run on a real GPU, in one command.

1. The GPU-only tests (tests/test_gpu_only.py: the gpu profile's model in bf16, SDPA backends,
   flash-attn, the CUDA allocator, vLLM's CUDA build; and the Triton kernel on CUDA), with a
   JUnit report.
2. Every lecture and solution executed on the gpu profile (infer.course.profile_run).

Everything lands in one folder (default _build/gpu-check): tests.xml and tests.log, notebooks/
(the executed copies), figures/ and results/ (each stamped with its provenance), provenance.json
(GPU, driver, versions, commit) and summary.txt, which ends with what could not run and why.
It is meant to take under 10 minutes on one H100 or H200. Without CUDA it says so in one line
and exits with status 2: nothing here fakes a GPU result."""

import argparse
import json
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from infer.course.profile_run import REPO_ROOT, course_notebooks, run_notebook
from infer.provenance import git_commit, nvidia_driver_version, versions, vllm_version

GPU_TESTS = ["tests/test_gpu_only.py", "tests/test_attention.py::test_triton_kernel_on_cuda"]
BUDGET_S = 600  # the promise in README.md: one H100/H200 runs all of it within 10 minutes


def no_cuda_reason() -> str | None:
    if torch.cuda.is_available():
        return None
    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    return f"make gpu-check needs a CUDA GPU, and torch {torch.__version__} ({build}) sees none; nothing was run."


def machine_provenance() -> dict:
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "gpu_memory_gb": round(props.total_memory / 1e9, 1),
            "compute_capability": f"{props.major}.{props.minor}", "driver": nvidia_driver_version(),
            "cuda_runtime": torch.version.cuda, "vllm": vllm_version(), "commit": git_commit(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), **versions()}


def run_gpu_tests(out_dir: Path) -> tuple[list[str], list[str]]:
    """Run the GPU-only tests; (failures, skips), one line each with the reason."""
    report = out_dir / "tests.xml"
    with open(out_dir / "tests.log", "w") as log:
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-q", "-rs", f"--junitxml={report}",
                        *GPU_TESTS], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "_build" / "gpu-check")
    args = parser.parse_args(argv)
    reason = no_cuda_reason()
    if reason:
        print(reason)
        return 2
    started = time.perf_counter()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    meta = machine_provenance()
    (args.out / "provenance.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"gpu-check on {meta['gpu']} (driver {meta['driver']}, torch {meta['torch']}) -> {args.out}", flush=True)

    failures, skips = run_gpu_tests(args.out)
    print(f"GPU-only tests: {len(failures)} failed, {len(skips)} skipped (tests.log)", flush=True)
    notebook_lines, notebook_skips = [], []
    for notebook in course_notebooks():
        run = run_notebook(notebook, "gpu", args.out)
        print(run.line, flush=True)
        notebook_lines.append(run.line)
        if run.error:
            failures.append(run.line)
        notebook_skips += [f"{run.notebook}: {line}" for line in run.skip_lines]
    elapsed = time.perf_counter() - started

    summary = [f"gpu-check: {meta['gpu']}, {meta['date']}, commit {meta['commit']}, {elapsed / 60:.1f} min"
               f"{'' if elapsed <= BUDGET_S else f' (over the {BUDGET_S // 60}-minute budget)'}",
               "", "Notebooks on the gpu profile:", *notebook_lines,
               "", "Failed:", *(failures or ["nothing"]),
               "", "Could not run, and why:", *(skips + notebook_skips or ["nothing"])]
    (args.out / "summary.txt").write_text("\n".join(summary) + "\n")
    print("\n".join(summary[summary.index("Failed:"):]))
    print(f"Everything is in {args.out}; summary.txt holds this list.")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
