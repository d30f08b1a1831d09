"""Where the committed notebooks are, for the tests that read them."""

from pathlib import Path

from infer.paths import REPO_ROOT


def committed_notebooks(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO_ROOT / folder).glob("*.ipynb"))


def lab_and_solution_pairs() -> list[tuple[Path, Path]]:
    return [(REPO_ROOT / "labs" / s.name, s) for s in committed_notebooks("solutions")]
