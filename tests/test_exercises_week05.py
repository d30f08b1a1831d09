"""Lab 05 checks: the reference passes, the library's own admission fails (even in a partial), and
each shortcut or broken rule fails with the message that names it."""

import functools

import numpy as np
import pytest
import torch

from infer.course.grading.checks import GRADING_SALT_ENV, grade_answer
from infer.course.grading.exercises import week05
from infer.course.grading.exercises.week05 import KNOWN_MISTAKES, grade_admission, grade_step_forward
from infer.engine import Engine
from infer.engine.model_runner import ModelRunner, flatten, step_runs
from infer.engine.scheduler import admit_continuous, admit_static, chunked_token_counts
from infer.model import Transformer


def written_admit(lens, num_running, max_num_seqs, budget):
    taken = 0
    for length in lens:
        if taken == max_num_seqs - num_running or length > budget:
            break
        budget -= length
        taken += 1
    return taken


def test_admission_reference_passes_and_library_is_refused():
    assert grade_admission(written_admit).ok
    verdict = grade_admission(admit_continuous)
    assert not verdict.ok and "library's own" in verdict.reason


@pytest.mark.parametrize("mistake, reason", KNOWN_MISTAKES, ids=[m.__name__ for m, _ in KNOWN_MISTAKES])
def test_each_admission_shortcut_is_named(mistake, reason):
    verdict = grade_admission(lambda *args: mistake(*args))
    assert not verdict.ok and reason in verdict.reason


def flat_step(model, cache, work, all_rows=False):
    tokens, positions, slots, rows = [], [], [], []
    for item in work:
        tokens += item.seq.token_ids(item.start, item.start + item.num_tokens)
        positions += range(item.start, item.start + item.num_tokens)
        slots += [item.seq.slot] * item.num_tokens
        if item.samples:
            rows.append(len(tokens) - 1)
    logits = model(
        torch.tensor(tokens),
        torch.tensor(positions),
        cache,
        torch.tensor(slots),
        logits_rows=None if all_rows else torch.tensor(rows, dtype=torch.long),
    )
    return (logits[rows] if all_rows else logits).argmax(-1).tolist()


def per_sequence_step(model, cache, work):
    out = []
    for item in work:
        stop = item.start + item.num_tokens
        logits = model(
            torch.tensor(item.seq.token_ids(item.start, stop)),
            torch.arange(item.start, stop),
            cache,
            torch.full((item.num_tokens,), item.seq.slot),
            logits_rows=torch.tensor([item.num_tokens - 1]),
        )
        if item.samples:
            out.append(int(logits.argmax()))
    return out


def test_step_forward_checks(tiny):
    model = Transformer.from_hf(tiny.model)
    assert grade_step_forward(flat_step, model).ok
    looped = grade_step_forward(per_sequence_step, model)
    assert not looped.ok and "a step is ONE forward" in looped.reason
    every_row = grade_step_forward(lambda m, c, w: flat_step(m, c, w, all_rows=True), model)
    assert not every_row.ok and "pass logits_rows" in every_row.reason


# ---------------------------------------------------------------- issue 18: what the kernel lacks, every rule


def test_the_kernel_lacks_every_library_function_and_class_that_answers():
    assert set(week05.HIDDEN_AT_GRADING) == {
        admit_continuous,
        admit_static,
        chunked_token_counts,
        flatten,
        step_runs,
        ModelRunner,
        Engine,
    }


def test_the_library_admission_fails_even_in_a_partial():
    line = grade_admission(functools.partial(admit_continuous)).line
    assert "course library's own infer.engine.scheduler.admit_continuous, imported rather than written" in line, line


def test_a_step_returning_a_token_for_every_item_fails_naming_the_rule(tiny):
    def every_item(model, cache, work):
        tokens = flat_step(model, cache, work)
        return tokens + [0] * (len(work) - len(tokens))

    verdict = grade_step_forward(every_item, Transformer.from_hf(tiny.model))
    assert not verdict.ok and "with chunked prefill, budget 10" in verdict.reason, verdict.line
    assert "a prompt chunk with more of its prompt to come, which gives none" in verdict.reason


def test_a_step_that_puts_every_item_at_position_zero_fails(tiny):
    def from_zero(model, cache, work):
        tokens, positions, slots, rows = [], [], [], []
        for item in work:
            tokens += item.seq.token_ids(item.start, item.start + item.num_tokens)
            positions += range(item.num_tokens)  # as if every item started its sequence
            slots += [item.seq.slot] * item.num_tokens
            if item.samples:
                rows.append(len(tokens) - 1)
        logits = model(
            torch.tensor(tokens),
            torch.tensor(positions),
            cache,
            torch.tensor(slots),
            logits_rows=torch.tensor(rows, dtype=torch.long),
        )
        return logits.argmax(-1).tolist()

    verdict = grade_step_forward(from_zero, Transformer.from_hf(tiny.model))
    assert not verdict.ok, verdict.line


@pytest.mark.parametrize(
    "answer, message",
    [
        (lambda n: [n], "returned a list ([2]): return how many waiting requests join, a whole number"),
        (lambda n: float(n), "returned a float (2.0): return how many waiting requests join"),
        (lambda n: -1, "returned -1: a count of waiting requests lies between 0 and the 3 waiting"),
    ],
    ids=["list", "float", "negative"],
)
def test_an_admission_returning_no_count_is_told_so(answer, message):
    verdict = grade_admission(lambda *args: answer(written_admit(*args)))
    assert not verdict.ok and message in verdict.reason and "slice" not in verdict.reason, verdict.line


@pytest.mark.parametrize("as_count", [np.int64, np.int32, functools.partial(torch.tensor, dtype=torch.long)])
def test_numpy_and_torch_integers_are_counts(as_count):
    assert grade_admission(lambda *args: as_count(written_admit(*args))).ok


def test_an_exact_fit_and_exactly_the_free_slots_are_cases():
    descriptions = [d for d, *_ in week05.admission_traces(week05.case_rngs(week05.ADMISSION_QID)[0])]
    assert any("an exact fit" in d for d in descriptions) and any("exactly the free slots" in d for d in descriptions)


def test_a_rejected_number_shows_the_digits_that_set_it_apart():
    line = grade_answer("05.q4", 4.0400001).line
    assert "4.0400001 s is not within 1%" in line, line
    assert grade_answer("05.q4", 4.04).ok and grade_answer("05.q4", 3.96).ok


def test_a_hard_coded_admission_passes_at_home_and_fails_at_grading(monkeypatch):
    monkeypatch.delenv(GRADING_SALT_ENV, raising=False)
    seen = {}

    def recorder(lens, running, seqs, budget):
        seen[tuple(lens), running, seqs, budget] = written_admit(lens, running, seqs, budget)
        return seen[tuple(lens), running, seqs, budget]

    assert grade_admission(recorder).ok
    table = dict(seen)

    def hard_coded(lens, running, seqs, budget):
        return table.get((tuple(lens), running, seqs, budget), 0)

    assert grade_admission(hard_coded).ok
    monkeypatch.setenv(GRADING_SALT_ENV, "a grading run")
    verdict = grade_admission(hard_coded)
    assert not verdict.ok and "random trace" in verdict.reason, verdict.line
