"""The grader: a corpus of submissions built from solutions/02 (and 01), correct and broken in
every way an instructor meets, graded in one folder; each gets its row, status and reason.

The fast tests at the top build the graded notebook without a kernel. The corpus tests run ten
real kernels, two at a time (about a minute and a half on two quiet cores). Their time limits are
generous, so that a loaded machine cannot fail a correct notebook; the endless loop has its own
folder, where it starts before anything slow and a short cell limit stops it."""

import copy
import csv
import json
from pathlib import Path

import nbformat
import pytest

from infer.course.grading.grader import (
    GRADED,
    KERNEL_DIED,
    NOT_A_NOTEBOOK,
    TIMED_OUT,
    UNREADABLE,
    GradingKeyError,
    Limits,
    assemble,
    find_lab,
    grade_folder,
    load_key,
    main,
    read_submission,
    run_cells,
    student_part,
    trusted_part,
)
from infer.course.grading.labgen import HINT, replace_solution_blocks

LAB_02, SOLUTION_02 = find_lab("02")
CORPUS_LIMITS = Limits(cell_s=300, notebook_s=900)  # never reached by a correct notebook
LOOP_LIMITS = Limits(cell_s=10, notebook_s=60)  # for the endless loop, which runs first


def key_02():
    return load_key(LAB_02, SOLUTION_02)


