"""Lab 05 checks: the reference passes, and each shortcut fails with the message that names it."""

import pytest
import torch

from infer.course.exercises.week05 import KNOWN_MISTAKES, grade_admission, grade_step_forward
from infer.engine.model_runner import flatten
from infer.engine.scheduler import admit_continuous
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


def test_a_wrapper_around_the_library_admission_is_refused():
    verdict = grade_admission(lambda *args: admit_continuous(*args))
    assert not verdict.ok and "calls the course library's own infer.engine.scheduler.admit_continuous" in verdict.reason


def test_a_step_that_borrows_the_library_flatten_is_refused(tiny):
    def borrowed_step(model, cache, work):
        batch = flatten(work, "cpu")
        return model(batch.token_ids, batch.positions, cache, batch.seq_ids, logits_rows=batch.logits_rows).argmax(-1)

    verdict = grade_step_forward(borrowed_step, Transformer.from_hf(tiny.model))
    assert not verdict.ok and "infer.engine.model_runner.flatten" in verdict.reason
