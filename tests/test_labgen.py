import nbformat
import pytest

from infer.course.grading.labgen import SolutionMarkupError, make_lab, stub_source
from tests.notebook_files import REPO_ROOT, lab_and_solution_pairs

FUNCTION_SOLUTION = """def add_one(x):
    # BEGIN SOLUTION
    # HINT: return x plus one
    y = x + 1
    return y
    # END SOLUTION
"""

ANSWER_SOLUTION = """# BEGIN SOLUTION
answer_q1 = 0.64  # ms
answer_q2 = "prefill"
# END SOLUTION
check(answer_q1)"""


def test_function_body_becomes_a_stub_with_its_hint():
    assert (
        stub_source(FUNCTION_SOLUTION)
        == """def add_one(x):
    raise NotImplementedError('return x plus one')
"""
    )


def test_answer_assignments_become_none():
    assert (
        stub_source(ANSWER_SOLUTION)
        == "answer_q1 = None  # your answer\nanswer_q2 = None  # your answer\ncheck(answer_q1)"
    )


@pytest.mark.parametrize(
    "source, problem",
    [
        ("# BEGIN SOLUTION\nx = 1\n", "without # END SOLUTION"),
        ("x = 1\n# END SOLUTION\n", "without # BEGIN SOLUTION"),
        ("# BEGIN SOLUTION\n# BEGIN SOLUTION\n# END SOLUTION\n", "nested"),
    ],
)
def test_malformed_markers_are_reported(source, problem):
    with pytest.raises(SolutionMarkupError, match=problem):
        stub_source(source)


def test_lab_keeps_ids_and_marks_and_clears_every_output():
    solution = nbformat.v4.new_notebook()
    work = nbformat.v4.new_code_cell(
        ANSWER_SOLUTION, execution_count=1, outputs=[nbformat.v4.new_output("stream", text="3\n")]
    )
    check = nbformat.v4.new_code_cell(
        "# NBVAL_CHECK_OUTPUT\nprint('✅ 99.q1 correct')",
        execution_count=2,
        outputs=[nbformat.v4.new_output("stream", text="✅ 99.q1 correct\n")],
    )
    solution.cells = [work, check]
    lab = make_lab(solution)
    assert [c.id for c in lab.cells] == [work.id, check.id]
    assert all(c.outputs == [] and c.execution_count is None for c in lab.cells), "a lab must open with no output"
    assert lab.cells[1].source.startswith("# NBVAL_CHECK_OUTPUT"), "the grader finds check cells by their mark"
    assert "BEGIN SOLUTION" in solution.cells[0].source and solution.cells[1].outputs, (
        "make_lab must not modify the solution"
    )


@pytest.mark.parametrize("lab_path", sorted((REPO_ROOT / "labs").glob("*.ipynb")), ids=lambda p: p.name)
def test_committed_lab_opens_clean(lab_path):
    notebook = nbformat.read(lab_path, as_version=4)
    shown = [c.id for c in notebook.cells if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert not shown, f"{lab_path.name}: cells {shown} show output (a ✅ line, say) before the student ran anything"


@pytest.mark.parametrize("lab_path, solution_path", lab_and_solution_pairs(), ids=lambda p: p.name)
def test_committed_lab_is_generated_from_its_solution(lab_path, solution_path):
    expected = nbformat.writes(make_lab(nbformat.read(solution_path, as_version=4), solution_path.name)) + "\n"
    assert lab_path.exists(), f"{lab_path.relative_to(REPO_ROOT)} is missing: run `make labs`"
    assert lab_path.read_text() == expected, f"{lab_path.relative_to(REPO_ROOT)} is stale: run `make labs`"
    assert "SOLUTION" not in lab_path.read_text(), "solution markers leaked into the lab"


def test_every_lab_has_a_solution():
    labs = {p.name for p in (REPO_ROOT / "labs").glob("*.ipynb")}
    solutions = {p.name for p in (REPO_ROOT / "solutions").glob("*.ipynb")}
    assert labs == solutions, f"labs/ and solutions/ disagree: {sorted(labs ^ solutions)}"
