"""Execute course notebooks top to bottom, the way they are committed and published.

    python -m infer.course.notebooks run weeks/01_prefill_decode.ipynb      # in place (authors)
    python -m infer.course.notebooks run --out _build/notebooks weeks/*.ipynb solutions/*.ipynb

Built to finish on a slow or busy laptop (`make site` runs it first):
- a cell that showed a progress bar when the notebook was last run has no time limit: its bar
  shows that it moves, and a sweep may take many minutes on a slow machine; every other cell has
  LAPTOP_CELL_LIMIT_S, far beyond the slowest such cell recorded on a busy machine;
- one line per notebook, with its time and its slowest cell;
- a failure is one line that names the notebook and the cell, not a traceback; the other
  notebooks still run, and the run ends with a non-zero status;
- a notebook is written only when it ran top to bottom, and atomically, so a failed or
  interrupted run never overwrites the committed one; the failed run goes to _build/failed_runs
  for reading. With --out, each copy lands under the notebook's path in the repository (never on
  the notebook itself, whatever the paths given), and a failed notebook's committed copy stands in
  for it (the line says so), so that a site built from that folder is complete;
- no reply waits for the cell limit after it arrived (poll_in_slices: week 01 once did).

Widget state is stored in the notebook, so the static site can draw the widgets."""

import argparse
import math
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from infer.paths import REPO_ROOT

# A planned run's cap on one cell (make gpu-check plans its 10 minutes within it).
CELL_TIMEOUT_S = 300
# Any cell without a progress bar, on a slow or busy laptop: the slowest such cell of the committed
# notebooks took 63 s, executed under a load average of 3 to 20 on two cores (week 02's loop check).
LAPTOP_CELL_LIMIT_S = 1200
# Where a failed run is written, as far as it ran, with the failing cell's traceback.
FAILED_RUNS_DIR = REPO_ROOT / "_build" / "failed_runs"
# What ends a notebook's run early: an error in a cell, a cell past its time limit, a dead kernel.
NOTEBOOK_FAILURES = (CellExecutionError, CellTimeoutError, DeadKernelError)
# tqdm's counter as it prints it, in text or in a progress widget's text form: " 3/7 [00:01<00:02,"
PROGRESS_BAR = re.compile(r"\d+/\d+ \[\d+:\d+<")


def output_text(cell) -> str:
    """What a code cell printed or showed as text when it was last run: its streams, and the plain
    text and markdown of its displays, one output a line."""
    pieces = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            pieces.append(output.get("text", ""))
        for kind in ("text/plain", "text/markdown"):
            pieces.append(output.get("data", {}).get(kind, ""))
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in pieces if p)


def shows_progress(cell) -> bool:
    """Did the cell show a progress bar (tqdm) when it was last run?"""
    return bool(PROGRESS_BAR.search(output_text(cell)))


@dataclass(frozen=True)
class Execution:
    seconds: float
    slowest_cell: str  # "code cell 7 (run-grid)"
    slowest_s: float


# A wait for a kernel message polls its socket afresh this often (see poll_in_slices).
POLL_SLICE_S = 0.2


