"""Check questions and code checks: each check prints exactly one line, ✅ or ❌ with a reason, and
the same line on every run for the same verdict (random cases are seeded by the check's id).

The API that labs (and week 05's engine lab) build on:
- `check_answer(qid, answer)` / `grade_answer(qid, answer, key=None) -> Verdict`: a fixed answer,
  a number with a unit or a choice, graded against `infer/course/grading/answer_keys/<week>.json`.
- `check_function(qid, fn, reference, cases, compare, success)` / `grade_function(...) -> Verdict`:
  a student's function run against the library's reference on every `Case`; `compare(got,
  expected)` returns None or what differs. A function (or class, or subclass) that *is* the
  library's own, imported rather than written, fails before any case runs (`library_origin`). A
  lab whose students are meant to subclass a library base class must not hand that class to these
  checks.
- `close_to(rel_tol, unit)` and `same_tokens` are ready-made comparisons; `case_rngs(qid)` gives
  the seeded generators a check draws its cases from (at grading, one more that nobody saw);
  `OpWatch` records the aten ops that code runs and the shapes they produce, so a check can refuse
  a shortcut (torch.cat, SDPA, an N x N tensor).

`grade_*` return a `Verdict`; `check_*` print its line, so a check cell shows one line.

Answer keys. A numeric answer passes if and only if it lies in the key's interval: the exact value
for counts and round-down answers, value x (1 +- tolerance) otherwise, the tolerance the question
states. A choice passes if it is the key's option. Intervals and choices are stored XOR-ed with a
stream derived from the question id: out of plain sight in the repository, not secret (anyone
can call `reveal`). Keys are rebuilt from the solutions' own answers by
`python -m infer.course.grading.answer_keys.build` (see that module).
"""

import base64
import hashlib
import inspect
import json
import math
import numbers
import os
import random
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from infer.course.grading.wire import Remote

