"""The grading boundary: every check that decides a grade runs in the grader's process, and the
student's kernel, which runs the student's code, holds no answer.

The wire between them is tested in one process over a socket pair (fast). Then every lab is
graded twice in one run: its finished notebook earns full marks, and a notebook that tries every
escape a student has used against in-kernel checks earns nothing:
- an import hook that serves fake check modules (and a fake kernel side of the boundary);
- `sys.setprofile(None)`, and monkeypatching of the check and exercise modules;
- saved outputs that show every check passed;
- wrappers over the library's own code, copies of its code objects and of its source;
- answers read from the answer keys, and a look for the checker's salt, the solutions and the keys.
The same notebook, run at home (the checks in its own kernel), passes checks: the escapes are real."""

import json
import socket
import threading

import nbformat
import pytest
import torch

from infer.course.grading import kernel_library
from infer.course.grading.checks import GRADING_SALT_ENV
from infer.course.grading.grader import GRADED, Limits, find_lab, grade_folder, load_key, run_cells
from infer.course.grading.kernel_side import kernel_conversation
from infer.course.grading.wire import Conversation, Remote, WireError, storage_of
from tests.test_grader import solved

LIMITS = Limits(cell_s=300, notebook_s=900)

# The library code each lab's exercise replaces, by the student's name for it: what a lazy
# student wraps or copies.
LIBRARY_STAND_INS = {
    "01": {
        "naive_greedy_generate": "infer.generate:naive_greedy_generate",
        "ttft_and_tpot_ms": "infer.experiments.prefill_decode:ttft_and_tpot_ms",
        "matmul_arithmetic_intensity": "infer.roofline:matmul_arithmetic_intensity",
    },
    "02": {
        "SimpleKVCache": "infer.kv_cache:KVCache",
        "cached_greedy_generate": "infer.generate:cached_greedy_generate",
        "kv_bytes_per_token": "infer.memory:kv_bytes_per_token",
        "max_concurrent_sequences": "infer.memory:max_concurrent_sequences",
    },
    "03": {
        "latencies_ms": "infer.metrics:request_latencies_ms",
        "serving_metrics": "infer.metrics:calculate_metrics",
        "goodput": "infer.metrics:request_goodput",
    },
    "04": {
        "merge_softmax_states": "infer.attention:merge_states",
        "tiled_attention": "infer.attention:tiled_attention",
        "score_matrix_bytes": "infer.attention_io:score_matrix_bytes",
    },
    "05": {"admit": "infer.engine.scheduler:admit_continuous", "step_forward": "infer.engine.model_runner:step_runs"},
    "06": {
        "decide": "infer.engine.scheduler:chunked_token_counts",
        "pick_budget": "infer.experiments.chunked_prefill:best_budget",
    },
    "07": {"stream_timing": "infer.serve.client:stream_record"},
    "08": {
        "BlockAllocator": "infer.engine.paged_kv_store:PagedKVStore",
        "full_block_names": "infer.course.grading.exercises.week08:reference_full_block_names",
        "cached_prefix": "infer.course.grading.exercises.week08:reference_cached_prefix",
        "make_room": "infer.course.grading.exercises.week08:reference_make_room",
    },
    "09": {"paged_decode_attention": "infer.course.grading.exercises.week09:reference_paged_decode"},
    "10": {
        "accept_guesses_greedy": "infer.speculative:accept_greedy",
        "accept_guesses_sampled": "infer.speculative:accept_sampled",
        "blocks_after_rollback": "infer.course.grading.exercises.week10:blocks_after_rollback",
    },
}

