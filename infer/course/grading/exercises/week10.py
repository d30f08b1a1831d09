"""Lab 10 code checks: the verification step of speculative decoding, and the rollback of a paged KV cache.

- `check_accept_greedy(accept_guesses_greedy)`: the tokens a greedy target keeps, from its guesses
  and its own choices, on random cases and on the edges (no guesses, all right, the first wrong);
  then, plugged into the reference loop (`infer.speculative.speculative_greedy_generate`) on the
  course's trained weights with prompt lookup, its output must be the target's plain greedy output.
  Always accepting, or stopping before the target's own token, fails both.
- `check_accept_sampled(accept_guesses_sampled)`: rejection sampling, judged by its distribution.
  Thousands of draws (each with its own seed) on a fixed case: the first kept token must be
  distributed as the target's first row; when it is the first guess, the second as the target's
  second row; and when both guesses are kept, the token after them as the last row. Each by a
  chi-square statistic against the exact distribution, with a bound a right answer exceeds once in
  about 10,000 runs; always accepting lands far above it. A last token that is a guess (one kept
  with nothing after it, or a rejected one drawn again) is named at once.
- `check_rollback(blocks_after_rollback)`: the blocks a sequence keeps once rejected guesses are
  rolled back to `num_tokens` computed tokens, and those it gives back.

At grading the library code that computes the answers (HIDDEN_AT_GRADING) is not in the student's kernel.
"""

import random
from collections import Counter

import torch

from infer.course.grading.checks import Case, Verdict, case_rngs, grade_function, library_verdict
from infer.profiles import PROFILES
from infer.speculative import NgramProposer, accept_greedy, accept_sampled, speculative_greedy_generate

GREEDY_QID, SAMPLED_QID, ROLLBACK_QID = "10.lab.accept_greedy", "10.lab.accept_sampled", "10.lab.rollback"
DRAWS = 4000
# chi-square bounds at p = 1e-4 for the degrees of freedom used below (a right answer fails once in
# about 10,000 runs; the seeds are fixed, so a given answer passes or fails the same way every time)
CHI2_BOUND = {5: 25.74}
SAMPLED_PROBS = (  # a target's rows after the newest token and after each of two guesses (vocabulary of 6)
    (0.30, 0.25, 0.20, 0.10, 0.10, 0.05),
    (0.05, 0.40, 0.15, 0.15, 0.15, 0.10),
    (0.20, 0.10, 0.30, 0.10, 0.10, 0.20),
)
SAMPLED_GUESSES = (0, 1)
# byte-level prompts for the course's weights: the first repeats itself, so prompt lookup has guesses to make
LOOP_PROMPTS = (
    list(b"def total(values):\n    total = 0\n    for value in values:\n        total"),
    list(b"import os\n"),
)


