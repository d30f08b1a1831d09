"""Execute every course notebook on one profile into one folder, and say what could not run.

    python -m infer.course.profile_run --profile gpu-dryrun --out /tmp/dryrun

The executed copies go to <out>/notebooks (same relative paths), the figures and results they
save to <out>/figures and <out>/results: the committed notebooks, figures and results stay as
they are; <out>/summary.txt says, for each notebook, whether it ran, failed or was skipped, how
long it took and why. A failing cell, a cell past its time limit or a dead kernel fails that
notebook only: the others still run. Two callers: the CI test that runs everything on the gpu
profile's CPU stand-in (`gpu-dryrun`, with --strict-devices), and `make gpu-check` on a real GPU
(infer/course/gpu_check.py)."""

import argparse
import contextlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from infer import STRICT_DEVICES_ENV_VAR
from infer.course.notebooks import CELL_TIMEOUT_S, CellFailed, execute, output_text, shown_path, write_notebook
from infer.metrics import RESULTS_ENV_VAR
from infer.models import WEIGHTS_ENV_VAR
from infer.paths import REPO_ROOT
from infer.plotting import FIGURES_ENV_VAR
from infer.profiles import PROFILE_ENV_VAR, PROFILES

NOTEBOOK_FOLDERS = ("weeks", "solutions")  # labs/ are generated from solutions/ and ship unfinished
# A notebook says that a GPU-only piece did not run with one printed line: "Skipped: ...",
# "skipped flash-attn: ...", "... Triton kernel skips (it needs a CUDA GPU)".
SKIP_LINE = re.compile(r"^\s*skipped\b|\bskips?\b", re.IGNORECASE)
FAILED_CHECK = "❌"  # how a check line starts when it fails (infer.course.grading.checks): the notebook failed too


def course_notebooks(root: Path = REPO_ROOT) -> list[Path]:
    """Every lecture and solution, in course order: new weeks are picked up as they are committed."""
    return sorted(p for folder in NOTEBOOK_FOLDERS for p in (root / folder).glob("*.ipynb"))


@dataclass(frozen=True)
class NotebookRun:
    notebook: Path  # relative to the repository (just its name when it lies elsewhere)
    executed: Path  # the executed copy
    seconds: float
    error: str | None  # the failing cell's error, shortened; None when it ran top to bottom
    skip_lines: tuple[str, ...]  # what the notebook said it skipped, and why
    output_text: str  # every text output, for checks such as "which profile did it run on"

    @property
    def line(self) -> str:
        return self.summary_line()

    def summary_line(self, estimated_s: float | None = None) -> str:
        """`ran     weeks/01_x.ipynb (12 s)`, or `FAILED  ... (300 s, estimated 40 s): the error`."""
        status = "ran    " if self.error is None else "FAILED "
        estimate = "" if estimated_s is None else f", estimated {estimated_s:.0f} s"
        return f"{status} {self.notebook} ({self.seconds:.0f} s{estimate})" + (f": {self.error}" if self.error else "")


def skipped_line(notebook: Path, reason: str) -> str:
    """A notebook that was not run, in the same columns as NotebookRun.line."""
    return f"skipped {notebook}: {reason}"


@contextlib.contextmanager
def profile_environment(profile_name: str, out_dir: Path, *, strict_devices: bool = False, weights: str | None = None):
    """Kernels started inside inherit this environment: the profile, where figures and results go,
    and optionally the strict-devices test mode and the weights every load_model() takes."""
    if profile_name not in PROFILES:
        raise ValueError(f"Unknown profile {profile_name!r}; valid profiles: {', '.join(sorted(PROFILES))}")
    settings = {
        PROFILE_ENV_VAR: profile_name,
        FIGURES_ENV_VAR: str(out_dir / "figures"),
        RESULTS_ENV_VAR: str(out_dir / "results"),
        STRICT_DEVICES_ENV_VAR: "1" if strict_devices else "0",
    }
    if weights:
        settings[WEIGHTS_ENV_VAR] = weights
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_notebook(
    notebook: Path,
    profile_name: str,
    out_dir: Path,
    *,
    cell_timeout_s: int = CELL_TIMEOUT_S,
    strict_devices: bool = False,
    weights: str | None = None,
    deadline: float | None = None,
) -> NotebookRun:
    """Execute one notebook on `profile_name`, writing it (even half-run) under `out_dir`/notebooks;
    `deadline` (a time.perf_counter() time): no cell runs past it."""
    executed = out_dir / "notebooks" / shown_path(notebook)
    started = time.perf_counter()
    with profile_environment(profile_name, out_dir, strict_devices=strict_devices, weights=weights):
        try:
            execute(notebook, executed, cell_timeout_s=cell_timeout_s, deadline=deadline)
            error = None
        except CellFailed as failure:  # an error in a cell, a cell past its time limit, a dead kernel
            error = failure.error
            write_notebook(failure.partial, executed)  # as far as it ran, with the traceback, for reading
    seconds = time.perf_counter() - started
    text = _output_text(executed) if executed.exists() else ""
    failed_check = next((line.strip() for line in text.splitlines() if line.lstrip().startswith(FAILED_CHECK)), None)
    if error is None and failed_check:  # a check that catches an error and prints it still fails the run
        error = f"a check failed: {failed_check[:300]}"
    skips = tuple(dict.fromkeys(line.strip() for line in text.splitlines() if SKIP_LINE.search(line)))
    return NotebookRun(shown_path(notebook), executed, seconds, error, skips, text)


def write_summary(out_dir: Path, header: list[str], lines: list[str]) -> Path:
    """<out_dir>/summary.txt: the header, then one line per notebook (ran, FAILED or skipped)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "summary.txt"
    path.write_text("\n".join([*header, "", *lines]) + "\n")
    return path


def _output_text(path: Path) -> str:
    return "\n".join(output_text(cell) for cell in nbformat.read(path, as_version=4).cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--strict-devices",
        action="store_true",
        help="fail where a tensor would land on the wrong device (infer/strict_devices.py)",
    )
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in weeks/ and solutions/")
    args = parser.parse_args(argv)
    runs = []
    for path in args.notebooks or course_notebooks():
        runs.append(run_notebook(path, args.profile, args.out, strict_devices=args.strict_devices))
        print(runs[-1].line, flush=True)
        for skip in runs[-1].skip_lines:
            print(f"        {skip}")
    header = [f"profile_run: profile {args.profile}{', strict devices' if args.strict_devices else ''}"]
    print(f"summary: {write_summary(args.out, header, [run.line for run in runs])}")
    return 0 if all(run.error is None for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
