"""What runs in the checker's process at grading: every check that decides a grade.

A check cell of a solution is one call, `check_kv_cache(SimpleKVCache)` or `check_answer("02.q1",
answer_q1)`. At grading, `CheckCall` reads it, and `run_check` makes the same check with the
checker's own import of `grade_kv_cache`, the `grade_*` twin of the `check_*` the cell names, on
the value of each name the student's kernel sends over the wire (infer.course.grading.wire): a
number for an answer, a handle for a function or a class, which the check then calls across the
boundary. So the check's cases, its salted cases that no student saw (the salt lives only here),
its references and its models are computed in this process, where no student code runs.

What the boundary does not cover: the values a function returns are computed in the student's
kernel, and so are the facts a check gathers there about *how* they were computed (the ops a
call ran, for checks that refuse a torch.cat or an N x N tensor): code that rewrites the kernel's
side can fake those facts, but not a right answer to a case it has never seen."""

import ast
import importlib
import socket
import threading
from dataclasses import dataclass

from infer.course.grading.checks import Verdict
from infer.course.grading.wire import Conversation

SOCKET_NAME = "checker.sock"
ACCEPT_POLL_S = 0.5


class NotACheckCall(ValueError):
    """A solution's check cell that is not one call of a check on names and constants."""


@dataclass(frozen=True)
class CheckCall:
    module: str  # where the checker imports the check from
    grade_name: str  # grade_kv_cache: returns the Verdict that check_kv_cache prints
    args: tuple  # ("name", "SimpleKVCache") for a name in the student's notebook, ("value", 3) for a constant

    @classmethod
    def parse(cls, source: str, course_imports: dict) -> "CheckCall":
        try:
            body = ast.parse(source).body
        except SyntaxError as error:
            raise NotACheckCall(f"not Python: {error}") from error
        call = body[0].value if len(body) == 1 and isinstance(body[0], ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.keywords:
            raise NotACheckCall(f"expected one call such as check_x(name), got {source!r}")
        name = call.func.id
        if not name.startswith("check_") or name not in course_imports:
            raise NotACheckCall(f"{name} is not a check_* imported from infer.course.grading")
        args = []
        for arg in call.args:
            if isinstance(arg, ast.Name):
                args.append(("name", arg.id))
            elif isinstance(arg, ast.Constant):
                args.append(("value", arg.value))
            else:
                raise NotACheckCall(f"{name}'s arguments must be names or constants, got {ast.unparse(arg)!r}")
        grade_name = "grade_" + name.removeprefix("check_")
        if not hasattr(importlib.import_module(course_imports[name]), grade_name):
            raise NotACheckCall(f"{course_imports[name]} has {name} but no {grade_name} returning its Verdict")
        return cls(course_imports[name], grade_name, tuple(args))

    def run(self, conversation: Conversation) -> Verdict:
        values = [conversation.request("lookup", what) if kind == "name" else what for kind, what in self.args]
        return getattr(importlib.import_module(self.module), self.grade_name)(*values)


class CheckerSocket:
    """The socket a submission's kernel connects to, once per check, in the kernel's own folder."""

    def __init__(self, path: str):
        self.path = path
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.listener.settimeout(ACCEPT_POLL_S)

    def close(self) -> None:
        self.listener.close()


class CheckRun:
    """One check, run in a thread of the checker while the kernel's cell answers it:
    `start()`, then execute the kernel's cell, then `finish()` for the verdict's line."""

    def __init__(self, check_call: CheckCall, checker_socket: CheckerSocket, qid: str):
        self.check_call, self.checker_socket, self.qid = check_call, checker_socket, qid
        self.connection: socket.socket | None = None
        self.stopped = threading.Event()
        self.line = ""
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set() and self.connection is None:
            try:
                self.connection, _ = self.checker_socket.listener.accept()
            except TimeoutError:
                continue
        if self.connection is None:
            return
        conversation = Conversation(self.connection, lends_freely=False)
        try:
            verdict = self.check_call.run(conversation)
            self.line = (
                verdict.line if isinstance(verdict, Verdict) else f"❌ {self.qid}: the check returned no verdict"
            )
        except Exception as error:  # a name the kernel lacks, what is not plain data, a hung-up kernel...
            self.line = f"❌ {self.qid}: the check raised {type(error).__name__}: {error}"
        try:
            conversation.send({"done": True}, [])  # the kernel's cell ends here, whatever the verdict
        except OSError:
            pass  # the kernel hung up first

    def finish(self, wait_s: float = 5.0) -> str:
        """The verdict's line once the kernel's cell has ended ("" if the kernel never connected)."""
        self.stopped.set()  # the cell has ended: no kernel will connect for this check any more
        self.thread.join(wait_s)  # a check still sending "done"
        if self.thread.is_alive() and self.connection is not None:
            self.connection.shutdown(socket.SHUT_RDWR)  # the kernel's cell ended before the check did
        self.thread.join()
        if self.connection is not None:
            self.connection.close()
        return self.line
