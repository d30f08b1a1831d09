"""A lecture's prose quotes only numbers that its outputs or results files hold, or that it declares
as not measured there (infer/course/prose_numbers.py); every printed target carries met or MISSED."""

import json
import shutil

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from infer.course.prose_numbers import quotes, targets_without_verdict, untraced_numbers
from tests.notebook_files import committed_notebooks

LECTURES = committed_notebooks("weeks")


@pytest.mark.parametrize("lecture", LECTURES, ids=lambda p: p.name)
def test_every_quoted_number_is_traced_to_an_output_or_declared(lecture):
    problems = untraced_numbers(lecture)
    assert not problems, "\n".join(map(str, problems))


@pytest.mark.parametrize("lecture", LECTURES, ids=lambda p: p.name)
def test_every_printed_target_has_a_verdict(lecture):
    problems = targets_without_verdict(lecture)
    assert not problems, "\n".join(problems)


def notebook(tmp_path, prose: str, printed: str = "median TTFT 7.43 ms, 1,302 output tok/s, hit rate 0.9028\n"):
    path = tmp_path / "lecture.ipynb"
    code = new_code_cell("run()", outputs=[new_output("stream", name="stdout", text=printed)])
    nbformat.write(new_notebook(cells=[code, new_markdown_cell(prose)]), path)
    return path


@pytest.mark.parametrize(
    "prose",
    ["It fell to 7.4 ms.", "It fell to 7.43 ms.", "It served 1,302 tok/s.", "It found 90% of the prompt tokens."],
)
def test_a_number_printed_above_at_the_prose_precision_is_traced(tmp_path, prose):
    assert untraced_numbers(notebook(tmp_path, prose)) == []


@pytest.mark.parametrize("prose", ["It fell to 7.5 ms.", "It served 1,320 tok/s.", "It found 91% of them."])
def test_a_wrong_number_is_caught_with_what_to_do(tmp_path, prose):
    [problem] = untraced_numbers(notebook(tmp_path, prose))
    assert "not measured here" in str(problem) and problem.quote.text in prose


def test_a_declared_number_passes_and_a_later_output_does_not_count(tmp_path):
    declared = "The H100 reads 3.35 TB/s.\n\n<!-- not measured here: 3.35 TB/s (its datasheet) -->"
    assert untraced_numbers(notebook(tmp_path, declared)) == []
    path = tmp_path / "later.ipynb"
    later = new_code_cell("run()", outputs=[new_output("stream", name="stdout", text="7.43 ms\n")])
    nbformat.write(new_notebook(cells=[new_markdown_cell("It took 7.4 ms."), later]), path)
    assert len(untraced_numbers(path)) == 1, "an output below the sentence was not there when it was read"


def test_a_results_file_named_by_a_cell_above_counts(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    (results / "08_paged_kv_cpu.json").write_text(json.dumps({"summary": {"ttft_ms": 127.04}}))
    path = tmp_path / "lecture.ipynb"
    reads = new_code_cell('doc = json.loads((REPO_ROOT / "results" / "08_paged_kv_cpu.json").read_text())')
    nbformat.write(new_notebook(cells=[reads, new_markdown_cell("Its TTFT was 127 ms.")]), path)
    assert untraced_numbers(path, results) == []


def test_a_planted_number_in_a_real_lecture_fails(tmp_path):
    lecture = tmp_path / LECTURES[-1].name
    shutil.copy(LECTURES[-1], lecture)
    planted = nbformat.read(lecture, as_version=4)
    last_prose = max(i for i, c in enumerate(planted.cells) if c.cell_type == "markdown" and quotes(c.source))
    planted.cells[last_prose].source += "\n\nThe median TTFT was 271.3 ms."
    nbformat.write(planted, lecture)
    assert [p.quote.text for p in untraced_numbers(lecture)] == ["271.3 ms"]


def test_a_target_beside_a_rounded_number_is_flagged(tmp_path):
    path = notebook(tmp_path, "Read it.", printed="throughput: 0.90 (target >= 0.90)\nITL: 5.2; target >= 3: met\n")
    assert len(targets_without_verdict(path)) == 1
