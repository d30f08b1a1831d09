"""Grade a folder of lab submissions with one command and no server.

    python -m infer.course.grading.grader 02 submissions/ -j 4       # what `make grade` runs

Every `<student>.ipynb` in the folder is graded (the file stem is the student id), and two files
are written beside the submissions:
  gradebook.csv   student, score, max_score, status, then one column per check (points earned);
  gradebook.json  every check's line and every failure's reason, per student.
The notebook that was actually run for each student, with its outputs, goes to graded/.

How a submission is graded. The solution notebook is the key: its check cells (marked
`# NBVAL_CHECK_OUTPUT`) give the check code and, from their executed outputs, the one line each
check must print. For each student the grader assembles a notebook in the lab's cell order:
- every code cell is the student's cell with the same cell id; a cell the student deleted is put
  back as the lab shipped it (a stub for an answer, so a deleted answer earns nothing: solution
  code is never restored). Cells the student added run where the student put them;
- every check cell is rebuilt from the solution: its trusted part is everything after its last
  solution block (the whole cell when it has none). The student's answer in a mixed cell (`answer_q1
  = ...` above `check_answer(...)`) runs first as a cell of its own. So a deleted, edited or
  unmarked check cell is graded anyway, and a line the student saved counts for nothing;
- the check itself runs in this process, never in the student's kernel (checker_side.py): the
  check cell in the kernel only answers it (kernel_side.py), over a socket, with plain data
  (wire.py); the kernel imports a copy of the library without the lab's answers
  (kernel_library.py). So a redefined, patched or hooked check module, or a saved line, changes
  nothing: the line is the checker's, written into the cell's output for the instructor.
A check earns its points (`grade.points` in the solution cell's metadata, default 1; its id is
`grade.id`, or the qid its line prints, such as 02.q3) when its cell prints exactly the
expected line.

Each submission runs in a fresh kernel, in a folder of its own holding only its notebook (figures
and results go there too), with a time limit per cell and per notebook; a student's error does not
stop the run, and is named in the row's reason. A cell that times out or a kernel that dies ends
that student's run: the checks not yet run earn nothing, and the status and reasons say why. Only
`.ipynb` files are graded: a student's other files (alice.pdf beside alice.ipynb) are named in
that student's one row, and a student with no notebook gets a row saying so. The others are still
graded, in parallel with -j.

The sandbox (infer.course.grading.sandbox, as far as this machine allows; the grader prints one line
saying what it got): the kernel starts with an environment built from nothing (HOME is its own
folder), without network but its own loopback, unable to see the homes, /tmp, the other
submissions or the solutions, with memory, CPU-time and file-size limits of its own, and with
cores / jobs threads (so that parallel kernels do not fight over the cores). The checks build
their own models and inputs; at grading they also run cases no student saw (a salt, new for each
run, held in this process and written into gradebook.json, seeds them:
infer.course.grading.checks.case_rngs), so code written to the cases a student saw at home fails.
Cells the solution marks `"grade": {"skip": why}` only measure: they are not run at grading, so
that time never costs a point.

Why not nbval for this. nbval stays the engine of record for the lectures and solutions (`make
test`), but it cannot grade: it compares a notebook with the outputs stored in that same notebook
(a saved wrong line passes, an unmarked or deleted check is not compared), it has no per-notebook
time limit (a hung submission loses the whole pytest report), and its report is a diff per cell
index, not a check's line and points. The grader reuses nbval's contract (the same marker, one
compared line per check cell) and runs the cells itself with nbclient, the executor nbval uses.
"""

import argparse
import ast
import csv
import json
import os
import re
import secrets
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path

import nbformat
import torch
from jupyter_client import AsyncKernelManager
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from tqdm import tqdm

from infer.course.grading import kernel_library, sandbox
from infer.course.grading.checker_side import SOCKET_NAME, CheckCall, CheckerSocket, CheckRun, NotACheckCall
from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.labgen import CHECK_MARK, END
from infer.course.notebooks import poll_in_slices
from infer.paths import REPO_ROOT

