"""The code reads as one hand wrote it: ruff's lint rules and formatter (settings in pyproject.toml)
hold for the library, the tests, the site build and the notebooks (labs/ is generated from
solutions/, which are checked in its place)."""

import subprocess
import sys

from infer.paths import REPO_ROOT


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", *args], cwd=REPO_ROOT, capture_output=True, text=True)


def test_ruff_finds_nothing():
    result = ruff("check", "--output-format", "concise", ".")
    assert result.returncode == 0, (
        f"ruff check found problems; fix them (`ruff check --fix` fixes some), or, where a rule is wrong for one "
        f"line, silence it there with `# noqa: CODE - the reason`:\n{result.stdout}{result.stderr}"
    )


def test_ruff_format_changes_nothing():
    result = ruff("format", "--check", ".")
    assert result.returncode == 0, f"run `ruff format .` and commit the result:\n{result.stdout}{result.stderr}"
