"""What runs in the student's kernel at grading: it answers the checker, and nothing else.

In the assembled notebook, each check cell becomes one call, `answer_checker(SOCKET, globals())`.
It connects to the checker's socket and answers its requests until the checker says it is done:
the value of one of the student's names (an answer, a function, a class), a call into something
the student wrote, an attribute of it. Everything it sends is plain data or a handle
(infer.course.grading.wire); the check itself, its cases and its references stay in the
checker's process.

Nothing here can make a grade: code in this kernel may replace this module, and then the checker
gets whatever that code sends, which it judges like any other answer."""

import socket

from infer.course.grading.checks import OpWatch
from infer.course.grading.wire import Conversation


def answer_checker(socket_path: str, namespace: dict) -> None:
    """Serve the checker's requests for one check, in `namespace` (the notebook's globals)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(socket_path)
        kernel_conversation(sock, namespace).serve_until_answer()


def kernel_conversation(sock: socket.socket, namespace: dict) -> Conversation:
    """The kernel's end of a check's conversation: it lends the checker anything the student wrote."""
    return Conversation(
        sock, lends_freely=True, on_request={"lookup": lambda name: _lookup(namespace, name)}, watch=_watched
    )


def _lookup(namespace: dict, name: str):
    if name not in namespace:
        raise NameError(f"name {name!r} is not defined")
    return namespace[name]


def _watched(call):
    """A call the check watches op by op (checks.OpWatch): its result and the ops it ran."""
    with OpWatch() as watch:
        result = call()
    return result, [[name, [list(shape) for shape in shapes]] for name, shapes in watch.ops]