GRADEBOOK_CSV, GRADEBOOK_JSON, GRADED_DIR = "gradebook.csv", "gradebook.json", "graded"
CELL_TIMEOUT_S, NOTEBOOK_TIMEOUT_S = 300, 1200
MIN_KERNEL_MEMORY = 4 * 2**30  # an honest lab's kernel peaks near 1 GiB of address space on the CPU profile
FILE_SIZE_LIMIT = 2 * 2**30
PASSED_THROUGH = ("INFER_PROFILE", "INFER_WEIGHTS", "CUDA_VISIBLE_DEVICES", "HF_HOME")  # the course's, not secrets
QID_IN_LINE = re.compile(r"^(?:✅|❌)\s+([^\s:]+)")
COURSE_PACKAGE = "infer.course"
CHECKER_SOCKET_ENV = "INFER_CHECKER_SOCKET"
KERNEL_SIDE_CELL = (
    f"# {CHECK_MARK}\n"
    "# The check runs in the grader's process; this cell answers its questions.\n"
    "import os\n"
    "from infer.course.grading.kernel_side import answer_checker\n"
    f"answer_checker(os.environ[{CHECKER_SOCKET_ENV!r}], globals())"
)

# Row statuses: how far the run got, apart from the score.
GRADED, TIMED_OUT, KERNEL_DIED = "graded", "timed out", "kernel died"
UNREADABLE, NOT_A_NOTEBOOK, GRADER_ERROR = "unreadable", "not a notebook", "grader error"


class GradingKeyError(ValueError):
    """The solution cannot serve as a key (a check cell without its executed line, ...)."""


@dataclass(frozen=True)
class Check:
    check_id: str
    cell_id: str
    points: float
    trusted_source: str  # the check code, rebuilt from the solution
    expected_line: str  # what the solution's executed cell printed
    call: CheckCall  # how the checker's process makes it (checker_side)


@dataclass(frozen=True)
class LabCell:
    cell_id: str
    lab_source: str  # as the lab ships it: the stand-in for a deleted cell
    check: Check | None = None
    skip: str = ""  # why the cell is not run at grading (the solution's grade.skip): it only measures


@dataclass(frozen=True)
class GradingKey:
    lab: str  # e.g. 02_kv_cache
    cells: tuple[LabCell, ...]  # the lab's code cells, in order

    @property
    def checks(self) -> list[Check]:
        return [cell.check for cell in self.cells if cell.check]

    @property
    def max_score(self) -> float:
        return sum(check.points for check in self.checks)


@dataclass
class CheckResult:
    check_id: str
    points: float
    earned: float = 0
    line: str = ""  # what the restored check cell printed
    reason: str = ""  # why it earned nothing


@dataclass
class SubmissionResult:
    student: str
    file: str
    status: str
    reason: str = ""
    score: float = 0
    max_score: float = 0
    seconds: float = 0  # from the submission's start to its last cell, kernel start included
    cell_errors: list[str] = field(default_factory=list)  # what the student's own cells raised
    also_handed_in: list[str] = field(default_factory=list)  # the student's other files, not graded
    checks: list[CheckResult] = field(default_factory=list)


# ---------------------------------------------------------------- the key, from lab + solution


def find_lab(number: str, root: Path = REPO_ROOT) -> tuple[Path, Path]:
    """(lab, solution) paths for a lab number such as "02" or "2"."""
    if not number.isdigit():
        raise ValueError(f"LAB must be a lab number such as 02, got {number!r}")
    solutions = sorted((root / "solutions").glob(f"{int(number):02d}_*.ipynb"))
    if len(solutions) != 1:
        found = ", ".join(p.name for p in (root / "solutions").glob("*.ipynb")) or "none"
        raise ValueError(f"no single solution for lab {number} in {root / 'solutions'} (found: {found})")
    lab = root / "labs" / solutions[0].name
    if not lab.exists():
        raise ValueError(f"{lab} is missing: run `make labs`")
    return lab, solutions[0]


def trusted_part(source: str) -> str:
    """What runs as the check: the lines after the cell's last solution block, or the whole cell."""
    lines = source.split("\n")
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    tail = lines[ends[-1] + 1 :] if ends else lines
    return "\n".join(line for line in tail if CHECK_MARK not in line).strip("\n")


