"""Keep a lecture's prose honest: every measured-looking number it quotes can be found in what it ran.

    python -m infer.course.prose_numbers weeks/*.ipynb   # lists each number it cannot trace

A lecture's markdown often reads a number off the output above it ("its median TTFT fell from 127
ms to 7.4 ms"). When the notebook is re-executed and the number moves, the sentence goes stale. This
module finds, in every markdown cell, each number followed by a unit of measurement (ms, s, tok/s,
req/s, x, %, GB/s, MiB, FLOP/byte, ...) and looks for it, at the precision the prose prints it, in
- the outputs of the code cells above it, and
- the results files (results/*.json) whose names the code cells above mention.
A number that was not measured there (a datasheet figure, an SLO the profile sets, a worked example,
a difference of two measured numbers, a measurement of another week or of a later section) is
declared in its cell, in a comment that the site does not show:

    <!-- not measured here: 989 TFLOP/s, 3.35 TB/s (the H100's datasheet) -->

Check questions are skipped: their numbers are the questions' inputs.

And every printed target gets a verdict word: an output line that compares a value with a target
(`target >= 0.9`) says `met` or `MISSED`, never a rounded number beside a threshold alone.
"""

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from infer.course.notebooks import output_text
from infer.paths import REPO_ROOT

UNITS = r"ms|s|tok/s|req/s|x|×|%|GB/s|TB/s|GFLOP/s|TFLOP/s|FLOP/byte|MiB|GiB|KiB|MB|GB|KB|TB|GFLOP|TFLOP|µs|us"
# A number (1,302 or 7.4 or 0.898) right before a unit that ends there: "7.4 ms", "1.59x", "90%".
QUOTED = re.compile(r"(?<![\w.,$^{])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?\s?(" + UNITS + r")(?![\w/])")
NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?")
DECLARED = re.compile(r"<!--\s*not measured here:(.*?)-->", re.DOTALL)
QUESTIONS = re.compile(r"^#+ Check questions", re.MULTILINE)
RESULTS_NAME = re.compile(r"\b(\d\d_[a-z0-9_]+)")
TARGET = re.compile(r"\btargets?\b[^\n]*?(?:>=|<=|≥|≤)")
VERDICT = re.compile(r"\b(met|MISSED)\b")
LONGEST_LIST = 64  # longer lists in a results file are per-request data: no prose quotes them one by one


@dataclass(frozen=True)
class Quote:
    text: str  # as the prose prints it, "1,302 tok/s"
    value: float
    decimals: int
    unit: str


@dataclass(frozen=True)
class Untraced:
    notebook: Path
    cell: int
    quote: Quote
    context: str

    def __str__(self) -> str:
        return (
            f"{self.notebook.name}, markdown cell {self.cell}: {self.quote.text!r} is in no output above it nor in a "
            f"results file the notebook reads (...{self.context}...). Quote the output as printed, or declare "
            f"it in the cell: <!-- not measured here: {self.quote.text} (why) -->"
        )


def quotes(markdown: str) -> list[tuple[Quote, str]]:
    """The numbers with a unit in `markdown`, outside declared comments, each with a little context."""
    text = DECLARED.sub("", markdown)
    found = []
    for match in QUOTED.finditer(text):
        whole, fraction, unit = match.groups()
        fraction = fraction or ""
        quote = Quote(match.group(0), float(whole.replace(",", "") + fraction), max(len(fraction) - 1, 0), unit)
        context = text[max(0, match.start() - 40) : match.end() + 10].replace("\n", " ")
        found.append((quote, context))
    return found


def declared(markdown: str) -> set[float]:
    """The values a cell declares as not measured."""
    return {abs(float(n.replace(",", ""))) for body in DECLARED.findall(markdown) for n in NUMBER.findall(body)}


def numbers_in(text: str) -> set[float]:
    return {float(n.replace(",", "")) for n in NUMBER.findall(text)}


def json_numbers(node) -> set[float]:
    if isinstance(node, bool):
        return set()
    if isinstance(node, (int, float)):
        return {float(node)}
    if isinstance(node, dict):
        return set().union(*(json_numbers(v) for v in node.values())) if node else set()
    if isinstance(node, list) and len(node) <= LONGEST_LIST:
        return set().union(*(json_numbers(v) for v in node)) if node else set()
    return set()


def results_read_by(source: str, results_dir: Path) -> set[Path]:
    """The results files whose names (without the profile suffix) a code cell mentions."""
    names = set(RESULTS_NAME.findall(source))
    return {p for p in results_dir.glob("*.json") if any(p.stem == n or p.stem.startswith(n + "_") for n in names)}


# Other forms the same value takes in an output: a fraction quoted as a percentage, milliseconds as seconds.
SCALES = {"%": (1, 100), "s": (1, 0.001)}


def traced(quote: Quote, candidates: set[float]) -> bool:
    """Is some measured value printed as the quote, at the quote's precision?"""
    scales = SCALES.get(quote.unit, (1,))
    return any(round(abs(value * scale), quote.decimals) == quote.value for value in candidates for scale in scales)


def untraced_numbers(notebook_path: Path, results_dir: Path = REPO_ROOT / "results") -> list[Untraced]:
    notebook = nbformat.read(notebook_path, as_version=4)
    measured: set[float] = set()
    files: set[Path] = set()
    problems = []
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            measured |= numbers_in(output_text(cell))
            for path in results_read_by(cell.source, results_dir) - files:
                files.add(path)
                measured |= json_numbers(json.loads(path.read_text(encoding="utf-8")))
            continue
        if cell.cell_type != "markdown" or QUESTIONS.search(cell.source):
            continue  # check questions state their inputs; they quote no measurement
        allowed = declared(cell.source)
        for quote, context in quotes(cell.source):
            if quote.value not in allowed and not traced(quote, measured):
                problems.append(Untraced(notebook_path, index, quote, context))
    return problems


def targets_without_verdict(notebook_path: Path) -> list[str]:
    """Output lines that hold a value against a target without saying met or MISSED."""
    notebook = nbformat.read(notebook_path, as_version=4)
    return [
        f"{notebook_path.name}, code cell {index}: {line.strip()!r} states a target without a verdict (met or MISSED)"
        for index, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        for line in output_text(cell).splitlines()
        if TARGET.search(line) and not VERDICT.search(line)
    ]


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted((REPO_ROOT / "weeks").glob("*.ipynb"))
    problems = [str(p) for path in paths for p in untraced_numbers(path.resolve())]
    problems += [line for path in paths for line in targets_without_verdict(path.resolve())]
    print("\n".join(problems) if problems else "every quoted number is traced, every target has a verdict")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
