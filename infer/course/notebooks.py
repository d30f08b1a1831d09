"""Execute course notebooks top to bottom, the way they are committed and published.

    python -m infer.course.notebooks run weeks/01_prefill_decode.ipynb      # in place (authors)
    python -m infer.course.notebooks run --out _build/notebooks weeks/*.ipynb solutions/*.ipynb

Widget state is stored in the notebook, so the static site can draw the widgets."""

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

CELL_TIMEOUT_S = 300


def execute(path: Path, out_path: Path, *, write_on_error: bool = False, cell_timeout_s: int = CELL_TIMEOUT_S) -> float:
    """Run `path` in a fresh kernel (cwd: its own folder) and write the result to `out_path`.

    On an error nothing is written, unless `write_on_error` (never for in-place runs): then the
    notebook as far as it got, with the failing cell's traceback, goes to `out_path` for reading."""
    notebook = nbformat.read(path, as_version=4)
    started = time.perf_counter()
    client = NotebookClient(notebook, timeout=cell_timeout_s, kernel_name="python3", store_widget_state=True,
                            shutdown_kernel="immediate",  # a graceful shutdown was seen to hang under load
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    try:
        client.execute()
    except Exception:
        if write_on_error:
            _write(notebook, out_path)
        raise
    _write(notebook, out_path)
    return time.perf_counter() - started


def _write(notebook, out_path: Path) -> None:
    out_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, out_path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="execute notebooks")
    run.add_argument("notebooks", nargs="+", type=Path)
    run.add_argument("--out", type=Path, help="write executed copies under this folder (same relative paths) "
                                              "instead of overwriting the notebooks")
    args = parser.parse_args(argv)
    for path in args.notebooks:
        out_path = args.out / path if args.out else path
        seconds = execute(path, out_path)
        print(f"{path}: {seconds:.1f} s -> {out_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