def student_part(source: str, trusted: str) -> str:
    """A check cell's source without the marker and the trusted lines: the student's answer."""
    trusted_lines = {line.strip() for line in trusted.split("\n") if line.strip()}
    kept = [line for line in source.split("\n") if CHECK_MARK not in line and line.strip() not in trusted_lines]
    return "\n".join(kept).strip("\n")


def printed_line(cell) -> str:
    return "".join(
        o.get("text", "")
        for o in cell.get("outputs", [])
        if o.get("output_type") == "stream" and o.get("name") == "stdout"
    ).strip()


def course_imports(notebook) -> dict:
    """{name: module} for every `from infer.course... import name` in the notebook's code cells."""
    names = {}
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue  # IPython magics: no course import there
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(COURSE_PACKAGE):
                names.update({alias.asname or alias.name: node.module for alias in node.names})
    return names


def load_key(lab_path: Path, solution_path: Path) -> GradingKey:
    solution = nbformat.read(solution_path, as_version=4)
    lab = nbformat.read(lab_path, as_version=4)
    solution_cells = {c.id: c for c in solution.cells if c.cell_type == "code"}
    lab_code = [c for c in lab.cells if c.cell_type == "code"]
    if [c.id for c in lab_code] != list(solution_cells):
        raise GradingKeyError(f"{lab_path} and {solution_path} have different code cells: run `make labs`")
    cells, seen_ids, imports = [], set(), course_imports(solution)
    for lab_cell in lab_code:
        solution_cell = solution_cells[lab_cell.id]
        check = None
        if CHECK_MARK in solution_cell.source:
            check = _check_from(solution_cell, solution_path.name, imports)
            if check.check_id in seen_ids:
                raise GradingKeyError(
                    f"{solution_path.name}: two checks have the id {check.check_id!r}; "
                    "give one a grade.id in its cell metadata"
                )
            seen_ids.add(check.check_id)
        skip = solution_cell.metadata.get("grade", {}).get("skip", "")
        if skip and check:
            raise GradingKeyError(f"{solution_path.name}, cell {lab_cell.id!r}: a check cell cannot be skipped")
        cells.append(LabCell(lab_cell.id, lab_cell.source, check, skip))
    if not seen_ids:
        raise GradingKeyError(f"{solution_path.name} has no check cell ({CHECK_MARK})")
    return GradingKey(solution_path.stem, tuple(cells))


def _check_from(cell, notebook_name: str, imports: dict) -> Check:
    where = f"{notebook_name}, check cell {cell.id!r}"
    expected = printed_line(cell)
    if not expected or "\n" in expected:
        raise GradingKeyError(
            f"{where}: expected one printed line in its outputs, found {expected!r}; "
            "execute the solution (make notebooks)"
        )
    if not expected.startswith("✅"):
        raise GradingKeyError(f"{where}: the solution's own line is not a pass: {expected!r}")
    grade = cell.metadata.get("grade", {})
    points = grade.get("points", 1)
    if isinstance(points, bool) or not isinstance(points, (int, float)) or points <= 0:
        raise GradingKeyError(f"{where}: grade.points must be a positive number, got {points!r}")
    qid = QID_IN_LINE.match(expected)
    check_id = grade.get("id") or (qid and qid.group(1))
    if not check_id:
        raise GradingKeyError(f"{where}: its line names no check id; set grade.id in the cell metadata")
    trusted = trusted_part(cell.source)
    try:
        call = CheckCall.parse(trusted, imports)
    except NotACheckCall as error:
        raise GradingKeyError(f"{where}: the checker cannot make this check: {error}") from None
    return Check(check_id, cell.id, points, trusted, expected, call)


# ---------------------------------------------------------------- one submission's notebook


