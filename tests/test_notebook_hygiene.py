"""Committed notebooks are what the site shows and what nbval compares against, so they must
have been run top to bottom in one go, with no errors, and solutions must carry checks."""

import nbformat
import pytest

from tests.notebook_files import REPO_ROOT, committed_notebooks

EXECUTED = committed_notebooks("weeks", "solutions")


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_ran_top_to_bottom_without_errors(path):
    notebook = nbformat.read(path, as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code" and c.source.strip()]
    counts = [c.execution_count for c in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.relative_to(REPO_ROOT)}: execution counts {counts} are not 1..{len(code)}; "
        "re-run it with `make notebooks`"
    )
    errors = [c.id for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.relative_to(REPO_ROOT)}: cells {errors} stored an error"


@pytest.mark.parametrize("path", committed_notebooks("solutions"), ids=lambda p: p.name)
def test_solution_has_check_cells_that_pass(path):
    notebook = nbformat.read(path, as_version=4)
    checks = [c for c in notebook.cells if c.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in c.source]
    assert len(checks) >= 3, f"{path.name}: a lab needs at least 3 auto-checked tasks"
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs)
        assert text.startswith("✅") and text.count("\n") == 1, (
            f"{path.name} cell {cell.id}: a check cell must print exactly one ✅ line, stored {text!r}"
        )


def test_cell_ids_are_unique_and_stable():
    for path in committed_notebooks("weeks", "solutions", "labs"):
        ids = [c.id for c in nbformat.read(path, as_version=4).cells]
        assert len(ids) == len(set(ids)), f"{path.name}: duplicate cell ids"
