"""Lab 10's checks (infer/course/grading/exercises/week10.py): a right answer passes, and each
plausible mistake, and each lazy answer, fails with a line that says what to fix."""

import math

import torch

from infer.course.grading.exercises.week10 import (
    blocks_after_rollback,
    grade_accept_greedy,
    grade_accept_sampled,
    grade_rollback,
)
from infer.engine.paged_kv_store import PagedKVStore
from infer.engine.sequence import SamplingParams, Sequence
from infer.speculative import accept_greedy


def greedy(guesses, choices):
    kept = []
    for guess, choice in zip(guesses, choices):
        if guess != choice:
            return kept + [choice]
        kept.append(guess)
    return kept + [choices[len(guesses)]]


def sampled(probs, guesses, seed, *, residual=True, accept_all=False):
    generator = torch.Generator().manual_seed(seed)
    kept = []
    for p, guess in zip(probs, guesses):
        if accept_all or torch.rand((), generator=generator, dtype=p.dtype) < p[guess]:
            kept.append(guess)
            continue
        row = p.clone()
        if residual:
            row[guess] = 0
        return kept + [int(torch.multinomial(row, 1, generator=generator))]
    return kept + [int(torch.multinomial(probs[len(guesses)], 1, generator=generator))]


def test_right_answers_pass():
    assert grade_accept_greedy(greedy).ok, grade_accept_greedy(greedy).line
    assert grade_accept_sampled(sampled).ok, grade_accept_sampled(sampled).line
    assert grade_rollback(lambda t, n, b: (t[: math.ceil(n / b)], t[math.ceil(n / b) :])).ok


def test_greedy_mistakes_are_named():
    always = grade_accept_greedy(lambda g, c: list(g) + [c[len(g)]])
    assert not always.ok and "expected [3]" in always.line, always.line
    no_own_token = grade_accept_greedy(lambda g, c: greedy(g, c)[:-1])
    assert not no_own_token.ok and "add the target's own token" in no_own_token.line, no_own_token.line
    library = grade_accept_greedy(accept_greedy)
    assert not library.ok and "the course library's own" in library.line, library.line


def test_a_greedy_rule_wrong_only_in_the_loop_is_caught_there():
    def wrong_on_real_text_only(guesses, choices):  # the cases' token ids are small; real bytes are not
        kept = greedy(guesses, choices)
        if max(choices) > 31 and len(kept) == len(guesses) + 1:
            kept[-1] = 0  # the bonus token replaced
        return kept

    verdict = grade_accept_greedy(wrong_on_real_text_only)
    assert not verdict.ok and "inside the speculative loop" in verdict.line, verdict.line


def test_sampling_mistakes_fail_by_their_distribution():
    from_p = grade_accept_sampled(lambda p, g, s: sampled(p, g, s, residual=False))
    assert not from_p.ok and "never by the guess itself" in from_p.line, from_p.line
    accept_all = grade_accept_sampled(lambda p, g, s: sampled(p, g, s, accept_all=True))
    assert not accept_all.ok and "not distributed as the target's row" in accept_all.line, accept_all.line

    def forgets_the_seed(probs, guesses, seed):
        return sampled(probs, guesses, 0)  # the same draw every time

    assert not grade_accept_sampled(forgets_the_seed).ok


def test_rollback_mistakes_are_named():
    floor = grade_rollback(lambda t, n, b: (t[: n // b], t[n // b :]))
    assert not floor.ok and "one into the last block" in floor.line, floor.line


def test_the_rollback_reference_is_the_paged_stores():
    store = PagedKVStore(num_blocks=8, block_size=4)
    seq = Sequence("r", list(range(5)), SamplingParams(max_tokens=20), arrival_time=0.0)
    store.allocate(seq, 5)
    table = list(seq.block_table)
    seq.num_computed_tokens = 5
    store.append(seq, 6)  # room for 6 more (guesses): up to position 10, three blocks
    grown = list(seq.block_table)
    seq.num_computed_tokens = 6  # one guess kept
    store.roll_back(seq)
    kept, freed = blocks_after_rollback(grown, 6, 4)
    assert len(grown) == 3 and table == grown[:2], "the guesses' room took one more block"
    assert seq.block_table == kept == grown[:2] and freed == grown[2:], (
        f"the store kept {seq.block_table}; the check's reference keeps {kept} and frees {freed}"
    )


def test_the_token_after_every_kept_guess_is_checked():
    def no_bonus(probs, guesses, seed):
        kept = sampled(probs, guesses, seed)
        return kept[:-1] if kept[:-1] == list(guesses) else kept  # every guess kept: the last row's draw left out

    verdict = grade_accept_sampled(no_bonus)
    assert not verdict.ok and "the last token kept is a guess" in verdict.line, verdict.line

    def bonus_from_the_first_row(probs, guesses, seed):
        kept = sampled(probs, guesses, seed)
        if kept[:-1] == list(guesses):
            generator = torch.Generator().manual_seed(seed + 1)
            kept[-1] = int(torch.multinomial(probs[0], 1, generator=generator))
        return kept

    verdict = grade_accept_sampled(bonus_from_the_first_row)
    assert not verdict.ok and "the token after both guesses" in verdict.line, verdict.line


def test_one_draw_from_the_first_row_alone_is_named():
    def first_row_only(probs, guesses, seed):
        return [int(torch.multinomial(probs[0], 1, generator=torch.Generator().manual_seed(seed)))]

    verdict = grade_accept_sampled(first_row_only)
    assert not verdict.ok and "the last token kept is a guess" in verdict.line, verdict.line


def test_part_a_names_a_percent_given_for_a_fraction():
    from infer.course.grading.checks import grade_answer

    assert "(percent?)" in grade_answer("10.q2", 23.3).line
    assert grade_answer("10.q2", 0.233).ok