def assemble(key: GradingKey, submission) -> tuple[nbformat.NotebookNode, int]:
    """The notebook to run for one submission, and how many lab cells it supplied. Each check cell
    becomes the kernel's side of its check (kernel_side.answer_checker): the check itself runs in
    the checker's process while that cell answers it."""
    lab_ids = {cell.cell_id for cell in key.cells}
    student_cells, added_after, anchor = {}, {}, None
    for cell in submission.cells:
        if cell.cell_type != "code":
            continue
        cell_id = cell.get("id")
        if cell_id in lab_ids and cell_id not in student_cells:
            student_cells[cell_id], anchor = cell.source, cell_id
        else:
            added_after.setdefault(anchor, []).append(cell.source)

    cells = []

    def add(source: str, role: str, **extra) -> None:
        if source.strip():
            cells.append(nbformat.v4.new_code_cell(source, metadata={"grader": {"role": role, **extra}}))

    for source in added_after.get(None, []):
        add(source, "student, added")
    for lab_cell in key.cells:
        source = student_cells.get(lab_cell.cell_id, lab_cell.lab_source)
        origin = "student" if lab_cell.cell_id in student_cells else "lab, deleted by the student"
        check = lab_cell.check
        if lab_cell.skip:
            add(source, "skipped", cell_id=lab_cell.cell_id, why=lab_cell.skip)
        elif check is None:
            add(source, origin, cell_id=lab_cell.cell_id)
        else:
            add(student_part(source, check.trusted_source), origin, cell_id=lab_cell.cell_id)
            cells.append(
                nbformat.v4.new_code_cell(
                    KERNEL_SIDE_CELL,
                    metadata={
                        "grader": {
                            "role": "check",
                            "cell_id": lab_cell.cell_id,
                            "check_id": check.check_id,
                            "expected": check.expected_line,
                        }
                    },
                )
            )
        for added in added_after.get(lab_cell.cell_id, []):
            add(added, "student, added")
    notebook = nbformat.v4.new_notebook(
        cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}}
    )
    return notebook, len(student_cells)


# ---------------------------------------------------------------- running it


@dataclass(frozen=True)
class Limits:
    cell_s: float = CELL_TIMEOUT_S
    notebook_s: float = NOTEBOOK_TIMEOUT_S
    memory_bytes: int | None = None  # per kernel; None: default_memory(jobs)
    threads: int | None = None  # per kernel; None: the cores divided among the jobs


@dataclass(frozen=True)
class Session:
    """What one grading run's submissions share: the sandbox, the seed of unseen cases, the
    limits each kernel gets, and the folder that holds each submission's own folder."""

    mode: str  # infer.course.grading.sandbox's mode: "nobody", "userns" or "plain"
    sandbox_line: str  # what the grader prints about it
    root: str
    salt: str | None = None
    hide: tuple[str, ...] = ()
    show: tuple[str, ...] = ()
    threads: int = 1
    memory_bytes: int = MIN_KERNEL_MEMORY
    memory_limit: str = "address space"
    library: str = ""  # the kernel's copy of the library, without the lab's answers (kernel_library)
    hidden: tuple[str, ...] = ()  # the definitions that copy lacks


