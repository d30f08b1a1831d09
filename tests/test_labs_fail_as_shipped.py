"""A lab as shipped must fail every check: a check that passes on an unfinished lab checks nothing."""

import nbformat
import pytest

from tests.nbval_runner import cell_results, check_cell_ids
from tests.notebook_files import REPO_ROOT, committed_notebooks


@pytest.mark.parametrize("lab_path", committed_notebooks("labs"), ids=lambda p: p.name)
def test_every_check_of_a_shipped_lab_fails(lab_path, tmp_path):
    checks = check_cell_ids(nbformat.read(lab_path, as_version=4))
    assert checks, f"{lab_path.name} has no check cell marked NBVAL_CHECK_OUTPUT"
    results = cell_results(lab_path, tmp_path)
    passing = [cell_id for cell_id in checks if results.get(cell_id)]
    assert not passing, f"{lab_path.relative_to(REPO_ROOT)}: these checks pass before the student did anything: {passing}"