def solved(solution_path: Path) -> nbformat.NotebookNode:
    """A student's finished notebook: the solution's code without its markers and hints."""
    notebook = nbformat.read(solution_path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.source = replace_solution_blocks(
                cell.source, lambda block, indent: [line for line in block if not line.strip().startswith(HINT)]
            )
    return notebook


def cell(notebook, cell_id: str):
    matches = [c for c in notebook.cells if c.get("id") == cell_id]
    assert matches, f"the corpus expects a cell {cell_id!r} in lab 02; update the corpus if it moved"
    return matches[0]


def expected_line(check_id: str) -> str:
    return next(c.expected_line for c in key_02().checks if c.check_id == check_id)


def check_of(cell_id: str) -> str:
    return next(c.check_id for c in key_02().checks if c.cell_id == cell_id)


# ---------------------------------------------------------------- without a kernel


def test_trusted_part_is_what_follows_the_last_solution_block():
    mixed = '# NBVAL_CHECK_OUTPUT\n# BEGIN SOLUTION\nanswer_q1 = 3\n# END SOLUTION\ncheck_answer("02.q1", answer_q1)'
    assert trusted_part(mixed) == 'check_answer("02.q1", answer_q1)'
    assert (
        trusted_part("# NBVAL_CHECK_OUTPUT\ncheck_kv_bytes(kv_bytes_per_token)") == "check_kv_bytes(kv_bytes_per_token)"
    )
    student = '# NBVAL_CHECK_OUTPUT\nanswer_q1 = 6225\ncheck_answer("02.q1", answer_q1)'
    assert student_part(student, 'check_answer("02.q1", answer_q1)') == "answer_q1 = 6225"


def test_key_holds_every_check_in_notebook_order_with_its_solution_line():
    key = key_02()
    solution = nbformat.read(SOLUTION_02, as_version=4)
    marked = [c.id for c in solution.cells if c.cell_type == "code" and "NBVAL_CHECK_OUTPUT" in c.source]
    assert [check.cell_id for check in key.checks] == marked
    assert all(check.expected_line.startswith("✅") and check.points == 1 for check in key.checks)
    assert "02.q3" in [check.check_id for check in key.checks]  # the qid its line prints
    assert key.max_score == len(marked)


def test_points_and_id_come_from_the_solution_cell_metadata(tmp_path):
    solution = nbformat.read(SOLUTION_02, as_version=4)
    cell(solution, "check-kv-cache").metadata["grade"] = {"points": 3, "id": "kv-cache"}
    nbformat.write(solution, tmp_path / "solution.ipynb")
    key = load_key(LAB_02, tmp_path / "solution.ipynb")
    check = next(c for c in key.checks if c.cell_id == "check-kv-cache")
    assert (check.check_id, check.points) == ("kv-cache", 3)
    assert key.max_score == len(key.checks) + 2


def test_a_solution_without_executed_check_lines_is_refused(tmp_path):
    solution = nbformat.read(SOLUTION_02, as_version=4)
    cell(solution, "q3").outputs = []
    nbformat.write(solution, tmp_path / "solution.ipynb")
    with pytest.raises(GradingKeyError, match="'q3'.*make notebooks"):
        load_key(LAB_02, tmp_path / "solution.ipynb")


def test_restored_notebook_never_brings_back_solution_code():
    key = key_02()
    student = solved(SOLUTION_02)
    student.cells = [c for c in student.cells if c.get("id") not in ("kv-cache", "q3")]
    graded, matched = assemble(key, student)
    lab = nbformat.read(LAB_02, as_version=4)
    sources = [c.source for c in graded.cells]
    assert cell(lab, "kv-cache").source in sources  # the lab's stub stands in for the deleted answer
    solution_blocks = replace_solution_blocks(
        cell(nbformat.read(SOLUTION_02, as_version=4), "kv-cache").source, lambda block, indent: block
    )
    assert solution_blocks not in sources
    assert "answer_q3 = None  # your answer" in sources  # the deleted mixed cell: the lab's stub answer
    assert matched == len(key.cells) - 2


def test_every_check_cell_only_answers_the_checker():
    """In the graded notebook a check cell holds no check: the kernel's side of the boundary
    answers the grader's process, which makes the check (tests/test_grading_boundary.py)."""
    graded, _ = assemble(key_02(), solved(SOLUTION_02))
    checks = [c for c in graded.cells if c.metadata["grader"]["role"] == "check"]
    assert len(checks) == len(key_02().checks)
    for check in checks:
        assert check.source.startswith("# NBVAL_CHECK_OUTPUT\n")
        assert "answer_checker(" in check.source and "check_" not in check.source.replace("checker", "")


def test_added_cells_run_where_the_student_put_them():
    student = solved(SOLUTION_02)
    position = student.cells.index(cell(student, "q2"))
    student.cells.insert(position + 1, nbformat.v4.new_code_cell("scratch = 1"))
    graded, _ = assemble(key_02(), student)
    roles = [(c.metadata["grader"].get("cell_id"), c.source) for c in graded.cells]
    q2_check = next(i for i, c in enumerate(graded.cells) if c.metadata["grader"].get("check_id") == "02.q2")
    assert roles[q2_check + 1] == (None, "scratch = 1")


@pytest.mark.parametrize(
    "content, status",
    [
        ('{"cells": [', UNREADABLE),
        ("[1, 2]", NOT_A_NOTEBOOK),
        ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}', NOT_A_NOTEBOOK),
    ],
)
def test_unreadable_files_get_a_status_and_reason(tmp_path, content, status):
    path = tmp_path / "someone.ipynb"
    path.write_text(content)
    got, reason = read_submission(path)
    assert got == status and "someone.ipynb" in reason


# ---------------------------------------------------------------- the corpus, graded for real