def default_threads(jobs: int) -> int:
    """Each kernel's share of the cores: torch's default (one thread per core in every kernel)
    oversubscribes them as soon as two kernels run, and a small model's steps then wait on each
    other's threads (lab 02's race ran 15 to 45 times slower with two kernels on two cores)."""
    return max(1, (os.cpu_count() or 1) // max(1, jobs))


def gpu_machine() -> bool:
    return Path("/dev/nvidia0").exists() or shutil.which("nvidia-smi") is not None


def default_memory(jobs: int) -> int:
    """Each kernel's share of three quarters of the machine's memory, at least MIN_KERNEL_MEMORY."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return MIN_KERNEL_MEMORY
    return max(MIN_KERNEL_MEMORY, int(0.75 * total / max(1, jobs)))


def open_session(
    folder: Path, jobs: int, limits: Limits, salt: str | None, root: Path, hidden_definitions: tuple[str, ...] = ()
) -> Session:
    """Choose the sandbox (the strongest mode this machine allows) and the per-kernel limits, and
    build the kernels' library without `hidden_definitions` (kernel_library) under `root`."""
    library = kernel_library.build(hidden_definitions, root / "library")
    hide = sandbox.default_hidden(folder, extra=(REPO_ROOT / "infer",))
    show = sandbox.default_shown() + (str(library),)
    mode, why_not = sandbox.choose_mode(hide, show, str(library))
    return Session(
        mode=mode,
        sandbox_line=sandbox.describe(mode, why_not),
        root=str(root),
        salt=salt,
        hide=hide,
        show=show,
        threads=limits.threads or default_threads(jobs),
        memory_bytes=limits.memory_bytes or default_memory(jobs),
        memory_limit="data" if gpu_machine() else "address space",
        library=str(library),
        hidden=tuple(hidden_definitions),
    )


def plain_session(root: Path) -> Session:
    """No namespaces: for running a notebook without a grading run around it (tests, tools)."""
    return Session(mode="plain", sandbox_line=sandbox.describe("plain", "not asked for"), root=str(root))


def read_submission(path: Path):
    """The notebook in `path`, or (status, reason) when there is none to grade."""
    if path.suffix != ".ipynb":
        return NOT_A_NOTEBOOK, f"{path.name} is not a .ipynb file"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        return UNREADABLE, f"{path.name} is not valid JSON ({error})"
    if not isinstance(data, dict) or "cells" not in data or "nbformat" not in data:
        return NOT_A_NOTEBOOK, f"{path.name} is JSON but not a Jupyter notebook (no cells or nbformat)"
    try:
        return nbformat.reads(json.dumps(data), as_version=4)
    except Exception as error:  # nbformat's own reasons (an unknown version, a broken cell...)
        return NOT_A_NOTEBOOK, f"{path.name} is not a readable notebook ({type(error).__name__}: {error})"


class GradingClient(NotebookClient):
    """nbclient's executor, polling its kernel's replies in slices (infer.course.notebooks'
    poll_in_slices): a reply that arrives with widget messages is not left waiting for the cell limit."""

    async def async_start_new_kernel_client(self):
        client = await super().async_start_new_kernel_client()
        poll_in_slices(client.shell_channel)
        poll_in_slices(client.iopub_channel)
        return client


class SandboxedKernelManager(AsyncKernelManager):
    """jupyter_client's kernel manager, starting the kernel through infer.course.grading.sandbox's
    launcher (`launcher`: its command prefix) and talking to it over Unix sockets in the kernel's
    own folder, which need no network: the kernel may live in a network namespace of its own."""

    launcher: list[str] = []

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return self.launcher + super().format_kernel_cmd(extra_arguments)


def kernel_env(workdir: Path, session: Session) -> dict[str, str]:
    threads = str(session.threads)
    extra = {name: os.environ[name] for name in PASSED_THROUGH if name in os.environ}
    extra |= {
        CHECKER_SOCKET_ENV: str(workdir / SOCKET_NAME),
        **({"PYTHONPATH": session.library} if session.library else {}),
        "INFER_FIGURES_DIR": str(workdir / "figures"),
        "INFER_RESULTS_DIR": str(workdir / "results"),
        **{name: threads for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")},
    }
    return sandbox.minimal_env(workdir, extra)


def _kernel_manager(workdir: Path, session: Session, limits: Limits) -> SandboxedKernelManager:
    connection_file = workdir / "kernel.json"
    plan = sandbox.Plan(
        mode=session.mode,
        workdir=str(workdir),
        hide=session.hide + (session.root,),
        show=session.show,
        memory_bytes=session.memory_bytes,
        memory_limit=session.memory_limit,
        cpu_seconds=int(limits.notebook_s * session.threads) + 60,
        file_bytes=FILE_SIZE_LIMIT,
        chown=(str(connection_file),) if session.mode == "nobody" else (),
    ).write(workdir / "sandbox.json")
    manager = SandboxedKernelManager(kernel_name="python3", transport="ipc", ip=str(workdir / "ipc"))
    manager.connection_file = str(connection_file)
    manager.launcher = sandbox.launcher_command(plan)
    return manager


def run_cells(
    notebook, workdir: Path, limits: Limits, session: Session | None = None, checks: dict | None = None
) -> tuple[str, str]:
    """Execute the notebook's cells in a fresh kernel in `workdir`, sandboxed as `session` says
    (plain without one): (status, reason), outputs stored in place. Cells marked skipped are not run.
    A check cell's check (`checks`: check id -> Check) runs here, in this process, while the
    kernel's cell answers it; the cell's output becomes the check's line."""
    session = session or plain_session(workdir)
    if session.mode == "nobody":
        os.chown(workdir, sandbox.NOBODY_UID, sandbox.NOBODY_GID)
    checker_socket = CheckerSocket(str(workdir / SOCKET_NAME))
    os.chmod(checker_socket.path, 0o777)  # `nobody` connects to it
    client = GradingClient(
        notebook,
        km=_kernel_manager(workdir, session, limits),
        kernel_name="python3",
        allow_errors=True,
        shutdown_kernel="immediate",
        resources={"metadata": {"path": str(workdir)}},
    )
    try:
        with client.setup_kernel(env=kernel_env(workdir, session), cleanup_kc=True):  # our km: shut it down too
            deadline = time.monotonic() + limits.notebook_s  # from a started kernel: its start is not the student's
            for index, cell in enumerate(notebook.cells):
                grader = cell.metadata.get("grader", {})
                if grader.get("role") == "skipped":
                    continue
                where = _describe(cell)
                left = deadline - time.monotonic()
                if left <= 0:
                    return TIMED_OUT, f"the notebook's time limit ({limits.notebook_s:g} s) ran out before {where}"
                client.timeout = max(1, round(min(limits.cell_s, left)))
                check = (checks or {}).get(grader.get("check_id")) if grader.get("role") == "check" else None
                run = CheckRun(check.call, checker_socket, check.check_id) if check else None
                if run:
                    run.start()
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    limit = (
                        "the cell time limit" if limits.cell_s <= left else "the notebook's time limit"
                    ) + f" ({client.timeout} s)"
                    return TIMED_OUT, f"{where} ran past {limit}"
                except DeadKernelError:
                    note = workdir / sandbox.EXIT_NOTE
                    why = f" ({note.read_text()})" if note.exists() else ""
                    return KERNEL_DIED, f"the kernel died in {where}{why}"
                finally:
                    if run:
                        _record_check(cell, run.finish())
    finally:
        checker_socket.close()
    return GRADED, ""


def _record_check(cell, line: str) -> None:
    """The check cell's outputs become the checker's line; what the kernel's side printed or
    raised stays below it, for the instructor."""
    if not line:
        kernel_error = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        why = f": its cell raised {kernel_error.ename}: {kernel_error.evalue}" if kernel_error else ""
        line = f"❌ {cell.metadata['grader']['check_id']}: the kernel did not answer the check{why}"
    kernel_outputs = [o for o in cell.get("outputs", []) if o.get("output_type") in ("stream", "error")]
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=line + "\n")] + [
        nbformat.v4.new_output("stream", name="stderr", text=_output_text(o)) for o in kernel_outputs
    ]