# Runs first, in a cell the student added: every escape, each on its own, none allowed to stop the others.
ESCAPES = '''
import importlib, importlib.abc, importlib.util, inspect, os, sys, types

def _pass_everything(module):
    """Every check and grade function of `module` now prints or returns a pass."""
    from infer.course.grading.checks import Verdict
    for name in list(vars(module)):
        if name.startswith("grade_"):
            setattr(module, name, lambda *a, _n=name, **k: Verdict(_n, True))
        if name.startswith("check_"):
            setattr(module, name, lambda *a, **k: print("✅ correct"))

class _FakeChecks(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """An import hook: the course's check modules, and the kernel's side of the boundary, are fakes."""
    def find_spec(self, name, path, target=None):
        if name.startswith("infer.course.grading.") and name.rsplit(".", 1)[-1] != "exercises":
            return importlib.util.spec_from_loader(name, self)
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        module.answer_checker = lambda *a, **k: print("✅ correct")
        module.check_answer = lambda *a, **k: print("✅ correct")
        module.__getattr__ = lambda name: (lambda *a, **k: print("✅ correct"))

for _escape in ("profile", "monkeypatch", "salt", "keys", "hook"):
    try:
        if _escape == "profile":
            sys.setprofile(None)
        elif _escape == "monkeypatch":
            import pkgutil
            import infer.course.grading.checks as _checks
            import infer.course.grading.exercises as _exercises
            _pass_everything(_checks)
            for _found in pkgutil.iter_modules(_exercises.__path__):
                _pass_everything(importlib.import_module(f"infer.course.grading.exercises.{_found.name}"))
        elif _escape == "salt":
            print("ESCAPE salt:", os.environ.get("INFER_GRADING_SALT"))
            for _path in ("/proc/1/environ", f"/proc/{os.getppid()}/environ"):
                try:
                    print("ESCAPE", _path, "INFER_GRADING_SALT" in open(_path, "rb").read().decode(errors="replace"))
                except OSError as error:
                    print("ESCAPE", _path, "unreadable:", type(error).__name__)
        elif _escape == "keys":
            from infer.paths import REPO_ROOT
            print("ESCAPE solutions:", sorted(p.name for p in (REPO_ROOT / "solutions").glob("*.ipynb"))[:1])
            from infer.course.grading.checks import key_interval, load_key
            _key_of = lambda qid: sum(key_interval(qid, load_key(qid))) / 2
            import infer.course.grading.answer_keys as _keys
            from pathlib import Path as _Path
            print("ESCAPE keys:", "readable" if list(_Path(_keys.__file__).parent.glob("*.json")) else "absent")
        elif _escape == "hook":
            sys.meta_path.insert(0, _FakeChecks())
            for _name in [m for m in sys.modules if m.startswith("infer.course.grading.")]:
                del sys.modules[_name]
    except Exception as error:
        print("ESCAPE", _escape, "failed:", type(error).__name__, str(error)[:120])

def _key(qid):
    try:
        return _key_of(qid)
    except Exception:
        return None

def _copy_of(path):
    """The library's object, as a wrapper, a copied code object, or re-executed source."""
    module, name = path.split(":")
    found = getattr(importlib.import_module(module), name)
    if isinstance(found, type):
        return type("Mine", (found,), {})
    try:
        namespace = dict(found.__globals__)
        exec(inspect.getsource(found), namespace)
        return namespace[name]
    except Exception:
        return types.FunctionType(found.__code__.replace(co_name="mine"), found.__globals__, "mine",
                                  found.__defaults__, found.__kwdefaults__)
'''


def tampered(lab: str) -> nbformat.NotebookNode:
    """The lab as shipped, with every escape: a first cell, and before each check its answer set
    from the keys or its function replaced by the library's own."""
    lab_path, solution_path = find_lab(lab)
    key = load_key(lab_path, solution_path)
    notebook = nbformat.read(lab_path, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(ESCAPES))
    cells = {cell.get("id"): cell for cell in notebook.cells}
    for check in key.checks:
        cell = cells[check.cell_id]
        setting = []
        for kind, what in check.call.args:
            if kind != "name":
                continue
            if what.startswith("answer_"):
                qid = next(value for kind, value in check.call.args if kind == "value")
                setting.append(f"{what} = _key({qid!r})")
            elif what in LIBRARY_STAND_INS[lab]:
                setting.append(f"{what} = _copy_of({LIBRARY_STAND_INS[lab][what]!r})")
        lines = cell.source.split("\n")
        call_at = max(i for i, line in enumerate(lines) if "check_" in line)
        cell.source = "\n".join(lines[:call_at] + setting + lines[call_at:])
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=check.expected_line + "\n")]
    return notebook


# ---------------------------------------------------------------- the wire, in one process


@pytest.fixture
def kernel_and_checker():
    namespace = {}
    left, right = socket.socketpair()
    kernel = kernel_conversation(right, namespace)

    def serve():
        try:
            kernel.serve_until_answer()
        except (WireError, OSError):  # the checker cut the conversation off: what a refusal test expects
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    checker = Conversation(left, lends_freely=False)
    yield namespace, checker
    checker.send({"done": True}, [])
    thread.join(5)
    left.close()
    right.close()


def test_plain_data_crosses_by_value(kernel_and_checker):
    namespace, checker = kernel_and_checker
    namespace["value"] = {
        1: [1.5, float("nan"), None, "x"],
        "t": (torch.arange(6, dtype=torch.bfloat16).reshape(2, 3), torch.float16, torch.device("meta")),
        "s": {3, 4},
    }
    got = checker.request("lookup", "value")
    assert got[1][0] == 1.5 and got[1][1] != got[1][1] and got[1][2:] == [None, "x"]
    tensor, dtype, device = got["t"]
    assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, torch.arange(6, dtype=torch.bfloat16).reshape(2, 3))
    assert (dtype, device, got["s"]) == (torch.float16, torch.device("meta"), {3, 4})


