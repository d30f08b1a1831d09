"""Rebuild the answer keys from the solutions: the solutions hold the right answers, the keys follow.

Each `infer/course/grading/answer_keys/NN.json` maps a question id to what the lab states about it
(`kind`, `unit`, `tolerance`: "exact" or a relative tolerance such as 0.01, `options` of a choice,
`section`: where the lecture teaches it; for an exact count whose fraction must be rounded,
`whole_number_rule`: the hint a fractional answer gets) plus `secret`, the concealed answer
interval or choice (see `infer.course.grading.checks`). Authors edit the stated fields by hand; this
module recomputes every `secret` by running the answer block of each check question in
solutions/NN_*.ipynb.

What the lab states must match the key (tests/test_answer_keys.py checks both): a numeric
question's text ends with `checks.tolerance_statement(tolerance)` ("*Checked exactly.*" or
"*Checked to within 1%.*"), and `section` reads `the week NN lecture, section K ("Its title")`,
a heading of that lecture, so that a wrong answer's message sends the student to it.

    python -m infer.course.grading.answer_keys.build            # rewrite the keys
    python -m infer.course.grading.answer_keys.build --check    # exit 1 if a key disagrees with its solution
"""

import argparse
import json
import math
import re
import sys
from pathlib import Path

import nbformat
import numpy as np

from infer.course.generated import write_or_report_stale
from infer.course.grading.checks import sealed_key
from infer.course.grading.labgen import BEGIN, END, REPO_ROOT

KEYS_DIR = Path(__file__).resolve().parent
CHECK_CALL = re.compile(r"""check_answer\(\s*["'](?P<qid>\d\d\.q\d+)["']\s*,\s*(?P<name>\w+)\s*\)""")


def solution_answers(solution_path: Path) -> dict[str, object]:
    """{question id: the solution's answer} for every `check_answer(qid, name)` cell, found by
    running the cell's solution block alone (answers are plain arithmetic over math and numpy)."""
    answers = {}
    for cell in nbformat.read(solution_path, as_version=4).cells:
        match = CHECK_CALL.search(cell.source) if cell.cell_type == "code" else None
        if not match:
            continue
        lines = cell.source.split("\n")
        try:
            block = lines[lines.index(BEGIN) + 1 : lines.index(END)]
        except ValueError:
            raise ValueError(f"{solution_path.name}: the cell of {match['qid']} has no solution block") from None
        namespace = {"math": math, "np": np}
        exec("\n".join(block), namespace)
        answers[match["qid"]] = namespace[match["name"]]
    return answers


def rebuilt_keys(week: str, root: Path = REPO_ROOT) -> dict[str, dict]:
    """The key file of `week` ("01") recomputed from its solution; the stated fields are kept."""
    key_path = KEYS_DIR / f"{week}.json"
    stated = json.loads(key_path.read_text()) if key_path.exists() else {}
    solutions = sorted((root / "solutions").glob(f"{week}_*.ipynb"))
    if len(solutions) != 1:
        raise FileNotFoundError(f"expected one solutions/{week}_*.ipynb, found {len(solutions)}")
    answers = solution_answers(solutions[0])
    unstated = sorted(set(answers) - set(stated))
    if unstated:
        raise KeyError(
            f"{key_path.name} states nothing about {unstated}: add kind, unit, tolerance and section "
            f"for each (see this module's docstring)"
        )
    orphans = sorted(set(stated) - set(answers))
    if orphans:
        raise KeyError(f"{key_path.name} has keys for {orphans}, which {solutions[0].name} does not ask")
    keys = {}
    for qid in sorted(answers):
        spec = {field: value for field, value in stated[qid].items() if field != "secret"}
        keys[qid] = sealed_key(qid, spec, answers[qid])
    return keys


def key_text(keys: dict) -> str:
    return json.dumps(keys, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rebuild infer/course/grading/answer_keys/*.json from solutions/.")
    parser.add_argument("--check", action="store_true", help="only report stale keys; exit 1 if any")
    args = parser.parse_args(argv)
    return write_or_report_stale(
        ((path, key_text(rebuilt_keys(path.stem))) for path in sorted(KEYS_DIR.glob("*.json"))),
        args.check,
        "python -m infer.course.grading.answer_keys.build",
    )


if __name__ == "__main__":
    sys.exit(main())