def corpus_02(folder: Path) -> None:
    """One notebook per case; every one but the case's defect is the correct solution."""

    def write(name: str, notebook) -> None:
        nbformat.write(notebook, folder / f"{name}.ipynb")

    base = solved(SOLUTION_02)

    def student():
        return copy.deepcopy(base)

    cell(base, "measure").source = "pass  # the timing race is not graded; skipped to keep the test short"
    write("correct", student())

    saved = student()  # a wrong answer, run, with a forged pass saved under it
    cell(saved, "q3").source = '# NBVAL_CHECK_OUTPUT\nanswer_q3 = 1\ncheck_answer("02.q3", answer_q3)'
    cell(saved, "q3").outputs = [nbformat.v4.new_output("stream", name="stdout", text=expected_line("02.q3") + "\n")]
    write("saved_wrong_answer", saved)

    unmarked = student()
    cell(unmarked, "q1").source = 'answer_q1 = 1\ncheck_answer("02.q1", answer_q1)'
    write("unmarked_check", unmarked)

    deleted = student()
    cell(deleted, "kv-bytes").source = "def kv_bytes_per_token(*args):\n    return 0"
    deleted.cells.remove(cell(deleted, "check-kv-bytes"))
    write("deleted_check", deleted)

    edited = student()
    cell(edited, "concurrency").source = "def max_concurrent_sequences(*args):\n    return -1"
    cell(
        edited, "check-concurrency"
    ).source = f"# NBVAL_CHECK_OUTPUT\nprint({expected_line(check_of('check-concurrency'))!r})"
    write("edited_check", edited)

    no_answer = student()
    no_answer.cells.remove(cell(no_answer, "kv-cache"))
    write("deleted_answer", no_answer)

    tamper = student()
    cell(tamper, "q2").source = 'answer_q2 = "q only"\ncheck_answer("02.q2", answer_q2)'
    cell(tamper, "kv-bytes").source = "def kv_bytes_per_token(*args):\n    return 0"
    forged = {check_id: expected_line(check_id) for check_id in ("02.q2", check_of("check-kv-bytes"))}
    position = tamper.cells.index(cell(tamper, "setup"))
    tamper.cells.insert(
        position + 1,
        nbformat.v4.new_code_cell(
            "import infer.course.grading.checks as checks_module\n"
            f"FORGED = {forged!r}\n"
            "class Verdict:\n"
            "    def __init__(self, qid, *args):\n"
            "        self.line = FORGED.get(qid, f'✅ {qid} correct')\n"
            "def check_answer(qid, answer):\n"
            "    print(FORGED[qid])\n"
            f"def check_kv_bytes(fn):\n    print(FORGED[{check_of('check-kv-bytes')!r}])\n"
            "checks_module.Verdict = Verdict\n"
            "checks_module.check_answer = check_answer\n"
        ),
    )
    write("redefined_checks", tamper)

    dying = student()
    cell(dying, "concurrency").source = "import os\nos._exit(1)"
    write("kernel_death", dying)

    (folder / "malformed.ipynb").write_text(nbformat.writes(base)[:500])
    (folder / "notes.txt").write_text("I could not finish the lab.\n")


@pytest.fixture(scope="module")
def graded_02(tmp_path_factory):
    folder = tmp_path_factory.mktemp("submissions_02")
    corpus_02(folder)
    results = grade_folder("02", folder, jobs=2, limits=CORPUS_LIMITS, progress=False)
    return folder, {r.student: r for r in results}


def earned(result) -> dict[str, float]:
    return {c.check_id: c.earned for c in result.checks}


def reason(result, check_id: str) -> str:
    return next(c.reason for c in result.checks if c.check_id == check_id)


def assert_only_lost(result, lost: set[str]) -> None:
    """Every check outside `lost` earned its points, and every check in it earned nothing."""
    for check in result.checks:
        if check.check_id in lost:
            assert check.earned == 0, f"{result.student}: {check.check_id} earned points: {check.line}"
        else:
            assert check.earned == check.points, f"{result.student}: {check.check_id} lost: {check.reason}"


def test_correct_submission_gets_full_marks(graded_02):
    _, rows = graded_02
    correct = rows["correct"]
    assert correct.status == GRADED and correct.reason == ""
    assert correct.score == correct.max_score == key_02().max_score, [c.reason for c in correct.checks if c.reason]


def test_a_saved_wrong_answer_fails_whatever_line_was_saved(graded_02):
    _, rows = graded_02
    assert_only_lost(rows["saved_wrong_answer"], {"02.q3"})
    assert reason(rows["saved_wrong_answer"], "02.q3").startswith("❌ 02.q3")


