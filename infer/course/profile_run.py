"""Execute every course notebook on one profile into one folder, and say what could not run.

    python -m infer.course.profile_run --profile gpu-dryrun --out /tmp/dryrun

The executed copies go to <out>/notebooks (same relative paths), the figures and results they
save to <out>/figures and <out>/results: the committed notebooks, figures and results stay as
they are. Two callers: the CI test that runs everything on the gpu profile's CPU stand-in
(`gpu-dryrun`), and `make gpu-check` on a real GPU (infer/course/gpu_check.py)."""

import argparse
import contextlib
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError

from infer.course.notebooks import execute
from infer.metrics import RESULTS_ENV_VAR
from infer.plotting import FIGURES_ENV_VAR
from infer.profiles import PROFILE_ENV_VAR, PROFILES
from infer.paths import REPO_ROOT

NOTEBOOK_FOLDERS = ("weeks", "solutions")  # labs/ are generated from solutions/ and ship unfinished
# A notebook says that a GPU-only piece did not run with one printed line: "Skipped: ...",
# "skipped flash-attn: ...", "... Triton kernel skips (it needs a CUDA GPU)".
SKIP_LINE = re.compile(r"^\s*skipped\b|\bskips?\b", re.IGNORECASE)


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
        status = "ok    " if self.error is None else "FAILED"
        return f"{status} {self.notebook} ({self.seconds:.0f} s)" + (f": {self.error}" if self.error else "")


@contextlib.contextmanager
def profile_environment(profile_name: str, out_dir: Path):
    """Kernels started inside inherit this environment: the profile, and where figures and results go."""
    if profile_name not in PROFILES:
        raise ValueError(f"Unknown profile {profile_name!r}; valid profiles: {', '.join(sorted(PROFILES))}")
    settings = {PROFILE_ENV_VAR: profile_name, FIGURES_ENV_VAR: str(out_dir / "figures"),
                RESULTS_ENV_VAR: str(out_dir / "results")}
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


def run_notebook(notebook: Path, profile_name: str, out_dir: Path) -> NotebookRun:
    """Execute one notebook on `profile_name`, writing it (even half-run) under `out_dir`/notebooks."""
    relative = notebook.resolve().relative_to(REPO_ROOT) if notebook.resolve().is_relative_to(REPO_ROOT) \
        else Path(notebook.name)
    executed = out_dir / "notebooks" / relative
    started = time.perf_counter()
    with profile_environment(profile_name, out_dir):
        try:
            execute(notebook, executed, write_on_error=True)
            error = None
        except CellExecutionError as exc:
            error = _short_error(exc)
    seconds = time.perf_counter() - started
    text = _output_text(executed) if executed.exists() else ""
    skips = tuple(dict.fromkeys(line.strip() for line in text.splitlines() if SKIP_LINE.search(line)))
    return NotebookRun(relative, executed, seconds, error, skips, text)


def _short_error(exc: CellExecutionError) -> str:
    """The exception's last line (e.g. "ValueError: No week 01 sizes for profile ..."), not the traceback."""
    name, value = getattr(exc, "ename", ""), getattr(exc, "evalue", "")
    return f"{name}: {value}"[:300] if name else str(exc).strip().splitlines()[-1][:300]


def _output_text(path: Path) -> str:
    notebook = nbformat.read(path, as_version=4)
    pieces = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                pieces.append(output.get("text", ""))
            elif "data" in output and "text/plain" in output["data"]:
                pieces.append(output["data"]["text/plain"])
    return "\n".join(pieces)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, choices=sorted(PROFILES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook in weeks/ and solutions/")
    args = parser.parse_args(argv)
    runs = []
    for path in args.notebooks or course_notebooks():
        runs.append(run_notebook(path, args.profile, args.out))
        print(runs[-1].line, flush=True)
        for skip in runs[-1].skip_lines:
            print(f"       {skip}")
    return 0 if all(run.error is None for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
