"""A lab as shipped must fail every check: a check that passes on an unfinished lab checks nothing.

Labs open with no output, so nbval has nothing to compare them with; the test runs each lab top
to bottom (errors allowed: the stubs raise) and reads what every check cell printed."""

import nbformat
import pytest
from nbclient import NotebookClient

from tests.nbval_runner import check_cell_ids
from tests.notebook_files import REPO_ROOT, committed_notebooks


def printed(cell) -> str:
    return "".join(output.get("text", "") for output in cell.outputs if output.output_type == "stream")


@pytest.mark.parametrize("lab_path", committed_notebooks("labs"), ids=lambda p: p.name)
def test_every_check_of_a_shipped_lab_fails_with_one_line(lab_path):
    notebook = nbformat.read(lab_path, as_version=4)
    checks = check_cell_ids(notebook)
    assert checks, f"{lab_path.name} has no check cell marked NBVAL_CHECK_OUTPUT"
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        allow_errors=True,
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(lab_path.parent)}},
    ).execute()
    lines = {cell.id: printed(cell) for cell in notebook.cells if cell.id in checks}
    passing = [cell_id for cell_id, text in lines.items() if not text.startswith("❌")]
    assert not passing, (
        f"{lab_path.relative_to(REPO_ROOT)}: these checks do not fail before the student did "
        f"anything: { {cell_id: lines[cell_id] for cell_id in passing} }"
    )
    several = [cell_id for cell_id, text in lines.items() if text.count("\n") != 1]
    assert not several, f"{lab_path.name}: these checks print more than one line: {several}"