def _output_text(output) -> str:
    if output.get("output_type") == "error":
        return f"the kernel's side raised {output.get('ename')}: {output.get('evalue')}\n"
    return output.get("text", "")


def _describe(cell) -> str:
    grader = cell.metadata.get("grader", {})
    if grader.get("role") == "check":
        return f"the check of cell {grader['cell_id']!r}"
    if "cell_id" in grader:
        return f"cell {grader['cell_id']!r}"
    return "a cell the student added"


def score_checks(key: GradingKey, notebook, stopped: str) -> list[CheckResult]:
    ran = {
        cell.metadata["grader"]["check_id"]: cell
        for cell in notebook.cells
        if cell.metadata["grader"]["role"] == "check" and cell.get("execution_count")
    }
    results = []
    for check in key.checks:
        result = CheckResult(check.check_id, check.points)
        cell = ran.get(check.check_id)
        if cell is None:
            result.reason = f"not run: {stopped}"
        else:
            result.line = printed_line(cell)
            if result.line == check.expected_line:
                result.earned = check.points
            else:
                result.reason = _why_not(result.line, check.expected_line)
        results.append(result)
    return results


def _why_not(line: str, expected: str) -> str:
    if line.startswith("❌"):
        return line
    if not line:
        return "the check printed nothing"
    return f"printed {line!r}, expected {expected!r}"


def student_errors(notebook) -> list[str]:
    """One line for each of the student's own cells that raised (checks and skipped cells aside)."""
    errors = []
    for cell in notebook.cells:
        if cell.metadata["grader"]["role"] in ("check", "skipped"):
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                value = (output.get("evalue") or "").strip().splitlines()
                errors.append(f"{_describe(cell)} raised {output.get('ename')}: {value[0][:160] if value else ''}")
    return errors