# How to turn an answer given in another unit into the key's unit; a match means a unit slip.
UNIT_SLIPS = {
    "ms": [("seconds", 1e3), ("microseconds", 1e-3)],
    "microseconds": [("milliseconds", 1e3), ("seconds", 1e6)],
    "fraction": [("percent", 1e-2)],
    "s": [("milliseconds", 1e-3)],
    "GB": [("bytes", 1e-9), ("MB", 1e-3), ("GiB", 2**30 / 1e9)],
    "bytes": [("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("bits", 1 / 8)],
    "TFLOP/s": [("FLOP/s", 1e-12), ("GFLOP/s", 1e-3)],
    "GB/s": [("bytes/s", 1e-9), ("TB/s", 1e3)],
    "tokens/s": [("tokens/ms", 1e3)],
    "req/s": [("req/ms", 1e3)],
}
LIBRARY_PACKAGE = "infer"
EDGE_SLACK = 1e-12  # relative: float rounding at a tolerance's edge (see _grade_number)


@dataclass(frozen=True)
class Verdict:
    qid: str
    ok: bool
    reason: str = ""  # why it failed, or what was verified when it passed

    @property
    def line(self) -> str:
        if self.ok:
            return f"✅ {self.qid} correct" + (f": {self.reason}" if self.reason else "")
        return f"❌ {self.qid}: {self.reason}"


def case_rng(qid: str) -> random.Random:
    """The random generator a check draws its cases from: seeded by the check's id, so a wrong
    function fails with the same line on every run (string seeds do not depend on PYTHONHASHSEED)."""
    return random.Random(qid)


# Set by the grader in each check cell, just before the check runs (never at home): the seed of
# cases that no student has seen. See case_rngs.
GRADING_SALT_ENV = "INFER_GRADING_SALT"


def grading_salt() -> str | None:
    """The grader's seed for unseen cases, or None at home."""
    return os.environ.get(GRADING_SALT_ENV) or None


def case_rngs(qid: str) -> list[random.Random]:
    """The generators a check draws its random cases from: `case_rng(qid)`, whose cases a student
    meets at home, and at grading one more, seeded by the grader's salt, whose cases (other seeds,
    other shapes) nobody saw: code written to the visible cases fails there. A check's line on
    success is the same either way."""
    salt = grading_salt()
    return [case_rng(qid)] + ([random.Random(f"{qid}|grading|{salt}")] if salt else [])


def own_model():
    """The profile's model, loaded by the check itself (quietly): a check never runs on the
    notebook's `lm.model`, which the notebook could have swapped for one that makes any loop look right."""
    from infer.models import load_model

    return load_model(quiet=True).model


def torch_generator(rng: random.Random) -> torch.Generator:
    """A torch generator seeded from `rng`, for the tensors of a seeded case."""
    return torch.Generator().manual_seed(rng.getrandbits(63))


# ---------------------------------------------------------------- what counts as a number


def _kind_of(value: Any) -> str:
    if isinstance(value, Remote):
        return f"a {value.remote_type}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, dict):
        return "a dict"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, bool):
        return f"the bool {value}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


def as_number(value: Any, unit: str | None = None, what: str = "a number") -> tuple[float | None, str | None]:
    """(the value as a float, None), or (None, why it is not one number). Python, numpy and torch
    scalars, 0-d tensors and one-element arrays are numbers; bools, strings, None, dicts and
    sequences are not, and each gets its own message."""
    wanted = f"{what} in {unit}" if unit else what
    if value is None or value is Ellipsis:
        return None, f"expected {wanted}, got None (no answer yet, or a function without `return`?)"
    if isinstance(value, bool):
        return None, f"expected {wanted}, got the bool {value}"
    if isinstance(value, str):
        return None, f"expected {wanted}, got the string {value!r}: give a number, not text"
    if isinstance(value, dict):
        return None, f"expected {wanted}, got a dict"
    if isinstance(value, (list, tuple)):
        return None, f"expected one number{' in ' + unit if unit else ''}, got {_kind_of(value)}"
    if isinstance(value, numbers.Real):
        number = float(value)
    elif hasattr(value, "item") and hasattr(value, "shape"):  # numpy and torch arrays and scalars
        if math.prod(value.shape) != 1:
            return None, f"expected one number{' in ' + unit if unit else ''}, got {_kind_of(value)}"
        item = value.item()
        if isinstance(item, bool) or not isinstance(item, numbers.Real):
            return None, f"expected {wanted}, got {_kind_of(value)} holding {item!r}"
        number = float(item)
    else:
        return None, f"expected {wanted}, got {_kind_of(value)}"
    if not math.isfinite(number):
        return None, f"expected a finite number{' in ' + unit if unit else ''}, got {number}"
    return number, None


# ---------------------------------------------------------------- fixed answers, obfuscated keys


def _stream(qid: str, length: int) -> bytes:
    blocks, counter = b"", 0
    while len(blocks) < length:
        blocks += hashlib.sha256(f"{qid}|{counter}".encode()).digest()
        counter += 1
    return blocks[:length]


def conceal(qid: str, payload: bytes) -> str:
    """`payload` XOR-ed with a stream derived from `qid`, as base64: bound to its question."""
    return base64.b64encode(bytes(a ^ b for a, b in zip(payload, _stream(qid, len(payload))))).decode()


def reveal(qid: str, text: str) -> bytes:
    data = base64.b64decode(text)
    return bytes(a ^ b for a, b in zip(data, _stream(qid, len(data))))


def canonical_choice(value: str) -> str:
    return " ".join(str(value).strip().lower().split())


def number_interval(value: float, tolerance: str | float) -> tuple[float, float]:
    """The answers accepted: exactly `value` ("exact"), or within a relative `tolerance` of it."""
    if tolerance == "exact":
        if value != round(value):
            raise ValueError(f"an exact answer must be a whole number, got {value}")
        return float(value), float(value)
    if not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be 'exact' or a relative tolerance in (0, 1), got {tolerance!r}")
    spread = abs(value) * tolerance
    return value - spread, value + spread


def sealed_key(qid: str, spec: dict, answer: Any) -> dict:
    """The key entry for one question: `spec` (kind, unit, tolerance, options, section: what the
    lab states) plus the concealed answer. Authors call it through the answer_keys builder."""
    entry = dict(spec)
    if spec["kind"] == "choice":
        options = [canonical_choice(o) for o in spec["options"]]
        if canonical_choice(answer) not in options:
            raise ValueError(f"{qid}: the answer {answer!r} is not among the options {options}")
        entry["options"] = options
        entry["secret"] = conceal(qid, canonical_choice(answer).encode())
    else:
        value, problem = as_number(answer)
        if problem:
            raise ValueError(f"{qid}: the solution's answer is not a number: {problem}")
        entry["secret"] = conceal(qid, struct.pack("<dd", *number_interval(value, spec["tolerance"])))
    return entry


def key_interval(qid: str, key: dict) -> tuple[float, float]:
    return struct.unpack("<dd", reveal(qid, key["secret"]))


def load_key(qid: str) -> dict:
    week = qid.split(".")[0]
    path = resources.files("infer.course.grading.answer_keys").joinpath(f"{week}.json")
    keys = json.loads(path.read_text()) if path.is_file() else {}
    if qid not in keys:
        raise KeyError(f"No answer key for {qid!r} in infer/course/grading/answer_keys/{week}.json")
    return keys[qid]


def grade_answer(qid: str, answer: Any, key: dict | None = None) -> Verdict:
    key = key or load_key(qid)
    if answer is None or answer is Ellipsis:
        return Verdict(qid, False, "no answer yet (the answer variable is still None)")
    if key["kind"] == "choice":
        return _grade_choice(qid, answer, key)
    return _grade_number(qid, answer, key)


def _see(key: dict) -> str:
    return f"; see {key['section']}" if key.get("section") else ""


def _grade_choice(qid: str, answer: Any, key: dict) -> Verdict:
    options = ", ".join(repr(o) for o in key["options"])
    if not isinstance(answer, str):
        return Verdict(qid, False, f"expected one of {options} as a string, got {_kind_of(answer)}")
    given = canonical_choice(answer)
    if given not in key["options"]:
        return Verdict(qid, False, f"expected one of {options}, got {answer!r}")
    if given != reveal(qid, key["secret"]).decode():
        return Verdict(qid, False, f"{answer!r} is not the right choice{_see(key)}")
    return Verdict(qid, True)


def tolerance_text(tolerance: str | float) -> str:
    return "exact" if tolerance == "exact" else f"within {tolerance:.0%}"


def tolerance_statement(tolerance: str | float) -> str:
    """The sentence that ends a numeric question's text in a lab, stating how its key checks it
    (tests/test_answer_keys.py holds every lab to it)."""
    return "*Checked exactly.*" if tolerance == "exact" else f"*Checked to within {tolerance:.0%}.*"


def _grade_number(qid: str, answer: Any, key: dict) -> Verdict:
    unit = key.get("unit")
    value, problem = as_number(answer, unit)
    if problem:
        return Verdict(qid, False, problem)
    low, high = key_interval(qid, key)
    # An answer exactly on a stated edge (50 x 1.01) passes on both sides: a relative 1e-12 absorbs
    # the float rounding of the key's value and of the student's arithmetic, and nothing else.
    slack = EDGE_SLACK * max(abs(low), abs(high)) if key["tolerance"] != "exact" else 0.0
    if low - slack <= value <= high + slack:
        return Verdict(qid, True)
    exact = key["tolerance"] == "exact"
    if exact and value != round(value):
        return Verdict(
            qid,
            False,
            f"expected a whole number, got {value!r}: this answer is an exact count "
            f"({key.get('whole_number_rule', 'round down where the question says so')})",
        )
    for other_unit, to_key_unit in UNIT_SLIPS.get(unit, []):
        if low <= value * to_key_unit <= high:
            return Verdict(qid, False, f"expected a value in {unit}, got {value:.15g} ({other_unit}?)")
    nearest_accepted = low if value < low else high
    shown = distinct_pair(value, nearest_accepted)[0]  # never the accepted edge's own digits
    shown = f"{shown} {unit}" if unit else shown
    if exact:
        return Verdict(qid, False, f"{shown} is not the exact answer{_see(key)}")
    return Verdict(qid, False, f"{shown} is not {tolerance_text(key['tolerance'])} of the expected value{_see(key)}")


def check_answer(qid: str, answer: Any) -> None:
    print(grade_answer(qid, answer).line)


# ---------------------------------------------------------------- code checks


@dataclass(frozen=True)
class Case:
    """One input to a code check: `description` names it in the failure message."""

    description: str
    args: tuple
    kwargs: dict | None = None


def library_origin(obj: Any) -> str | None:
    """The dotted name of the course library's object that `obj` is (or subclasses, or wraps with
    functools.partial, or copies with `type()`), or None when the student wrote it. A lab asks for
    the idea written by hand: handing in `infer.kv_cache.KVCache` itself proves nothing. An object
    in the student's kernel at grading (a wire.Remote) is not: the answers are not in that kernel."""
    if isinstance(obj, Remote):
        return None
    candidates = [getattr(obj, "func", None), getattr(obj, "__func__", None), obj]
    if isinstance(obj, type):
        candidates += list(obj.__mro__)
    for candidate in candidates:
        module = getattr(candidate, "__module__", None) or ""
        if module == LIBRARY_PACKAGE or module.startswith(LIBRARY_PACKAGE + "."):
            return _library_name(candidate, module)
    if isinstance(obj, type):  # a class of the student's own name whose methods are the library's
        for klass in obj.__mro__:
            for value in vars(klass).values():
                origin = library_origin(value) if inspect.isfunction(value) else None
                if origin:
                    return origin.rsplit(".", 1)[0]
    return None


def _library_name(candidate: Any, module: str) -> str:
    """`module.qualname`, or for a copy of a library class (`type("Mine", (), dict(vars(KVCache)))`
    keeps the library's `__module__`) the name of the class whose methods it holds."""
    qualname = getattr(candidate, "__qualname__", type(candidate).__name__)
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is candidate or not isinstance(candidate, type):
        return f"{module}.{qualname}"
    for value in vars(candidate).values():
        if inspect.isfunction(value) and (value.__module__ or "").startswith(LIBRARY_PACKAGE):
            return f"{value.__module__}.{value.__qualname__.rsplit('.', 1)[0]}"
    return f"{module}.{qualname}"


def library_verdict(qid: str, obj: Any) -> Verdict | None:
    """A failing verdict if `obj` is the library's own, else None."""
    origin = library_origin(obj)
    if origin is None:
        return None
    return Verdict(
        qid,
        False,
        f"this is the course library's own {origin}, imported rather than written: "
        f"the lab asks you to write it yourself",
    )


def grade_function(
    qid: str,
    fn: Callable,
    reference: Callable,
    cases: Iterable[Case],
    compare: Callable[[Any, Any], str | None],
    success: str,
) -> Verdict:
    """Run `fn` and `reference` on every case; `compare(got, expected)` returns None or what differs."""
    if not callable(fn):
        return Verdict(qid, False, f"expected a function, got {_kind_of(fn)}")
    borrowed = library_verdict(qid, fn)
    if borrowed:
        return borrowed
    count = 0
    for case in cases:
        count += 1
        kwargs = case.kwargs or {}
        try:
            got = fn(*case.args, **kwargs)
        except Exception as exc:  # the student's bug, reported as one line rather than a traceback
            if isinstance(exc, NotImplementedError):
                return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
            return Verdict(qid, False, f"on {case.description}, raised {type(exc).__name__}: {exc}")
        problem = compare(got, reference(*case.args, **kwargs))
        if problem:
            return Verdict(qid, False, f"on {case.description}, {problem}")
    return Verdict(qid, True, success) if count else Verdict(qid, False, "no test cases were generated")


def check_function(
    qid: str,
    fn: Callable,
    reference: Callable,
    cases: Iterable[Case],
    compare: Callable[[Any, Any], str | None],
    success: str,
) -> None:
    print(grade_function(qid, fn, reference, cases, compare, success).line)


def same_tokens(got, expected) -> str | None:
    """Compare two token-id sequences (tensors or lists); say where they first differ."""
    got_list, expected_list = _as_id_list(got), _as_id_list(expected)
    if got_list is None:
        return f"expected token ids (a tensor or list of ints), got {_kind_of(got)}"
    if len(got_list) != len(expected_list):
        return f"expected {len(expected_list)} tokens, got {len(got_list)}"
    for position, (g, e) in enumerate(zip(got_list, expected_list)):
        if g != e:
            return f"token {position} differs: got {g}, expected {e}"
    return None


def _as_id_list(ids) -> list[int] | None:
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    while isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], list):
        ids = ids[0]  # accept a [1, n] batch of one
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return None
    return ids