def test_unmarked_deleted_and_edited_check_cells_are_graded_anyway(graded_02):
    _, rows = graded_02
    assert_only_lost(rows["unmarked_check"], {"02.q1"})
    assert reason(rows["unmarked_check"], "02.q1").startswith("❌ 02.q1")
    kv_bytes, concurrency = check_of("check-kv-bytes"), check_of("check-concurrency")
    assert_only_lost(rows["deleted_check"], {kv_bytes})
    assert reason(rows["deleted_check"], kv_bytes).startswith(f"❌ {kv_bytes}")
    assert_only_lost(rows["edited_check"], {concurrency})
    assert reason(rows["edited_check"], concurrency).startswith(f"❌ {concurrency}")


def test_a_deleted_answer_earns_nothing(graded_02):
    folder, rows = graded_02
    kv_cache = check_of("check-kv-cache")
    row = rows["deleted_answer"]
    assert earned(row)[kv_cache] == 0 and row.status == GRADED
    assert "not implemented" in reason(row, kv_cache).lower()
    ran = nbformat.read(folder / "graded" / "deleted_answer.ipynb", as_version=4)
    assert cell(nbformat.read(LAB_02, as_version=4), "kv-cache").source in [c.source for c in ran.cells]


def test_redefined_checks_do_not_pass(graded_02):
    _, rows = graded_02
    row = rows["redefined_checks"]
    assert_only_lost(row, {"02.q2", check_of("check-kv-bytes")})
    assert reason(row, "02.q2").startswith("❌ 02.q2")


def test_an_endless_loop_is_stopped_and_costs_the_checks_after_it(tmp_path):
    endless = solved(SOLUTION_02)
    endless.cells.insert(0, nbformat.v4.new_code_cell("while True:\n    pass"))
    nbformat.write(endless, tmp_path / "endless_loop.ipynb")
    (row,) = grade_folder("02", tmp_path, limits=LOOP_LIMITS, progress=False)
    assert row.status == TIMED_OUT and row.score == 0
    assert row.reason == "a cell the student added ran past the cell time limit (10 s)"
    assert all(check.reason == f"not run: {row.reason}" for check in row.checks)


def test_the_notebook_time_limit_stops_a_slow_notebook(tmp_path):
    slow = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import time\ntime.sleep(1)") for _ in range(6)])
    status, reason = run_cells(slow, tmp_path, Limits(cell_s=30, notebook_s=2.5))
    assert status == TIMED_OUT and "the notebook's time limit" in reason


def test_a_dying_kernel_costs_only_the_remaining_checks(graded_02):
    _, rows = graded_02
    row = rows["kernel_death"]
    assert row.status == KERNEL_DIED and "'concurrency'" in row.reason
    assert_only_lost(row, {check_of("check-concurrency")})


def test_unreadable_files_get_their_row_and_the_rest_is_graded(graded_02):
    _, rows = graded_02
    assert rows["malformed"].status == UNREADABLE and "not valid JSON" in rows["malformed"].reason
    assert rows["notes"].status == NOT_A_NOTEBOOK and "notes.txt" in rows["notes"].reason
    assert rows["malformed"].score == rows["notes"].score == 0