def grade_submission(
    path: Path,
    key: GradingKey,
    limits: Limits,
    graded_dir: Path | None = None,
    session: Session | None = None,
    also: tuple[str, ...] = (),
) -> SubmissionResult:
    """Grade one notebook in a folder of its own under the session's root; `also`: the student's
    other files in the submissions folder, named in the row (only .ipynb files are graded)."""
    started = time.perf_counter()
    result = SubmissionResult(path.stem, path.name, GRADED, max_score=key.max_score, also_handed_in=list(also))
    handed_in = f"also handed in, not graded (only .ipynb files are): {', '.join(also)}" if also else ""
    submission = read_submission(path)
    if isinstance(submission, tuple):
        result.status, result.reason = submission
        result.reason = "; ".join(r for r in (result.reason, handed_in) if r)
        result.checks = [CheckResult(c.check_id, c.points, reason="not graded: " + result.reason) for c in key.checks]
        return result
    notebook, matched = assemble(key, submission)
    if session and session.salt:
        os.environ[GRADING_SALT_ENV] = session.salt  # this process's checks only: never the kernel's
    if session:
        torch.set_num_threads(session.threads)
    no_match = (
        "no cell id matches the lab's: was this notebook started from the lab? (every cell is the lab's)"
        if matched == 0
        else ""
    )
    root = Path(session.root) if session else None
    try:
        with tempfile.TemporaryDirectory(prefix="s", dir=root) as workdir:  # short: Unix socket paths are
            nbformat.write(notebook, Path(workdir) / path.name)  # its only notebook: the one that runs
            checks = {check.check_id: check for check in key.checks}
            status, stopped = run_cells(notebook, Path(workdir), limits, session, checks)
    except Exception as error:  # the kernel would not start, ...: this student only
        status, stopped = GRADER_ERROR, f"the grader could not run the notebook ({type(error).__name__}: {error})"
    result.status = status
    result.cell_errors = student_errors(notebook)
    errors = ""
    if result.cell_errors:
        more = len(result.cell_errors) - 2
        errors = (
            "in the student's cells: " + "; ".join(result.cell_errors[:2]) + (f" (+{more} more)" if more > 0 else "")
        )
    result.reason = "; ".join(r for r in (stopped, no_match, errors, handed_in) if r)
    result.checks = score_checks(key, notebook, stopped)
    result.score = sum(c.earned for c in result.checks)
    result.seconds = round(time.perf_counter() - started, 1)
    if graded_dir is not None:
        nbformat.write(notebook, graded_dir / f"{path.stem}.ipynb")
    return result


# ---------------------------------------------------------------- a folder, a gradebook


def submission_files(folder: Path) -> list[tuple[Path, tuple[str, ...]]]:
    """(the file to grade, the student's other files) for each student, by file stem: a student's
    `<stem>.ipynb` when there is one, else the first of their files (graded as not a notebook)."""
    written = {GRADEBOOK_CSV, GRADEBOOK_JSON}
    files = sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and p.name not in written)
    by_student: dict[str, list[Path]] = {}
    for path in files:
        by_student.setdefault(path.stem, []).append(path)
    chosen = []
    for paths in by_student.values():
        graded = next((p for p in paths if p.suffix == ".ipynb"), paths[0])
        chosen.append((graded, tuple(p.name for p in paths if p != graded)))
    return chosen


