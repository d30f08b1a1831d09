"""Check questions: each check prints exactly one deterministic line, ✅ or ❌ with a reason.

Two kinds:
- `check_answer(qid, answer)`: a fixed answer (a number with a unit, or a choice) compared with a
  hashed key from `infer/course/answer_keys/<week>.json`. The key file holds digests, not answers.
  (Digests of short numbers can be brute-forced; they keep answers out of sight, not secret.)
- `check_function(qid, fn, reference, cases, compare)`: a student's function run against the
  library's reference on fresh inputs; the line says which case failed and how.

`grade_*` return a `Verdict`; `check_*` print its line (so a notebook cell shows one line and
nothing else). nbval compares that line with the solution's.
"""

import argparse
import hashlib
import json
import math
import numbers
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

# How to turn an answer given in another unit into the key's unit; a match means a unit slip.
UNIT_SLIPS = {
    "ms": [("seconds", 1e3), ("microseconds", 1e-3)],
    "s": [("milliseconds", 1e-3)],
    "GB": [("bytes", 1e-9), ("MB", 1e-3), ("GiB", 2**30 / 1e9)],
    "bytes": [("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("bits", 1 / 8)],
    "TFLOP/s": [("FLOP/s", 1e-12), ("GFLOP/s", 1e-3)],
    "GB/s": [("bytes/s", 1e-9), ("TB/s", 1e3)],
    "tokens/s": [("tokens/ms", 1e3)],
}
NUMBER_NUDGES = (0.0, -0.005, 0.005, -0.01, 0.01)  # relative: a 1% tolerance on hashed numbers


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


# ---------------------------------------------------------------- fixed answers, hashed keys


def _digest(qid: str, canonical: str) -> str:
    return hashlib.sha256(f"{qid}|{canonical}".encode()).hexdigest()


def _canonical_number(value: float, sig: int) -> str:
    return f"{value:.{sig}g}"


def _canonical_choice(value: str) -> str:
    return " ".join(str(value).strip().lower().split())


def make_key(qid: str, answer: Any, *, unit: str | None = None, sig: int = 2, options: Iterable[str] | None = None) -> dict:
    """The key entry for one question (used by authors; see `python -m infer.course.checks --help`)."""
    if options is not None:
        options = [_canonical_choice(o) for o in options]
        if _canonical_choice(answer) not in options:
            raise ValueError(f"answer {answer!r} is not among the options {options}")
        return {"kind": "choice", "options": options, "digest": _digest(qid, _canonical_choice(answer))}
    return {"kind": "number", "unit": unit, "sig": sig, "digest": _digest(qid, _canonical_number(float(answer), sig))}


def load_key(qid: str) -> dict:
    week = qid.split(".")[0]
    path = resources.files("infer.course.answer_keys").joinpath(f"{week}.json")
    keys = json.loads(path.read_text()) if path.is_file() else {}
    if qid not in keys:
        raise KeyError(f"No answer key for {qid!r} in infer/course/answer_keys/{week}.json")
    return keys[qid]


def grade_answer(qid: str, answer: Any, key: dict | None = None) -> Verdict:
    key = key or load_key(qid)
    if answer is None or answer is Ellipsis:
        return Verdict(qid, False, "no answer yet (the answer variable is still None)")
    if key["kind"] == "choice":
        return _grade_choice(qid, answer, key)
    return _grade_number(qid, answer, key)


def _grade_choice(qid: str, answer: Any, key: dict) -> Verdict:
    options = ", ".join(repr(o) for o in key["options"])
    if not isinstance(answer, str):
        return Verdict(qid, False, f"expected one of {options} as a string, got {type(answer).__name__} {answer!r}")
    given = _canonical_choice(answer)
    if given not in key["options"]:
        return Verdict(qid, False, f"expected one of {options}, got {answer!r}")
    if _digest(qid, given) != key["digest"]:
        return Verdict(qid, False, f"{answer!r} is not the right choice; reread the section above and try again")
    return Verdict(qid, True)


def _grade_number(qid: str, answer: Any, key: dict) -> Verdict:
    unit = key.get("unit") or "no unit"
    if isinstance(answer, bool) or not _is_number(answer):
        return Verdict(qid, False, f"expected a number in {unit}, got {type(answer).__name__} {answer!r}")
    value = float(answer)
    if not math.isfinite(value):
        return Verdict(qid, False, f"expected a finite number in {unit}, got {value}")
    if _matches(qid, value, key):
        return Verdict(qid, True)
    for other_unit, to_key_unit in UNIT_SLIPS.get(key.get("unit"), []):
        if _matches(qid, value * to_key_unit, key):
            return Verdict(qid, False, f"expected a value in {unit}, got {answer:g} ({other_unit}?)")
    return Verdict(qid, False, f"{answer:g} {unit} is not within 1% of the expected value")


def _is_number(answer: Any) -> bool:
    if isinstance(answer, numbers.Real):
        return True
    # numpy scalars and one-element tensors: accept what converts cleanly to a float.
    return hasattr(answer, "item") and getattr(answer, "ndim", 1) == 0 and isinstance(answer.item(), numbers.Real)


def _matches(qid: str, value: float, key: dict) -> bool:
    return any(_digest(qid, _canonical_number(value * (1 + nudge), key["sig"])) == key["digest"] for nudge in NUMBER_NUDGES)


def check_answer(qid: str, answer: Any) -> None:
    print(grade_answer(qid, answer).line)


# ---------------------------------------------------------------- code checks


@dataclass(frozen=True)
class Case:
    """One input to a code check: `description` names it in the failure message."""

    description: str
    args: tuple
    kwargs: dict | None = None


def grade_function(qid: str, fn: Callable, reference: Callable, cases: Iterable[Case],
                   compare: Callable[[Any, Any], str | None], success: str) -> Verdict:
    """Run `fn` and `reference` on every case; `compare(got, expected)` returns None or what differs."""
    if not callable(fn):
        return Verdict(qid, False, f"expected a function, got {type(fn).__name__}")
    count = 0
    for case in cases:
        count += 1
        kwargs = case.kwargs or {}
        try:
            got = fn(*case.args, **kwargs)
        except NotImplementedError as exc:
            return Verdict(qid, False, f"not implemented yet ({exc})" if str(exc) else "not implemented yet")
        except Exception as exc:  # the student's bug, reported as one line rather than a traceback
            return Verdict(qid, False, f"on {case.description}, raised {type(exc).__name__}: {exc}")
        problem = compare(got, reference(*case.args, **kwargs))
        if problem:
            return Verdict(qid, False, f"on {case.description}, {problem}")
    return Verdict(qid, True, success) if count else Verdict(qid, False, "no test cases were generated")


def check_function(qid: str, fn: Callable, reference: Callable, cases: Iterable[Case],
                   compare: Callable[[Any, Any], str | None], success: str) -> None:
    print(grade_function(qid, fn, reference, cases, compare, success).line)


def same_tokens(got, expected) -> str | None:
    """Compare two token-id sequences (tensors or lists); say where they first differ."""
    got_list, expected_list = _as_id_list(got), _as_id_list(expected)
    if got_list is None:
        return f"expected token ids (a tensor or list of ints), got {type(got).__name__}"
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


def close_to(rel_tol: float = 1e-6, unit: str = "") -> Callable[[Any, Any], str | None]:
    """A comparison for numbers, or tuples of numbers, within a relative tolerance."""

    def compare(got, expected) -> str | None:
        got_items = got if isinstance(got, tuple) else (got,)
        expected_items = expected if isinstance(expected, tuple) else (expected,)
        if len(got_items) != len(expected_items):
            return f"expected {len(expected_items)} values, got {len(got_items)}"
        for index, (g, e) in enumerate(zip(got_items, expected_items)):
            label = f"value {index}" if len(expected_items) > 1 else "the value"
            if g is None or isinstance(g, bool) or not _is_number(g):
                return f"{label}: expected a number{' in ' + unit if unit else ''}, got {type(g).__name__}"
            if not math.isclose(float(g), float(e), rel_tol=rel_tol, abs_tol=1e-12):
                slip = _unit_slip(float(g), float(e), unit)
                return f"{label}: got {float(g):.4g}, expected {float(e):.4g}{slip}"
        return None

    return compare


def _unit_slip(got: float, expected: float, unit: str) -> str:
    for other_unit, to_key_unit in UNIT_SLIPS.get(unit, []):
        if math.isclose(got * to_key_unit, expected, rel_tol=1e-6):
            return f" (in {other_unit}? expected {unit})"
    return ""


# ---------------------------------------------------------------- authoring keys


def add_key(week_file: Path, qid: str, entry: dict) -> None:
    keys = json.loads(week_file.read_text()) if week_file.exists() else {}
    keys[qid] = entry
    week_file.write_text(json.dumps(dict(sorted(keys.items())), indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Add or replace the hashed answer key of one question.")
    parser.add_argument("qid", help="question id, e.g. 01.q3 (the week prefix picks the key file)")
    parser.add_argument("answer", help="the correct answer: a number, or one of --options")
    parser.add_argument("--unit", help="unit of a numeric answer, e.g. ms, GB, FLOP/byte")
    parser.add_argument("--sig", type=int, default=2, help="significant digits compared (default 2)")
    parser.add_argument("--options", nargs="+", help="the allowed choices of a choice question")
    args = parser.parse_args(argv)
    entry = make_key(args.qid, args.answer, unit=args.unit, sig=args.sig, options=args.options)
    week_file = Path(str(resources.files("infer.course.answer_keys"))) / f"{args.qid.split('.')[0]}.json"
    add_key(week_file, args.qid, entry)
    print(f"key for {args.qid} written to {week_file}")


if __name__ == "__main__":
    main()