def distinct_pair(got: float, expected: float) -> tuple[str, str]:
    """The two numbers printed with just enough digits to tell them apart (never "got 0.9987,
    expected 0.9987"); whole numbers as whole numbers (65536, not 6.554e+04)."""
    if all(float(x).is_integer() and abs(x) < 1e16 for x in (got, expected)):
        return f"{int(got)}", f"{int(expected)}"
    for digits in range(4, 18):
        shown = f"{got:.{digits}g}", f"{expected:.{digits}g}"
        if shown[0] != shown[1]:
            return shown
    return repr(got), repr(expected)


def close_to(rel_tol: float = 1e-6, unit: str = "", abs_tol: float = 1e-12) -> Callable[[Any, Any], str | None]:
    """A comparison for numbers, or tuples of numbers (a list is fine too), within a relative
    tolerance. Floats are compared as float64; the default suits float32 results."""

    def compare(got, expected) -> str | None:
        if isinstance(expected, tuple):
            if not isinstance(got, (tuple, list)):
                return f"expected a tuple of {len(expected)} numbers, got {_kind_of(got)}"
            if len(got) != len(expected):
                return f"expected a tuple of {len(expected)} numbers, got {_kind_of(got)}"
            pairs = list(zip(got, expected))
        else:
            pairs = [(got, expected)]
        for index, (g, e) in enumerate(pairs):
            label = f"value {index}" if len(pairs) > 1 else "the value"
            value, problem = as_number(g, unit or None)
            if problem:
                return f"{label}: {problem}"
            if not math.isclose(value, float(e), rel_tol=rel_tol, abs_tol=abs_tol):
                shown_got, shown_expected = distinct_pair(value, float(e))
                return f"{label}: got {shown_got}, expected {shown_expected}{_unit_slip(value, float(e), unit)}"
        return None

    return compare