def grade_folder(
    number: str,
    folder: Path,
    jobs: int = 1,
    limits: Limits = Limits(),
    root: Path = REPO_ROOT,
    progress: bool = True,
    salt: str | None = None,
) -> list[SubmissionResult]:
    """Grade every submission in `folder` and write the gradebook there. `salt` seeds the cases no
    student saw (a new one each run unless given, so that a run can be repeated exactly)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"SUBMISSIONS must be a folder, got {folder}")
    lab_path, solution_path = find_lab(number, root)
    key = load_key(lab_path, solution_path)
    files = submission_files(folder)
    graded_dir = folder / GRADED_DIR
    graded_dir.mkdir(exist_ok=True)
    salt = salt or secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="infer-grade-") as kernels_root:
        os.chmod(kernels_root, 0o755)  # `nobody` passes through to its own folder
        exercise_modules = {check.call.module for check in key.checks}
        hidden = tuple(kernel_library.hidden_at_grading(exercise_modules))
        session = open_session(folder, jobs, limits, salt, Path(kernels_root), hidden)
        if progress:
            print(session.sandbox_line, flush=True)
        # Separate processes: each drives its own kernel, and one that goes wrong stays alone.
        with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=get_context("spawn")) as pool:
            futures = [
                pool.submit(grade_submission, path, key, limits, graded_dir, session, also) for path, also in files
            ]
            results = [
                future.result()
                for future in tqdm(futures, desc=f"grading {key.lab}", unit="notebook", disable=not progress)
            ]
    write_gradebook(
        folder,
        key,
        results,
        solution_path.relative_to(root) if solution_path.is_relative_to(root) else solution_path,
        session,
    )
    return results


def _number(value: float):
    return int(value) if float(value).is_integer() else value


def write_gradebook(
    folder: Path, key: GradingKey, results: list[SubmissionResult], solution: Path, session: Session | None = None
) -> None:
    check_ids = [check.check_id for check in key.checks]
    with open(folder / GRADEBOOK_CSV, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["student", "score", "max_score", "status", "seconds", *check_ids])
        for result in sorted(results, key=lambda r: (r.student, r.file)):
            earned = {c.check_id: c.earned for c in result.checks}
            writer.writerow(
                [
                    result.student,
                    _number(result.score),
                    _number(result.max_score),
                    result.status,
                    result.seconds,
                    *(_number(earned[i]) for i in check_ids),
                ]
            )
    book = {
        "lab": key.lab,
        "key": str(solution),
        "graded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "max_score": _number(key.max_score),
        "sandbox": session.sandbox_line if session else "",
        "kernel": (
            {
                "threads": session.threads,
                "memory_limit": f"{session.memory_bytes / 2**30:.1f} GiB of {session.memory_limit}",
                "skipped_cells": {c.cell_id: c.skip for c in key.cells if c.skip},
            }
            if session
            else {}
        ),
        "checks_ran": "in the grader's process; each submission's kernel only answered them (checker_side.py)",
        "kernel_library_lacks": list(session.hidden) if session else [],
        "grading_salt": session.salt if session else None,  # repeats this run's unseen cases: --salt
        "checks": [
            {"id": c.check_id, "cell_id": c.cell_id, "points": _number(c.points), "expected": c.expected_line}
            for c in key.checks
        ],
        "submissions": [asdict(r) for r in sorted(results, key=lambda r: (r.student, r.file))],
    }
    (folder / GRADEBOOK_JSON).write_text(json.dumps(book, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lab", help="lab number, e.g. 02")
    parser.add_argument("submissions", type=Path, help="folder of <student>.ipynb files")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, help="seconds per cell")
    parser.add_argument("--notebook-timeout", type=float, default=NOTEBOOK_TIMEOUT_S, help="seconds per submission")
    parser.add_argument("--memory-gb", type=float, help="memory per kernel (default: 3/4 of RAM shared by the jobs)")
    parser.add_argument("--threads", type=int, help="threads per kernel (default: cores / jobs)")
    parser.add_argument("--salt", help="seed of the unseen cases (default: new; gradebook.json keeps it)")
    args = parser.parse_args(argv)
    limits = Limits(
        args.cell_timeout,
        args.notebook_timeout,
        int(args.memory_gb * 2**30) if args.memory_gb else None,
        args.threads,
    )
    try:
        results = grade_folder(args.lab, args.submissions, args.jobs, limits, salt=args.salt)
    except (ValueError, GradingKeyError) as error:
        print(f"grade: {error}", file=sys.stderr)
        return 2
    for r in sorted(results, key=lambda r: r.student):
        print(
            f"{r.student:24} {_number(r.score):>5} / {_number(r.max_score):<5} {r.seconds:6.1f} s  {r.status}"
            + (f": {r.reason}" if r.reason else "")
        )
    print(f"wrote {args.submissions / GRADEBOOK_CSV} and {args.submissions / GRADEBOOK_JSON}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
