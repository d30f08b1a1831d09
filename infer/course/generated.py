"""Files the course generates from its sources (labs from solutions, answer keys from the solutions'
answers): write the ones that changed, or, when checking, list the stale ones and fail."""

from collections.abc import Iterable
from pathlib import Path


def write_or_report_stale(generated: Iterable[tuple[Path, str]], check: bool, regenerate: str) -> int:
    """`generated`: (path, the text it should hold). Returns the exit status: 1 if `check` found any stale."""
    stale = []
    for path, text in generated:
        if path.exists() and path.read_text() == text:
            continue
        if check:
            stale.append(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    for path in stale:
        print(f"stale: {path} (run `{regenerate}`)")
    return 1 if stale else 0
