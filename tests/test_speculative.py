"""Speculative decoding's reference loop (week 10): whatever the proposer guesses, the output is the
target's own greedy output; what changes is how many target passes it takes."""

import pytest
import torch

from infer.generate import cached_greedy_generate
from infer.kv_cache import KVCache
from infer.model import Transformer
from infer.models import load_model
from infer.speculative import DraftProposer, NgramProposer, speculative_greedy_generate

PROMPT = [ord(c) for c in "def add(a, b):\n    return a + b\n\n\ndef add("]


@pytest.fixture(scope="module")
def target(tiny):
    return Transformer.from_hf(tiny.model).float()


def greedy(model, prompt, n):
    cache = KVCache.for_model(model, 1, len(prompt) + n)
    return cached_greedy_generate(model, torch.tensor(prompt), n, cache)[0].tolist()


class Always:
    """A proposer that guesses `guess(tokens)` for every position: always right or always wrong."""

    def __init__(self, guess):
        self.guess = guess

    def propose(self, tokens, k):
        return self.guess(tokens, k)


@pytest.mark.parametrize("k", [0, 1, 3, 5])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 17])
def test_ngram_speculation_is_the_targets_greedy_output(target, k, max_new_tokens):
    got, stats = speculative_greedy_generate(target, PROMPT, max_new_tokens, NgramProposer(), k)
    assert got == greedy(target, PROMPT, max_new_tokens), "speculation must never change a greedy token"
    assert len(got) == max_new_tokens and stats.proposed <= k * stats.target_passes


def test_a_draft_model_is_verified_to_the_same_tokens(target):
    draft = Transformer.from_hf(load_model("tiny-draft", weights="random", seed=3, quiet=True).model).float()
    got, stats = speculative_greedy_generate(target, PROMPT, 20, DraftProposer(draft, 128), 4)
    assert got == greedy(target, PROMPT, 20)
    assert stats.proposed > 0


def test_a_draft_that_is_always_right_gives_k_plus_one_tokens_a_pass(target):
    n, k = 24, 3
    truth = greedy(target, PROMPT, n)
    right = Always(lambda tokens, k: truth[len(tokens) - len(PROMPT) :][:k])
    got, stats = speculative_greedy_generate(target, PROMPT, n, right, k)
    assert got == truth and stats.acceptance_rate == 1.0
    assert stats.target_passes == -(-n // (k + 1)), "every pass keeps all k guesses and adds its own token"


def test_a_draft_that_is_always_wrong_costs_one_pass_a_token(target):
    n = 10
    truth = greedy(target, PROMPT, n)
    wrong = Always(lambda tokens, k: [(truth[len(tokens) - len(PROMPT)] + 1) % 256] * k)
    got, stats = speculative_greedy_generate(target, PROMPT, n, wrong, 4)
    assert got == truth and stats.accepted == 0 and stats.target_passes == n


def test_ngram_lookup_proposes_what_followed_the_latest_match():
    proposer = NgramProposer(max_n=2)
    assert proposer.propose([1, 2, 3, 9, 1, 2, 4, 5, 1, 2], 2) == [4, 5]  # the latest "1 2" was followed by 4 5
    assert proposer.propose([7, 8, 9], 3) == []  # nothing repeats
    with pytest.raises(ValueError):
        NgramProposer(max_n=1, min_n=2)


def test_the_textbook_yield_of_a_verifying_step():
    from infer.experiments.speculation_batch import expected_tokens_per_step

    assert expected_tokens_per_step(0.0, 3) == 1.0, "every guess rejected: the target's own token only"
    assert expected_tokens_per_step(1.0, 3) == 4.0, "every guess accepted: k guesses and one more"
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)


def test_shuffled_prompts_keep_their_bytes_and_lose_their_order():
    from infer.experiments.speculation_batch import shuffled

    prompts = [list(range(50)), [7] * 5 + [9] * 5]
    mixed = shuffled(prompts)
    assert [sorted(p) for p in mixed] == [sorted(p) for p in prompts]
    assert mixed[0] != prompts[0], "a 50-byte prompt came back in its own order"


def test_a_roofline_predicts_speculation_free_when_memory_bound_and_k_plus_1_times_dearer_when_compute_bound():
    from infer.experiments.speculation_batch import K, Roof, roofline_speedups
    from infer.models import MODEL_SPECS

    config = MODEL_SPECS["tiny"].config()
    memory_bound = roofline_speedups(config, 4, Roof(peak_flops=1e18, bandwidth=1e9), 0.0, tokens_per_step=3.0)
    assert all(r["verifying_step_bound_by"] == "memory" for r in memory_bound)
    assert memory_bound[0]["speedup"] == pytest.approx(3.0, rel=0.05), (
        "a memory-bound verifying step moves about the bytes of a plain one: the speed-up is the tokens a step"
    )
    compute_bound = roofline_speedups(config, 4, Roof(peak_flops=1e6, bandwidth=1e18), 0.0, tokens_per_step=3.0)
    assert compute_bound[-1]["speedup"] == pytest.approx(3.0 / (K + 1), rel=0.1), (
        "a compute-bound verifying step does K + 1 times the arithmetic of a plain one"
    )


def test_the_course_side_of_the_vllm_comparison_speculates_without_changing_a_token(tiny):
    from infer.experiments.speculation_vs_vllm import course_run

    model = Transformer.from_hf(tiny.model)
    prompts = [[5, 6, 7, 5, 6, 7, 5, 6], [9, 10, 11, 12]]
    plain, ngram = course_run(model, prompts, False), course_run(model, prompts, True)
    assert ngram["tokens"] == plain["tokens"], "prompt lookup changed a greedy token"
    assert plain["drafted"] == 0 and 0 <= ngram["accepted"] <= ngram["drafted"]
    assert all(len(t) == 64 for t in plain["tokens"]) and plain["ms_per_token"] > 0
