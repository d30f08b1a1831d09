"""The library's layers stay visible: a module imports its own layer or lower ones, never a higher
one, and no chain of imports comes back to where it started.

Low to high: `infer/` (the subject: model, caches, attention, metrics...) < `infer/engine/` <
`infer/serve/` < `infer/experiments/` < `infer/course/`. Imports inside functions count too."""

import ast
from pathlib import Path

import pytest

from infer.paths import REPO_ROOT

LAYERS = ("core", "engine", "serve", "experiments", "course")


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 and parts[1] in LAYERS else "core"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The `infer` modules that `path` imports anywhere in its body (`from infer import hf` names
    the module infer.hf; `from infer.model import Arch` the module infer.model)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("infer")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("infer"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(candidate if candidate in known else node.module)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted((REPO_ROOT / "infer").rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, known) - {module_name(p)} for p in paths}


GRAPH = import_graph()


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_a_higher_layer(module):
    rank = LAYERS.index(layer_of(module))
    upward = sorted(m for m in GRAPH[module] if m != "infer" and LAYERS.index(layer_of(m)) > rank)
    assert not upward, (
        f"{module} (layer {layer_of(module)!r}) imports {upward} from a higher layer; layers from "
        f"low to high are {LAYERS}: move the shared code down, or the importing code up"
    )


def test_no_import_circle():
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(GRAPH.get(module, ())):
            if state.get(target) == "open":
                circle = path[path.index(target) :] + [target]
                pytest.fail(
                    f"import circle: {' -> '.join(circle)}; break it by moving what both need into a lower module"
                )
            if target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])


def test_the_layer_test_sees_an_upward_import(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text("def late():\n    from infer.course.grading.checks import check_answer\n")
    found = imported_modules(module, {"infer.course.grading.checks"})
    assert found == {"infer.course.grading.checks"}, "imports inside functions must count"
    assert LAYERS.index(layer_of("infer.course.grading.checks")) > LAYERS.index(layer_of("infer.model"))