def test_a_students_class_is_called_across_and_its_views_keep_their_storage(kernel_and_checker):
    namespace, checker = kernel_and_checker
    exec(
        "import torch\n"
        "class Buffer:\n"
        "    def __init__(self, n): self.data = torch.zeros(n)\n"
        "    def write(self, i, x): self.data[i] = x\n"
        "    def view(self, n): return self.data[:n]\n"
        "def fill(out): out.append(42)",
        namespace,
    )
    buffer = checker.request("lookup", "Buffer")(4)
    assert isinstance(buffer, Remote) and "Buffer" in repr(buffer)
    buffer.write(1, 3.0)
    first, second = buffer.view(2), buffer.view(3)
    assert first.tolist() == [0.0, 3.0] and storage_of(first) == storage_of(second) != storage_of(torch.zeros(1))
    filled = []
    checker.request("lookup", "fill")(filled)
    assert filled == [42], "a list passed across comes back as the callee left it"


def test_the_student_code_calls_back_what_the_checker_lends(kernel_and_checker):
    namespace, checker = kernel_and_checker
    exec("def use(model, x): return model(x) + model.offset", namespace)

    class Model:
        offset = 1

        def __call__(self, x):
            return x * 2

    assert checker.request("lookup", "use")(Model(), 5) == 11


def test_the_checker_lends_no_way_into_its_interpreter(kernel_and_checker):
    namespace, checker = kernel_and_checker
    exec(
        "def escape(obj):\n"
        "    for attempt in (lambda: obj._secret, lambda: obj.function, lambda: obj.module):\n"
        "        try:\n"
        "            attempt()\n"
        "            return 'escaped'\n"
        "        except Exception as error:\n"
        "            last = type(error).__name__\n"
        "    return last",
        namespace,
    )

    class Lent:
        module = json
        function = staticmethod(json.dumps)
        _secret = "salt"

    with pytest.raises(WireError):  # a module is refused: the conversation ends
        checker.request("lookup", "escape")(Lent())


def test_a_watched_call_brings_back_the_ops_it_ran(kernel_and_checker):
    from infer.course.grading.checks import OpWatch

    namespace, checker = kernel_and_checker
    exec("import torch\ndef grow(x): return torch.cat([x, x])", namespace)
    grow = checker.request("lookup", "grow")
    with OpWatch() as watch:
        out = grow(torch.ones(2))
    assert out.tolist() == [1.0] * 4 and watch.first(["aten::cat"]) == "aten::cat"


def test_the_kernel_library_hides_each_labs_answers(tmp_path):
    hidden = kernel_library.hidden_at_grading(["infer.course.grading.exercises.week02"])
    assert "infer.kv_cache.KVCache" in hidden and "infer.memory.kv_bytes_per_token" in hidden
    library = kernel_library.build(hidden, tmp_path)
    copied = (library / "infer" / "kv_cache.py").read_text()
    assert (
        "is not in the kernel while a lab is graded" in copied
        and "index_copy_" not in copied.split("class KVCache")[1][:400]
    )
    assert not list((library / "infer").rglob("answer_keys/*.json")), "the answer keys stay out of the kernel"
    assert str(find_lab("02")[0].parent.parent) in (library / "infer" / "paths.py").read_text()


# ---------------------------------------------------------------- every lab, graded


@pytest.mark.parametrize("lab", sorted(LIBRARY_STAND_INS))
def test_finished_work_earns_everything_and_every_escape_nothing(tmp_path, lab):
    _, solution = find_lab(lab)
    nbformat.write(solved(solution), tmp_path / "finished.ipynb")
    nbformat.write(tampered(lab), tmp_path / "tamperer.ipynb")
    results = {r.student: r for r in grade_folder(lab, tmp_path, jobs=2, limits=LIMITS, progress=False)}
    finished, tamperer = results["finished"], results["tamperer"]
    assert finished.status == GRADED and finished.score == finished.max_score, [
        c.reason for c in finished.checks if c.reason
    ]
    assert not finished.cell_errors, f"lab {lab}: a cell needs what the kernel lacks at grading: mark it grade.skip"
    assert tamperer.score == 0, f"lab {lab}: escapes earned {[c.check_id for c in tamperer.checks if c.earned]}"
    graded = nbformat.read(tmp_path / "graded" / "tamperer.ipynb", as_version=4)
    seen = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
    assert "ESCAPE salt: None" in seen, "the checker's salt never enters the kernel"
    book = json.loads((tmp_path / "gradebook.json").read_text(encoding="utf-8"))
    assert "grader's process" in book["checks_ran"] and book["kernel_library_lacks"], "the gradebook says how it graded"
    assert "ESCAPE keys: readable" not in seen and "ESCAPE keys" in seen, "the answer keys stay out of the kernel"


def test_the_escapes_do_pass_checks_that_run_in_the_students_kernel(tmp_path, monkeypatch):
    """Run at home, where the checks run in the notebook's own kernel, the escapes pass: what the
    boundary prevents is real."""
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    notebook = tampered("04")
    run_cells(notebook, tmp_path, LIMITS)
    lines = [
        o.get("text", "").strip() for c in notebook.cells for o in c.get("outputs", []) if "✅" in o.get("text", "")
    ]
    assert len(lines) >= 3, "the fake checks printed passes in the student's own kernel"
