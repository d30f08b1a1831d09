"""Run nbval on one notebook in a separate pytest process and report each code cell's result.

nbval numbers code cells from 0 ("path::Cell N"); `cell_results` maps those numbers back to
cell ids, so a test can say which cell failed by name."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat

from tests.notebook_files import REPO_ROOT

NBVAL_ARGS = ["--nbval-lax", "--nbval-current-env", "--nbval-cell-timeout=300",
              "--nbval-sanitize-with", str(REPO_ROOT / "tests" / "nbval_sanitize.cfg"), "--color=no"]


def cell_results(notebook_path: Path, workdir: Path) -> dict[str, bool]:
    """{cell id: passed} for every code cell nbval reported on."""
    report = workdir / f"{notebook_path.stem}.junit.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q", *NBVAL_ARGS,
         f"--junitxml={report}", "--rootdir", str(workdir), str(notebook_path)],
        cwd=workdir, env=os.environ | {"HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=900,
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