def blocks_after_rollback(block_table: list[int], num_tokens: int, block_size: int) -> tuple[list[int], list[int]]:
    """The blocks a sequence keeps for its first `num_tokens` positions, and the rest, to free."""
    keep = -(-num_tokens // block_size)
    return block_table[:keep], block_table[keep:]


def _plain_greedy(target, prompt: list[int], new_tokens: int) -> list[int]:
    return speculative_greedy_generate(target, prompt, new_tokens, NgramProposer(), 0)[0]


# What the lab's kernel lacks at grading (see kernel_library): the library code that computes the answers.
HIDDEN_AT_GRADING = (accept_greedy, accept_sampled, speculative_greedy_generate, blocks_after_rollback)


# ---------------------------------------------------------------- greedy verification


def _kept_problem(got, expected) -> str | None:
    if not isinstance(got, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in got):
        return f"expected a list of token ids (ints), got {got!r}"
    if list(got) == expected:
        return None
    if len(got) == len(expected) - 1 and list(got) == expected[:-1]:
        return f"kept {list(got)}, expected {expected}: add the target's own token after the accepted guesses"
    return f"kept {list(got)}, expected {expected}"


def _greedy_cases(rng: random.Random, count: int) -> list[Case]:
    cases = [
        Case("no guesses at all (choices [7])", ([], [7])),
        Case("every guess right (guesses [4, 5, 6], choices [4, 5, 6, 9])", ([4, 5, 6], [4, 5, 6, 9])),
        Case("the first guess wrong (guesses [4, 5, 6], choices [3, 5, 6, 9])", ([4, 5, 6], [3, 5, 6, 9])),
        Case(
            "a later guess right after a wrong one (guesses [1, 2, 3], choices [1, 8, 3, 4])", ([1, 2, 3], [1, 8, 3, 4])
        ),
    ]
    for _ in range(count):
        k = rng.randint(1, 6)
        choices = [rng.randrange(8) for _ in range(k + 1)]
        agree = rng.randint(0, k)
        guesses = choices[:agree] + [(c + 1 + rng.randrange(7)) % 8 for c in choices[agree:k]]
        cases.append(Case(f"guesses {guesses}, choices {choices}", (guesses, choices)))
    return cases


def grade_accept_greedy(accept_guesses_greedy, cases: int = 12) -> Verdict:
    qid = GREEDY_QID
    examples = [case for rng in case_rngs(qid) for case in _greedy_cases(rng, cases)]
    verdict = grade_function(
        qid,
        accept_guesses_greedy,
        lambda guesses, choices: accept_greedy(list(guesses), list(choices)),
        examples,
        _kept_problem,
        "",
    )
    if not verdict.ok:
        return verdict
    return _in_the_loop(accept_guesses_greedy)


def _in_the_loop(accept_guesses_greedy) -> Verdict:
    """The student's rule inside the reference loop, on the course's trained weights: the output must
    be plain greedy decoding's, whatever the guesses were."""
    from infer.model import Transformer
    from infer.models import load_model

    target = Transformer.from_hf(load_model("tiny", profile=PROFILES["cpu"], weights="course", quiet=True).model)
    prompts = [
        list(b"def total(values):\n    total = 0\n    for value in values:\n        total"),
        list(b"import os\n"),
    ]
    for prompt in prompts:
        plain = _plain_greedy(target, prompt, 24)
        try:
            got, stats = speculative_greedy_generate(
                target, prompt, 24, NgramProposer(), 3, accept=lambda g, c: list(accept_guesses_greedy(g, c))
            )
        except Exception as exc:  # the student's function, failing inside the loop
            return Verdict(GREEDY_QID, False, f"inside the speculative loop, raised {type(exc).__name__}: {exc}")
        if got != plain:
            first = next((i for i, (a, b) in enumerate(zip(got, plain)) if a != b), min(len(got), len(plain)))
            return Verdict(
                GREEDY_QID,
                False,
                f"inside the speculative loop on the course's weights, the output parts from plain greedy decoding "
                f"at token {first}: speculation must never change a greedy output",
            )
    return Verdict(
        GREEDY_QID,
        True,
        f"keeps the right tokens on the edge cases and random ones, and inside the speculative loop its output is "
        f"plain greedy decoding's ({stats.accepted} of {stats.proposed} guesses kept on the last prompt)",
    )


def check_accept_greedy(accept_guesses_greedy, cases: int = 12) -> None:
    print(grade_accept_greedy(accept_guesses_greedy, cases).line)


# ---------------------------------------------------------------- rejection sampling


def _chi_square(counts: Counter, probs: list[float]) -> float:
    total = sum(counts.values())
    return sum((counts.get(token, 0) - total * p) ** 2 / (total * p) for token, p in enumerate(probs))


def grade_accept_sampled(accept_guesses_sampled, draws: int = DRAWS) -> Verdict:
    qid = SAMPLED_QID
    if not callable(accept_guesses_sampled):
        return Verdict(qid, False, f"expected a function, got {type(accept_guesses_sampled).__name__}")
    borrowed = library_verdict(qid, accept_guesses_sampled)
    if borrowed:
        return borrowed
    probs = torch.tensor(SAMPLED_PROBS, dtype=torch.float64, device="cpu")
    guesses = list(SAMPLED_GUESSES)
    base = case_rngs(qid)[-1].randrange(2**31)  # at grading, seeds no student saw
    first, second, bonus = Counter(), Counter(), Counter()
    for draw in range(draws):
        try:
            kept = accept_guesses_sampled(probs.clone(), list(guesses), base + draw)
        except Exception as exc:  # the student's bug, reported as one line
            if isinstance(exc, NotImplementedError):
                return Verdict(qid, False, "not implemented yet")
            return Verdict(qid, False, f"with guesses {guesses}, raised {type(exc).__name__}: {exc}")
        problem = _sampled_shape_problem(kept, guesses)
        if problem:
            return Verdict(qid, False, problem)
        first[kept[0]] += 1
        if kept[0] == guesses[0]:
            second[kept[1]] += 1
        if kept[:2] == guesses:
            bonus[kept[2]] += 1
    tests = (
        ("the first token kept", first, SAMPLED_PROBS[0]),
        ("the second token kept, when the first is the first guess", second, SAMPLED_PROBS[1]),
        ("the token after both guesses, when both are kept", bonus, SAMPLED_PROBS[2]),
    )
    for what, counts, p in tests:
        statistic, bound = _chi_square(counts, p), CHI2_BOUND[len(p) - 1]
        if not statistic <= bound:
            shares = ", ".join(f"{t}: {counts.get(t, 0) / max(1, sum(counts.values())):.2f}" for t in range(len(p)))
            return Verdict(
                qid,
                False,
                f"{what} is not distributed as the target's row {[round(x, 2) for x in p]}: over "
                f"{sum(counts.values())} draws its shares were {shares} (chi-square {statistic:.1f}, bound {bound}). "
                "Accept a guess with probability p(guess); after a rejection draw from p without the guess",
            )
    return Verdict(
        qid,
        True,
        f"over {draws} seeded draws, the first and second tokens kept, and the one after both guesses, are "
        f"distributed as the target's rows (chi-square within the bound)",
    )


def _sampled_shape_problem(kept, guesses: list[int]) -> str | None:
    if not isinstance(kept, (list, tuple)) or not kept or not all(isinstance(t, int) for t in kept):
        return f"expected a non-empty list of token ids (ints), got {kept!r}"
    if len(kept) > len(guesses) + 1:
        return f"kept {list(kept)}: at most {len(guesses) + 1} tokens (the guesses and one of the target's own)"
    accepted = len(kept) - 1
    if list(kept[:accepted]) != guesses[:accepted]:
        return f"kept {list(kept)} with guesses {guesses}: every token before the last must be an accepted guess"
    if len(kept) <= len(guesses) and kept[-1] == guesses[len(kept) - 1]:
        return (
            f"kept {list(kept)} with guesses {guesses}: the last token kept is a guess. A kept guess is followed by "
            "the next guess or, after the last one, a token drawn from the last row; a rejected guess is replaced "
            "by a draw from p with that guess taken out, never by the guess itself"
        )
    return None


def check_accept_sampled(accept_guesses_sampled, draws: int = DRAWS) -> None:
    print(grade_accept_sampled(accept_guesses_sampled, draws).line)


# ---------------------------------------------------------------- rollback


def _rollback_cases(rng: random.Random, count: int) -> list[Case]:
    cases = [
        Case("3 blocks of 4, 8 tokens (an exact multiple)", ([5, 9, 2], 8, 4)),
        Case("3 blocks of 4, 9 tokens (one into the last block)", ([5, 9, 2], 9, 4)),
        Case("2 blocks of 16, 16 tokens", ([3, 1], 16, 16)),
    ]
    for _ in range(count):
        size = rng.choice([2, 4, 16])
        blocks = rng.sample(range(100), rng.randint(1, 6))
        cases.append(Case(f"table {blocks}, blocks of {size}", (blocks, rng.randint(1, len(blocks) * size), size)))
    return cases


def _rollback_problem(got, expected) -> str | None:
    if not isinstance(got, (list, tuple)) or len(got) != 2:
        return f"expected (kept blocks, freed blocks), got {got!r}"
    kept, freed = (list(part) if isinstance(part, (list, tuple)) else part for part in got)
    if (kept, freed) == (list(expected[0]), list(expected[1])):
        return None
    return f"got kept {kept}, freed {freed}; expected kept {expected[0]}, freed {expected[1]}"


def grade_rollback(blocks_after_rollback_fn, cases: int = 10) -> Verdict:
    qid = ROLLBACK_QID
    examples = [case for rng in case_rngs(qid) for case in _rollback_cases(rng, cases)]
    return grade_function(
        qid,
        blocks_after_rollback_fn,
        lambda table, num_tokens, size: blocks_after_rollback(list(table), num_tokens, size),
        examples,
        _rollback_problem,
        f"keeps and frees the right blocks on {cases + 3} tables",
    )


def check_rollback(blocks_after_rollback_fn, cases: int = 10) -> None:
    print(grade_rollback(blocks_after_rollback_fn, cases).line)