def poll_in_slices(channel) -> None:
    """Make `channel.get_msg(timeout=T)` wait as a series of short polls, each a fresh look at the socket.

    Why: asyncio learns that a zmq socket has a message from an edge on the socket's file
    descriptor, and an edge can be missed when messages arrive together (nbclient issue #312). The
    reply to a cell that displays a widget then arrives only when the poll times out, and nbclient
    polls for the whole cell limit: week 01, whose last cell displays a widget, sat idle for 300 s
    that way (tests/test_notebook_runner.py shows it with many widget cells). A fresh poll checks
    the socket's state first, so a missed edge costs at most POLL_SLICE_S."""
    wait = channel.get_msg

    async def get_msg(timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else min(POLL_SLICE_S, deadline - time.monotonic())
            try:
                return await wait(timeout=max(left, 0.0))
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    channel.get_msg = get_msg


class CourseClient(NotebookClient):
    """nbclient's executor, noting which cell runs (to name it when it fails) and how long each
    took, and polling its kernel's replies in slices (poll_in_slices)."""

    def __init__(self, notebook, **kwargs):
        super().__init__(notebook, on_cell_execute=self._started, on_cell_executed=self._finished, **kwargs)
        self.current_cell = "before the first cell"
        self.cell_seconds: dict[str, float] = {}
        self._code_index = {id(c): i for i, c in enumerate(c for c in notebook.cells if c.cell_type == "code")}

    async def async_start_new_kernel_client(self):
        client = await super().async_start_new_kernel_client()
        poll_in_slices(client.shell_channel)
        poll_in_slices(client.iopub_channel)
        return client

    def _started(self, cell, cell_index):
        self.current_cell = f"code cell {self._code_index[id(cell)]} ({cell.get('id', 'no id')})"
        self._cell_started = time.perf_counter()

    def _finished(self, cell, cell_index, execute_reply):
        self.cell_seconds[self.current_cell] = time.perf_counter() - self._cell_started


def execute(
    path: Path,
    out_path: Path,
    *,
    cell_timeout_s: int = CELL_TIMEOUT_S,
    unlimited_progress: bool = False,
    deadline: float | None = None,
) -> Execution:
    """Run `path` in a fresh kernel (cwd: its own folder) and write the result to `out_path`.
    `unlimited_progress`: cells that showed a progress bar last time run without a limit.
    `deadline` (a time.perf_counter() time): no cell runs past it, so the whole notebook stops there
    (a cell that starts after it gets one second).

    On an error nothing is written: the error raised (`CellFailed`) names the cell and holds the
    notebook as far as it got, with the failing cell's traceback, for the caller to keep."""
    notebook = nbformat.read(path, as_version=4)
    unlimited = {id(cell) for cell in notebook.cells if unlimited_progress and shows_progress(cell)}
    started = time.perf_counter()
    client = CourseClient(
        notebook,
        timeout_func=lambda cell: cell_limit(None if id(cell) in unlimited else cell_timeout_s, deadline),
        kernel_name="python3",
        store_widget_state=True,
        shutdown_kernel="immediate",  # a graceful shutdown was seen to hang under load
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    try:
        client.execute()
    except NOTEBOOK_FAILURES as exc:
        raise CellFailed(path, client.current_cell, exc, notebook) from exc
    write_notebook(notebook, out_path)
    slowest = max(client.cell_seconds, key=client.cell_seconds.get, default="no code cell")
    return Execution(time.perf_counter() - started, slowest, client.cell_seconds.get(slowest, 0.0))


def cell_limit(limit_s: int | None, deadline: float | None) -> int | None:
    """A cell's time limit in whole seconds: `limit_s` (None: none), never past `deadline`."""
    if deadline is None:
        return limit_s
    left = max(1, math.ceil(deadline - time.perf_counter()))
    return left if limit_s is None else min(limit_s, left)


class CellFailed(Exception):
    """A notebook stopped at a cell: the notebook, the cell and the error, in one line; and the
    notebook as far as it ran (`partial`)."""

    def __init__(self, path: Path, cell: str, error: Exception, partial):
        self.path, self.cell, self.error, self.partial = path, cell, short_error(error), partial
        super().__init__(f"{path}, {cell}: {self.error}")


def shown_path(notebook: Path) -> Path:
    """The notebook relative to the repository (just its name when it lies elsewhere)."""
    resolved = notebook.resolve()
    return resolved.relative_to(REPO_ROOT) if resolved.is_relative_to(REPO_ROOT) else Path(notebook.name)


def short_error(exc: Exception) -> str:
    """One line: a cell's exception ("ValueError: No week 01 sizes for profile ..."), not its
    traceback; or nbclient's own ("CellTimeoutError: A cell timed out ..., after 300 seconds.")."""
    name, value = getattr(exc, "ename", ""), getattr(exc, "evalue", "")
    if name:
        return f"{name}: {value}"[:300]
    lines = str(exc).strip().splitlines() or [""]
    return f"{type(exc).__name__}: {lines[0]}"[:300]


def write_notebook(notebook, out_path: Path) -> None:
    """Through a temporary file and a rename: an interrupted write leaves the old notebook whole."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    partial = out_path.with_name(out_path.name + ".partial")
    nbformat.write(notebook, partial)
    os.replace(partial, out_path)


def run_all(paths: list[Path], out: Path | None) -> list[str]:
    """Execute each notebook (in place, or into `out` under its path in the repository); print one
    line each; return the failures. A failed run goes to FAILED_RUNS_DIR for reading."""
    failures = []
    for path in paths:
        out_path = out / shown_path(path) if out else path
        print(f"{path}: running ...", flush=True)
        try:
            run = execute(path, out_path, cell_timeout_s=LAPTOP_CELL_LIMIT_S, unlimited_progress=True)
        except CellFailed as failure:
            failed_run = FAILED_RUNS_DIR / shown_path(path)
            write_notebook(failure.partial, failed_run)
            stand_in = ""
            if out:
                out_path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, out_path)
                stand_in = f"; its committed copy stands in at {out_path}"
            failures.append(f"FAILED {failure} (the failed run: {failed_run}){stand_in}")
            print(failures[-1], flush=True)
            continue
        print(
            f"{path}: {run.seconds:.1f} s (slowest: {run.slowest_cell}, {run.slowest_s:.1f} s) -> {out_path}",
            flush=True,
        )
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute notebooks")
    run.add_argument("notebooks", nargs="+", type=Path)
    run.add_argument(
        "--out",
        type=Path,
        help="write executed copies under this folder (same relative paths) instead of overwriting the notebooks",
    )
    args = parser.parse_args(argv)
    failures = run_all(args.notebooks, args.out)
    if failures:
        print(f"{len(failures)} of {len(args.notebooks)} notebooks failed:", *failures, sep="\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