def test_gradebook_files(graded_02):
    folder, rows = graded_02
    key = key_02()
    with open(folder / "gradebook.csv", newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    assert table[0] == ["student", "score", "max_score", "status", "seconds", *[c.check_id for c in key.checks]]
    by_student = {row[0]: row for row in table[1:]}
    assert set(by_student) == set(rows)
    assert by_student["correct"][1:4] == [str(key.max_score), str(key.max_score), GRADED]
    assert 0 < float(by_student["correct"][4]) < CORPUS_LIMITS.notebook_s, "the time the notebook took"
    assert by_student["kernel_death"][3] == KERNEL_DIED
    book = json.loads((folder / "gradebook.json").read_text(encoding="utf-8"))
    assert [c["id"] for c in book["checks"]] == [c.check_id for c in key.checks]
    saved = next(s for s in book["submissions"] if s["student"] == "saved_wrong_answer")
    q3 = next(c for c in saved["checks"] if c["check_id"] == "02.q3")
    assert q3["line"].startswith("❌ 02.q3") and q3["reason"] == q3["line"]


def test_bad_lab_number_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="lab number"):
        grade_folder("kv", tmp_path)
    with pytest.raises(ValueError, match="no single solution for lab 99"):
        grade_folder("99", tmp_path)
    assert main(["02", str(tmp_path / "nowhere")]) == 2
    assert "SUBMISSIONS must be a folder" in capsys.readouterr().err


# ---------------------------------------------------------------- the sandbox, unseen cases, time


SANDBOX_LIMITS = Limits(cell_s=300, notebook_s=900, memory_bytes=3 * 2**30)  # 3 GiB: an honest lab 01 needs ~1


def _hostile(base, source: str):
    notebook = copy.deepcopy(base)
    cell(notebook, "q1").source = source + '\nanswer_q1 = "prefill"\ncheck_answer("01.q1", answer_q1)'
    return notebook


