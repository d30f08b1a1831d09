"""The shipped answer keys: rebuilt from the solutions, each question's tolerance stated in its
lab text, each section it points to present in the lecture, and the gaps issue 9 found closed."""

import json
import re

import nbformat
import pytest

from infer.course.grading.answer_keys.build import CHECK_CALL, KEYS_DIR, rebuilt_keys
from infer.course.grading.checks import grade_answer, key_interval, load_key, tolerance_statement
from tests.notebook_files import REPO_ROOT

WEEKS = sorted(path.stem for path in KEYS_DIR.glob("*.json"))


@pytest.mark.parametrize("week", WEEKS)
def test_keys_are_rebuilt_from_the_solutions(week):
    shipped = json.loads((KEYS_DIR / f"{week}.json").read_text())
    assert shipped == rebuilt_keys(week), (
        f"{week}.json is stale: run `python -m infer.course.grading.answer_keys.build`"
    )


def _question_texts(week: str) -> dict[str, str]:
    """{qid: the markdown just above its answer cell} in the solution of `week`."""
    path = next((REPO_ROOT / "solutions").glob(f"{week}_*.ipynb"))
    cells, texts = nbformat.read(path, as_version=4).cells, {}
    for before, cell in zip(cells, cells[1:]):
        match = CHECK_CALL.search(cell.source) if cell.cell_type == "code" else None
        if match:
            texts[match["qid"]] = before.source
    return texts


@pytest.mark.parametrize("week", WEEKS)
def test_every_numeric_question_states_its_tolerance(week):
    texts = _question_texts(week)
    for qid, key in json.loads((KEYS_DIR / f"{week}.json").read_text()).items():
        if key["kind"] == "number":
            stated = tolerance_statement(key["tolerance"])
            assert texts[qid].rstrip().endswith(stated), (
                f"{qid}: its text must end with {stated!r}, as its key checks it"
            )


def _lecture_headings(week: str) -> set[str]:
    path = next((REPO_ROOT / "weeks").glob(f"{week}_*.ipynb"))
    text = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")
    plain = text.replace("$N \\times N$", "N x N").replace("`", "")
    return {line.lstrip("#").strip() for line in plain.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("week", WEEKS)
def test_every_section_named_is_in_the_lecture(week):
    headings = _lecture_headings(week)
    for qid, key in json.loads((KEYS_DIR / f"{week}.json").read_text()).items():
        match = re.fullmatch(rf'the week {week} lecture, section (\d+) \("(.+)"\)', key["section"])
        assert match, f"{qid}: section {key['section']!r} does not name a lecture section"
        assert f"{match[1]}. {match[2].replace('`', '')}" in headings, (
            f"{qid}: the week {week} lecture has no section {key['section']!r}"
        )


@pytest.mark.parametrize(
    "qid, passes, fails",
    [
        ("02.q1", [6225, 6225.0], [6200, 6163, 6250]),  # an exact count
        ("02.q3", [131072], [131000, 131100]),  # an exact count of bytes
        ("02.q4", [0.4027, 0.4, 0.399, 0.406], [0.398, 0.407]),  # within 1% of 0.4027, no gap
        ("02.q6", [162], [160, 161, 163, 182, 162.7]),  # round down: exact; 182 forgets u = 0.9
        ("04.q4", [192], [188, 184, 196, 187.5]),  # KB = 1000 gives 188
        ("01.q4", [30.12, 30.0], [32, 31]),  # the 2m/b approximation gives 32
    ],
)
def test_the_gaps_issue_9_found_are_closed(qid, passes, fails):
    for answer in passes:
        assert grade_answer(qid, answer).ok, f"{qid} rejects {answer}"
    for answer in fails:
        assert not grade_answer(qid, answer).ok, f"{qid} accepts {answer}"


def test_round_down_answers_say_so():
    assert "expected a whole number, got 162.7" in grade_answer("02.q6", 162.7).line


def test_relative_intervals_are_the_stated_tolerance():
    for week in WEEKS:
        for qid, key in json.loads((KEYS_DIR / f"{week}.json").read_text()).items():
            if key["kind"] == "number":
                low, high = key_interval(qid, load_key(qid))
                if key["tolerance"] == "exact":
                    assert low == high == round(low), qid
                else:
                    middle = (low + high) / 2
                    assert high - middle == pytest.approx(abs(middle) * key["tolerance"], rel=1e-9), qid
