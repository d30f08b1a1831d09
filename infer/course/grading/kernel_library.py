"""The course library as a lab's kernel sees it at grading: without the lab's answers.

Each exercise module names the library code that computes what its exercises ask
(`HIDDEN_AT_GRADING`: lab 02's KVCache, lab 08's PagedKVStore, and the exercise module's own
references). `build` copies the `infer` package into the grading run's folder with each of those
definitions replaced by one that raises, and without the answer keys; the kernel imports that copy
(PYTHONPATH), and the sandbox hides the repository's own `infer` folder. So a student's function
that hands back the library's result, or copies its code object or its source, has nothing to
hand back: the answer is not in the kernel. The lab's other library code (the model, the engine,
the plotting) is there, as at home.

In the sandbox's "plain" mode nothing is hidden, and a kernel can still read the repository."""

import ast
import compileall
import importlib
import shutil
from collections.abc import Iterable
from pathlib import Path

from infer.paths import REPO_ROOT

LEFT_OUT = ("__pycache__", "*.pyc", "answer_keys")  # the keys: not even in their concealed form


def hidden_at_grading(exercise_modules: Iterable[str]) -> list[str]:
    """`module.name` of every definition the lab's exercise modules hide from its kernel."""
    names = set()
    for module_name in exercise_modules:
        module = importlib.import_module(module_name)
        for obj in getattr(module, "HIDDEN_AT_GRADING", ()):
            names.add(f"{obj.__module__}.{obj.__qualname__}")
    return sorted(names)


def build(hidden: Iterable[str], into: Path) -> Path:
    """Copy the library into `into`/infer with the `hidden` definitions replaced; `into` goes on
    the kernel's PYTHONPATH."""
    target = into / "infer"
    shutil.copytree(REPO_ROOT / "infer", target, ignore=shutil.ignore_patterns(*LEFT_OUT))
    by_module: dict[str, set[str]] = {}
    for name in hidden:
        module, _, definition = name.rpartition(".")
        by_module.setdefault(module, set()).add(definition)
    for module, definitions in by_module.items():
        path = into.joinpath(*module.split(".")).with_suffix(".py")
        path.write_text(without_definitions(path.read_text(), module, definitions))
    _point_at_the_repository(target / "paths.py")
    compileall.compile_dir(str(target), quiet=1)  # the kernel cannot write its own .pyc there
    return into


def _point_at_the_repository(paths_py: Path) -> None:
    """The copy's REPO_ROOT stays the repository's (its results, figures and configs), not the copy's."""
    found = "REPO_ROOT = Path(__file__).resolve().parent.parent"
    source = paths_py.read_text()
    if found not in source:
        raise ValueError(f"{paths_py} no longer says {found!r}: update kernel_library")
    paths_py.write_text(source.replace(found, f"REPO_ROOT = Path({str(REPO_ROOT)!r})"))


def without_definitions(source: str, module: str, definitions: set[str]) -> str:
    """`source` with each top-level function or class in `definitions` replaced by one of the
    same name that raises when it is called or built."""
    lines = source.split("\n")
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in definitions:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            found[node.name] = (first - 1, node.end_lineno, isinstance(node, ast.ClassDef))
    missing = definitions - set(found)
    if missing:
        raise ValueError(f"{module} defines no top-level {sorted(missing)} to hide")
    for name, (start, end, is_class) in sorted(found.items(), key=lambda item: -item[1][0]):
        lines[start:end] = _stand_in(name, module, is_class).split("\n")
    return "\n".join(lines)


def _stand_in(name: str, module: str, is_class: bool) -> str:
    message = (
        f"{module}.{name} is not in the kernel while a lab is graded: "
        "the lab asks you to write what it computes yourself"
    )
    if is_class:
        return f"class {name}:\n    def __init__(self, *args, **kwargs):\n        raise RuntimeError({message!r})"
    return f"def {name}(*args, **kwargs):\n    raise RuntimeError({message!r})"
