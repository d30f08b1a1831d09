"""Generate the student labs from the solutions: solutions/NN.ipynb -> labs/NN.ipynb.

In a solution notebook, exercise code sits between `# BEGIN SOLUTION` and `# END SOLUTION`.
The lab replaces each block with a stub at the same indentation:
- a block of plain assignments (`answer_q1 = 3.1`) becomes the same names set to None;
- any other block becomes `raise NotImplementedError("<hint>")`, the hint taken from the
  block's `# HINT:` comment lines (in an assignment block they stay as comments).
Cell ids are kept, and check cells keep their `# NBVAL_CHECK_OUTPUT` marker: the grader finds
them by id and marker, and restores their expected lines from the solution. Every output and
execution count is cleared, check cells' included, so the lab opens clean: no ✅ under
`answer_q1 = None` before the student has run anything.

    python -m infer.course.grading.labgen            # regenerate every lab
    python -m infer.course.grading.labgen --check    # exit 1 if any lab is stale
"""

import argparse
import ast
import copy
import sys
from collections.abc import Callable
from pathlib import Path

import nbformat

from infer.course.generated import write_or_report_stale
from infer.paths import REPO_ROOT

BEGIN, END, HINT = "# BEGIN SOLUTION", "# END SOLUTION", "# HINT:"
CHECK_MARK = "NBVAL_CHECK_OUTPUT"


class SolutionMarkupError(ValueError):
    pass


def stub_source(source: str, where: str = "cell") -> str:
    """The cell source with every solution block replaced by its stub."""
    return replace_solution_blocks(source, _stub, where)


def replace_solution_blocks(
    source: str, replacement: Callable[[list[str], str], list[str]], where: str = "cell"
) -> str:
    """The cell source with each solution block (markers included) replaced by
    `replacement(block_lines, indent)`, where `indent` is the BEGIN marker's indentation."""
    lines, out, block, indent = source.split("\n"), [], None, ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if block is not None:
                raise SolutionMarkupError(f"{where}, line {number}: nested {BEGIN}")
            block, indent = [], line[: len(line) - len(line.lstrip())]
        elif stripped == END:
            if block is None:
                raise SolutionMarkupError(f"{where}, line {number}: {END} without {BEGIN}")
            out.extend(replacement(block, indent))
            block = None
        elif block is not None:
            block.append(line)
        else:
            out.append(line)
    if block is not None:
        raise SolutionMarkupError(f"{where}: {BEGIN} without {END}")
    return "\n".join(out)


def _stub(block: list[str], indent: str) -> list[str]:
    hints = [line.strip() for line in block if line.strip().startswith(HINT)]
    names = _assigned_names(block)
    if names is not None:
        return [f"{indent}{h}" for h in hints] + [f"{indent}{name} = None  # your answer" for name in names]
    message = " ".join(h.removeprefix(HINT).strip() for h in hints) or "your code here"
    return [f"{indent}raise NotImplementedError({message!r})"]


def _assigned_names(block: list[str]) -> list[str] | None:
    """The names a block assigns, if it is nothing but simple assignments; else None."""
    try:
        tree = ast.parse("\n".join(_dedent(block)))
    except SyntaxError:
        return None
    names = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            return None
        names.append(node.targets[0].id)
    return names or None


def _dedent(block: list[str]) -> list[str]:
    widths = [len(line) - len(line.lstrip()) for line in block if line.strip()]
    cut = min(widths, default=0)
    return [line[cut:] for line in block]


def make_lab(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    lab = copy.deepcopy(solution)
    for index, cell in enumerate(lab.cells):
        if cell.cell_type != "code":
            continue
        cell.source = stub_source(cell.source, where=f"{name} code cell {index}")
        cell.outputs, cell.execution_count = [], None
        cell.metadata.pop("execution", None)  # the solution run's timestamps: noise in a lab's diff
    lab.metadata.pop("widgets", None)
    return lab


def lab_path_for(solution_path: Path) -> Path:
    return solution_path.parent.parent / "labs" / solution_path.name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate labs/ from solutions/.")
    parser.add_argument("--check", action="store_true", help="only report stale labs; exit 1 if any")
    parser.add_argument("--root", type=Path, default=REPO_ROOT)
    args = parser.parse_args(argv)
    solutions = sorted((args.root / "solutions").glob("*.ipynb"))
    return write_or_report_stale(
        (
            (lab_path_for(path), nbformat.writes(make_lab(nbformat.read(path, as_version=4), path.name)) + "\n")
            for path in solutions
        ),
        args.check,
        "make labs",
    )


if __name__ == "__main__":
    sys.exit(main())
