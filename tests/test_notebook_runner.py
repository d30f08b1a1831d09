"""The notebook runner behind `make site` and `make notebooks` (infer.course.notebooks): one line per
notebook, a failure named in one line (notebook and cell), the committed notebook never
overwritten by a failed run, no time limit for a cell that shows progress, and no wait after the
last cell."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from infer.course import notebooks
from infer.course.notebooks import LAPTOP_CELL_LIMIT_S, execute, main, shows_progress

CELL_LIMIT_S = 10  # for the widget test: a reply left waiting shows as a cell of exactly this length


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


def test_one_line_per_notebook_and_a_failure_names_its_cell_without_a_traceback(tmp_path, capsys, failed_runs):
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


def test_with_out_the_committed_copy_stands_in_for_a_failed_notebook(tmp_path, capsys, failed_runs):
    bad = notebook_file(tmp_path / "bad.ipynb", "1 / 0", outputs=[[new_output("stream", text="committed\n")]])
    committed = bad.read_text()
    out_dir = tmp_path / "out"  # absolute paths both: the copy must not land on the notebook itself
    assert main(["run", "--out", str(out_dir), str(bad)]) == 1
    assert "stands in" in capsys.readouterr().out
    assert bad.read_text() == committed and (out_dir / "bad.ipynb").read_text() == committed
    failed_run = nbformat.read(failed_runs / "bad.ipynb", as_version=4)
    assert failed_run.cells[0].outputs[0]["ename"] == "ZeroDivisionError", "the failed run is kept for reading"


def test_with_out_a_notebook_that_runs_lands_beside_it_not_on_it(tmp_path):
    good = notebook_file(tmp_path / "good.ipynb", "print('ran')")
    committed = good.read_text()
    assert main(["run", "--out", str(tmp_path / "out"), str(good)]) == 0
    assert good.read_text() == committed
    assert nbformat.read(tmp_path / "out" / "good.ipynb", as_version=4).cells[0].outputs[0]["text"] == "ran\n"


@pytest.fixture
def failed_runs(tmp_path, monkeypatch):
    folder = tmp_path / "failed_runs"
    monkeypatch.setattr(notebooks, "FAILED_RUNS_DIR", folder)
    return folder


def test_a_widget_cells_reply_is_not_left_waiting_for_the_cell_limit(tmp_path):
    """Week 01 sat idle for the whole cell limit after its last cell, which displays a widget: the
    cell's reply had arrived, but nbclient's poll for it missed the socket's wake-up and returned it
    only at the limit (nbclient issue #312). Without infer.course.notebooks.poll_in_slices, 1 to 3
    of 30 to 40 cells like these took exactly their limit here (so 80 of them); with it, none takes a second."""
    widget_cells = [
        f"for _ in tqdm(range(3)):\n    pass\n"
        f"w = ipywidgets.interactive(lambda a: plt.plot([a, {i}]) and plt.show(), a=ipywidgets.IntSlider(value={i}))\nw"
        for i in range(80)
    ]
    nb = notebook_file(
        tmp_path / "widgets.ipynb",
        "import ipywidgets\nimport matplotlib.pyplot as plt\nfrom tqdm.auto import tqdm",
        *widget_cells,
    )
    run = execute(nb, tmp_path / "out.ipynb", cell_timeout_s=CELL_LIMIT_S)
    assert run.slowest_s < CELL_LIMIT_S / 4, f"{run.slowest_cell} took {run.slowest_s:.1f} s"
