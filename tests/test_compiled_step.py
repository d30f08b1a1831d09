"""Week 09's compiled step: compiling the norms and MLPs changes no token, and the experiment
reports its timings in the shape the results file promises (never an absolute time: CPUs differ)."""

import torch

from infer.experiments import compiled_step
from infer.model import MLP, RMSNorm, Transformer


def test_compiled_norms_and_mlps_give_the_eager_engines_tokens(tiny, monkeypatch):
    monkeypatch.setattr(compiled_step, "BATCH", 3)
    monkeypatch.setattr(compiled_step, "CONTEXT", 12)
    monkeypatch.setattr(compiled_step, "STEPS", 2)
    monkeypatch.setattr(compiled_step, "WARMUP_STEPS", 3)
    model = Transformer.from_hf(tiny.model)
    case = compiled_step.eager_against_compiled(model, "paged", rounds=1)
    assert case["same_greedy_tokens"], "the compiled engine's greedy tokens differ from the eager engine's"
    assert case["ratio_compiled_over_eager"] > 0 and set(case["decode_step_ms"]) == {"eager", "compiled"}


def test_only_a_copy_is_compiled(tiny):
    model = Transformer.from_hf(tiny.model)
    copied = compiled_step.compiled(model)
    compiled_forwards = [m for m in copied.modules() if isinstance(m, (RMSNorm, MLP)) and "forward" in vars(m)]
    assert compiled_forwards and not any("forward" in vars(m) for m in model.modules()), "the eager model is untouched"
    assert torch.equal(copied.embed.weight, model.embed.weight)