@pytest.fixture(scope="module")
def sandboxed_01(tmp_path_factory):
    """Lab 01 graded with hostile neighbours: each tries one thing the sandbox forbids in its q1 cell
    (so q1 is all it can lose), beside an honest notebook, a hard-coded one, and stray files."""
    import os
    import socket
    import threading

    from infer.course.grading.exercises.week01 import grade_intensity

    folder = tmp_path_factory.mktemp("submissions_01")
    home = tmp_path_factory.mktemp("instructor_home")
    (home / "secret.txt").write_text("the instructor's own file\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    connections = []

    def accept():
        while not stopped.is_set():
            try:
                connections.append(listener.accept())
            except TimeoutError:
                continue

    stopped = threading.Event()
    threading.Thread(target=accept, daemon=True).start()

    _, solution = find_lab("01")
    base = solved(solution)
    honest = copy.deepcopy(base)
    position = honest.cells.index(cell(honest, "setup"))
    honest.cells.insert(
        position + 1,
        nbformat.v4.new_code_cell(
            "import os\nprint('seen: threads', torch.get_num_threads(), 'home', os.environ['HOME'])"
        ),
    )
    nbformat.write(honest, folder / "honest.ipynb")
    (folder / "honest.pdf").write_text("the same work, printed\n")
    (folder / "notes.txt").write_text("no notebook here\n")
    hostile = {
        "socket": f"import socket\nsocket.create_connection(('127.0.0.1', {listener.getsockname()[1]}), timeout=5)",
        "neighbour": f"print(open({str(folder / 'honest.ipynb')!r}).read()[:100])",
        "home": f"print(open({str(home / 'secret.txt')!r}).read())",
        "environment": "import os\nprint(os.environ['INSTRUCTOR_TOKEN'])",
        "memory": (
            "import resource, torch\n"
            "assert resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY, 'no memory limit'\n"
            "blocks = [torch.ones(2**28) for _ in range(50)]  # 50 GiB, touched"
        ),
    }
    for name, source in hostile.items():
        nbformat.write(_hostile(base, source), folder / f"{name}.ipynb")

    visible = {}

    def recorder(m, k, n, b):  # what a student sees at home, to hard-code
        visible[m, k, n, b] = 2 * m * k * n / (b * (m * k + k * n + m * n))
        return visible[m, k, n, b]

    assert grade_intensity(recorder).ok
    hard = copy.deepcopy(base)
    cell(hard, "intensity").source = (
        f"TABLE = {visible!r}\n\ndef matmul_arithmetic_intensity(m, k, n, bytes_per_element):\n"
        "    return TABLE.get((m, k, n, bytes_per_element), 0.0)"
    )
    nbformat.write(hard, folder / "hard_coded.ipynb")
    at_home = grade_intensity(lambda m, k, n, b: visible.get((m, k, n, b), 0.0))

    old_home, os.environ["HOME"] = os.environ.get("HOME"), str(home)
    os.environ["INSTRUCTOR_TOKEN"] = "do not leak"
    try:
        results = grade_folder("01", folder, jobs=2, limits=SANDBOX_LIMITS, progress=False)
    finally:
        os.environ.pop("INSTRUCTOR_TOKEN")
        os.environ["HOME"] = old_home
        stopped.set()
    return folder, {r.student: r for r in results}, connections, at_home


def test_each_hostile_submission_gets_its_row_with_a_reason_and_the_others_grade(sandboxed_01):
    from infer.course.grading.sandbox import choose_mode, default_hidden, default_shown

    folder, rows, connections, _ = sandboxed_01
    key = load_key(*find_lab("01"))
    assert rows["honest"].score == key.max_score, [c.reason for c in rows["honest"].checks if c.reason]
    reasons = {
        "socket": "ConnectionRefusedError",
        "neighbour": "FileNotFoundError",
        "home": "FileNotFoundError",
        "environment": "KeyError: 'INSTRUCTOR_TOKEN'",
        "memory": "can't allocate memory",
    }
    if choose_mode(default_hidden(folder), default_shown())[0] == "plain":
        pytest.skip("no namespaces on this machine: the grader runs without a sandbox, and says so")
    for name, error in reasons.items():
        row = rows[name]
        assert row.status == GRADED and "cell 'q1' raised" in row.reason and error in row.reason, (name, row.reason)
        assert_only_lost(row, {"01.q1"})
    assert connections == [], "a kernel reached a server on the grader's loopback"


def test_the_sandbox_is_named_in_the_gradebook(sandboxed_01):
    folder, *_ = sandboxed_01
    book = json.loads((folder / "gradebook.json").read_text(encoding="utf-8"))
    assert book["sandbox"].startswith("sandbox: ") and book["grading_salt"]
    assert book["kernel"]["skipped_cells"] == {"measure": "it only measures: nothing in it is checked"}


def test_a_hard_coded_answer_passes_at_home_and_fails_under_the_grader(sandboxed_01):
    _, rows, _, at_home = sandboxed_01
    assert at_home.ok, at_home.line
    row = rows["hard_coded"]
    assert_only_lost(row, {"01.lab.intensity"})
    assert "got 0, expected" in reason(row, "01.lab.intensity")


def test_threads_home_and_skipped_cells(sandboxed_01):
    import os

    from infer.course.grading.grader import default_threads

    folder, rows, _, _ = sandboxed_01
    ran = nbformat.read(folder / "graded" / "honest.ipynb", as_version=4)
    printed = next(o.text for c in ran.cells for o in c.get("outputs", []) if "seen: threads" in o.get("text", ""))
    threads, home = printed.split()[2], printed.split()[4]
    assert int(threads) == default_threads(2) == max(1, (os.cpu_count() or 1) // 2)
    assert "instructor_home" not in home and Path(home).name.startswith("s")  # the kernel's own folder
    measure = next(c for c in ran.cells if c.metadata["grader"].get("cell_id") == "measure")
    assert measure.metadata["grader"]["role"] == "skipped" and not measure.get("outputs")
    assert 0 < rows["honest"].seconds < SANDBOX_LIMITS.notebook_s


def test_a_students_other_files_are_named_in_their_one_row(sandboxed_01):
    _, rows, _, _ = sandboxed_01
    assert "honest.pdf" in rows["honest"].reason and rows["honest"].also_handed_in == ["honest.pdf"]
    assert rows["notes"].status == NOT_A_NOTEBOOK and "notes.txt is not a .ipynb file" in rows["notes"].reason
    assert "honest" in rows and len([r for r in rows.values() if r.student == "honest"]) == 1
