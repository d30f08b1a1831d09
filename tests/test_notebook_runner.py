"""The notebook runner behind `make site` and `make notebooks` (infer.course.notebooks): one line per
notebook, a failure named in one line (notebook and cell), the committed notebook never
overwritten by a failed run, no time limit for a cell that shows progress, and no wait after the
last cell."""

import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from infer.course.notebooks import LAPTOP_CELL_LIMIT_S, main, shows_progress


def notebook_file(path, *sources, outputs=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    cells = [new_code_cell(source, id=f"cell-{i}") for i, source in enumerate(sources)]
    for cell, stored in zip(cells, outputs or []):
        cell.outputs = stored
    nbformat.write(new_notebook(cells=cells), path)
    return path


def test_a_cell_that_showed_a_progress_bar_is_recognised():
    bar = new_output("display_data", data={"text/plain": "sweep:  43%|####3     | 3/7 [00:01<00:02,  1.9it/s]"})
    text_bar = new_output("stream", name="stderr", text="runs: 100%|##########| 12/12 [01:40<00:00,  8.4s/it]\n")
    plain = new_output("stream", name="stdout", text="7 requests in 3/7 s\n")
    assert shows_progress(new_code_cell("", outputs=[bar])) and shows_progress(new_code_cell("", outputs=[text_bar]))
    assert not shows_progress(new_code_cell("", outputs=[plain])) and not shows_progress(new_code_cell(""))
    assert LAPTOP_CELL_LIMIT_S >= 600, "a slow laptop under load takes minutes where a quiet machine takes seconds"


def test_one_line_per_notebook_and_a_failure_names_its_cell_without_a_traceback(tmp_path, capsys):
    good = notebook_file(tmp_path / "good.ipynb", "x = 1", "print(x + 1)")
    bad = notebook_file(tmp_path / "bad.ipynb", "y = 2", "raise ValueError('no sizes for this profile')", "z = 3")
    before = bad.read_text()
    assert main(["run", str(bad), str(good)]) == 1
    out = capsys.readouterr().out
    assert f"FAILED {bad}, code cell 1 (cell-1): ValueError: no sizes for this profile" in out
    assert "Traceback" not in out and "---------" not in out
    assert f"{good}: " in out and "slowest: code cell" in out, "the notebook after the failed one still ran"
    assert bad.read_text() == before, "a failed in-place run must leave the committed notebook as it was"
    assert nbformat.read(good, as_version=4).cells[1].outputs[0]["text"] == "2\n"


def test_with_out_the_committed_copy_stands_in_for_a_failed_notebook(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the runner writes <out>/<the notebook's relative path>
    bad = notebook_file(Path("weeks") / "bad.ipynb", "1 / 0", outputs=[[new_output("stream", text="committed\n")]])
    out_dir = Path("out")
    assert main(["run", "--out", str(out_dir), str(bad)]) == 1
    assert "stands in" in capsys.readouterr().out
    copy = out_dir / bad
    assert copy.read_text() == bad.read_text()


def test_the_runner_returns_as_soon_as_the_last_cell_is_done(tmp_path):
    """Week 01 once sat idle for the runner's whole cell limit after its last cell; a notebook that
    ends with a widget and a background thread must still return in seconds."""
    nb = notebook_file(
        tmp_path / "ends_with_a_widget.ipynb",
        "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()",
        "from tqdm.auto import tqdm\nfor _ in tqdm(range(3)):\n    pass",
        "import ipywidgets\nipywidgets.IntSlider(value=3)",
    )
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "infer.course.notebooks", "run", "--out", str(tmp_path / "out"), str(nb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.perf_counter() - started < 60, f"the runner took {time.perf_counter() - started:.0f} s"
