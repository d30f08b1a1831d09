"""Run nbval on one notebook in a separate pytest process and report each code cell's result.

nbval numbers code cells from 0 ("path::Cell N"); `cell_results` maps those numbers back to
cell ids, so a test can say which cell failed by name. `assert_only_mistaken_checks_fail` is the
wrong-answers test every lab has: plausible mistakes go into a copy of the solution, and exactly
the checks of the mistaken tasks must fail."""

import copy
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

from infer.course.grading.labgen import replace_solution_blocks
from tests.notebook_files import REPO_ROOT

NBVAL_ARGS = [
    "--nbval-lax",
    "--nbval-current-env",
    "--nbval-cell-timeout=300",
    "--nbval-sanitize-with",
    str(REPO_ROOT / "tests" / "nbval_sanitize.cfg"),
    "--color=no",
]


def cell_results(notebook_path: Path, workdir: Path) -> dict[str, bool]:
    """{cell id: passed} for every code cell nbval reported on."""
    report = workdir / f"{notebook_path.stem}.junit.xml"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            *NBVAL_ARGS,
            f"--junitxml={report}",
            "--rootdir",
            str(workdir),
            str(notebook_path),
        ],
        cwd=workdir,
        env=os.environ | {"HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report.exists(), f"nbval wrote no report for {notebook_path}"
    code_cell_ids = [c.id for c in nbformat.read(notebook_path, as_version=4).cells if c.cell_type == "code"]
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        index = int(case.get("name").rsplit("Cell ", 1)[1])
        results[code_cell_ids[index]] = case.find("failure") is None and case.find("error") is None
    return results


def check_cell_ids(notebook: nbformat.NotebookNode) -> list[str]:
    return [c.id for c in notebook.cells if c.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in c.source]


def with_solutions_replaced(notebook, replacements: dict[str, str | list[str]]):
    """`notebook` with the solution blocks of each named cell replaced by other code: a string
    for a cell with one block, a list with one entry per block, in order, for a cell with several."""
    for cell in notebook.cells:
        if cell.id in replacements:
            assert "# BEGIN SOLUTION" in cell.source, f"cell {cell.id!r} has no solution block to replace"
            new = replacements[cell.id]
            blocks = iter([new] if isinstance(new, str) else new)
            cell.source = replace_solution_blocks(cell.source, lambda block, indent, blocks=blocks: [next(blocks)])
    return notebook


def assert_only_mistaken_checks_fail(
    solution_path: Path, mistakes: dict[str, str | list[str]], check_of_task: dict[str, str], workdir: Path
) -> None:
    """Put `mistakes` (cell id -> wrong solution) into a copy of the solution and run nbval on it:
    the check of each mistaken task (`check_of_task`, or the cell itself when it checks its own
    answer) must fail, and every other check must still pass."""
    solution = nbformat.read(solution_path, as_version=4)
    mutated_path = workdir / f"{solution_path.stem}_wrong.ipynb"
    nbformat.write(with_solutions_replaced(copy.deepcopy(solution), mistakes), mutated_path)
    results = cell_results(mutated_path, workdir)
    should_fail = {check_of_task.get(cell_id, cell_id) for cell_id in mistakes}
    for check in check_cell_ids(solution):
        if check in should_fail:
            assert results[check] is False, f"check cell {check!r} passed a deliberately wrong answer"
        else:
            assert results[check] is True, f"check cell {check!r} failed although its task was left correct"