def _unit_slip(got: float, expected: float, unit: str) -> str:
    for other_unit, to_key_unit in UNIT_SLIPS.get(unit, []):
        if math.isclose(got * to_key_unit, expected, rel_tol=1e-6):
            return f" (in {other_unit}? expected {unit})"
    return ""


# ---------------------------------------------------------------- watching what code does


class OpWatch(TorchDispatchMode):
    """Inside `with OpWatch() as watch:`, `watch.ops` lists every aten op that ran, as
    (name, [output shapes]) in order: a check sees *how* a result was computed (a torch.cat in a
    cache write, an SDPA call or an N x N tensor in tiled attention), not only the result."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[tuple[int, ...]]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shapes = [tuple(leaf.shape) for leaf in tree_leaves(out) if isinstance(leaf, torch.Tensor)]
        self.ops.append((func.name(), shapes))
        return out

    def add_remote_ops(self, ops: list) -> None:
        """Ops that a call across the grading boundary ran in the student's kernel (see wire.py)."""
        self.ops += [(str(name), [tuple(int(n) for n in shape) for shape in shapes]) for name, shapes in ops]

    def first(self, names: Iterable[str]) -> str | None:
        """The first op run whose name contains one of `names` (e.g. "aten::cat"), or None."""
        names = tuple(names)
        return next((op for op, _ in self.ops if any(name in op for name in names)), None)

    def first_larger_than(self, elements: int, *, ignore_views: bool = False) -> tuple[str, tuple[int, ...]] | None:
        """The first (op, shape) whose output holds at least `elements` elements, or None. With
        `ignore_views`, ops that only view their input (a slice, a transpose) are not counted: a
        view of a large input (a KV cache) is not a tensor the code built."""
        for op, shapes in self.ops:
            if ignore_views and is_view_op(op):
                continue
            for shape in shapes:
                if math.prod(shape) >= elements:
                    return op, shape
        return None


def is_view_op(name: str) -> bool:
    """Whether the aten op `name` ("aten::slice.Tensor", or "aten::alias" for its default overload)
    returns a view of its input rather than new storage."""
    namespace, _, qualified = name.partition("::")
    op, _, overload = qualified.partition(".")
    try:
        return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default").is_view
    except AttributeError:
        return False
