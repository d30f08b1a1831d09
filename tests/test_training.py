"""The course trains its own tiny weights (week 10): the corpus is the same text on every run, and a
few steps of training lower the loss on it."""

import math

import torch

from infer.models import load_model
from infer.training import bits_per_byte, learning_rate, stdlib_corpus, train, windows


def test_the_corpus_is_the_standard_library_split_the_same_way_every_time():
    first, second = stdlib_corpus(), stdlib_corpus()
    assert first.sha256 == second.sha256 and first.files > 100
    assert 0.01 < len(first.held_out) / (len(first.train) + len(first.held_out)) < 0.15, "about one file in 20 held out"
    assert b"def " in bytes(first.train[:200_000].tolist())


def test_windows_predict_the_next_byte():
    data = torch.arange(100, dtype=torch.uint8)
    inputs, targets = windows(data, 3, 10, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (3, 10) and torch.equal(inputs[:, 1:], targets[:, :-1])


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    rates = [learning_rate(step, 100, 1.0, 10) for step in range(100)]
    assert rates[0] == 0.1 and rates[9] == 1.0 and math.isclose(rates[-1], 0.1, rel_tol=0.01)


def test_a_few_steps_lower_the_loss():
    model = load_model("tiny", weights="random", quiet=True).model.float()
    data = stdlib_corpus().train[:200_000]
    before = bits_per_byte(model, data, batches=2, batch=4, length=64)
    losses = train(model, data, steps=30, batch=8, length=64, warmup=5, progress=False)
    after = bits_per_byte(model, data, batches=2, batch=4, length=64)
    assert after < before - 1.0, f"30 steps should cut several bits per byte: {before:.2f} -> {after:.2f} bits"
    assert sum(losses[-5:]) < sum(losses[:5])


def test_the_committed_course_weights_load_and_know_python():
    from infer.training import stdlib_corpus

    lm = load_model("tiny", weights="course", quiet=True)
    assert lm.weights == "course"
    bits = bits_per_byte(lm.model.float(), stdlib_corpus().held_out, batches=2, batch=4, length=128)
    assert bits < 4, f"the course's tiny model should predict held-out Python in under 4 bits per byte, got {bits:.2f}"


def test_a_model_the_course_never_trained_is_named():
    import pytest

    with pytest.raises(FileNotFoundError, match="course_weights trains them"):
        load_model("qwen2.5-0.5b", weights="course", quiet=True)
