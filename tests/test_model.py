"""The course's own transformer (infer.model) against `transformers`: same logits, same shapes.

Every comparison runs in float32 on tiny random-weight configs with *all* parameters randomized
(biases and norm weights included: transformers initializes them to 0 and 1, which would hide a
missing bias or a misplaced norm)."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from infer.kv_cache import KVCache
from infer.model import Arch, Transformer, hf_name, plan_runs
from infer.models import MODEL_SPECS
from infer.prompts import random_prompt_ids

# float32 logits of magnitude up to ~10 from differently ordered sums (other kernels, shapes or CPUs):
# relative plus absolute, far above float32 rounding (~1e-6 here) and far below any real bug (~0.1).
LOGIT_TOLERANCE = dict(rtol=1e-4, atol=1e-4)


def randomized(config, seed: int = 0):
    """A transformers model for `config` with every parameter drawn at random (norm weights around 1)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.1 + (1.0 if "norm" in name else 0.0))
    return model


def qwen2_tied_config():
    """Qwen2-style: q/k/v biases, tied embeddings, 4 query heads per KV head, rope theta 1e6."""
    return AutoConfig.for_model(
        "qwen2",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_theta=1e6,
        max_position_embeddings=1024,
    )


def seven_to_one_config():
    """Qwen2.5-0.5B's head layout: 14 query heads sharing 2 KV heads (7 per KV head), head dim 16, untied."""
    return AutoConfig.for_model(
        "qwen2",
        vocab_size=512,
        hidden_size=14 * 16,
        intermediate_size=320,
        num_hidden_layers=2,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        max_position_embeddings=1024,
    )


def llama3_rope_config():
    """Llama 3.2's rope scaling (rope_type "llama3"), shrunk so that the scaled band matters within 100 positions."""
    return AutoConfig.for_model(
        "llama",
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    )


CONFIGS = {
    "tiny (the cpu profile's model)": lambda: MODEL_SPECS["tiny"].config(),
    "qwen2, QKV bias, tied embeddings": qwen2_tied_config,
    "qwen2, 14 heads / 2 KV heads, untied": seven_to_one_config,
    "llama, llama3 rope scaling, attention and MLP biases": llama3_rope_config,
}


def full_prefill_logits(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    cache = KVCache.for_model(model, max_seqs=1, max_len=ids.shape[-1])
    with torch.no_grad():
        return model(ids.reshape(-1), torch.arange(ids.shape[-1]), cache)


@pytest.mark.parametrize("label", list(CONFIGS))
def test_logits_match_transformers(label):
    config = CONFIGS[label]()
    reference = randomized(config)
    ours = Transformer.from_hf(reference)
    ids = random_prompt_ids(config, 100, seed=1)
    with torch.no_grad():
        expected = reference(ids).logits[0]
    got = full_prefill_logits(ours, ids)
    assert got.shape == expected.shape, f"{label}: logits shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
    torch.testing.assert_close(
        got,
        expected,
        **LOGIT_TOLERANCE,
        msg=lambda detail: (
            f"{label}: logits differ from transformers'. {detail}\nCheck in this order: RMSNorm "
            f"(float32, eps inside the sqrt), rotary (rotate_half pairing i with i + d/2), GQA head grouping, biases."
        ),
    )


def test_llama3_rope_frequencies_match_transformers():
    config = MODEL_SPECS["llama-3.2-1b"].config()
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    arch = Arch.from_config(config)
    from infer.model import Rotary

    got = Rotary(arch.head_dim, arch.rope_theta, arch.rope_scaling).inv_freq
    assert torch.allclose(got, expected, rtol=1e-5, atol=0), (
        "llama3-scaled rotary frequencies differ from transformers'"
    )


def test_a_mixed_batch_gives_the_logits_of_each_sequence_run_alone():
    """A prefill chunk of one sequence and decode tokens of two others in ONE forward = each run on its own."""
    config = seven_to_one_config()
    model = Transformer.from_hf(randomized(config))
    prompts = {
        0: random_prompt_ids(config, 40, seed=3)[0],
        1: random_prompt_ids(config, 9, seed=4)[0],
        2: random_prompt_ids(config, 23, seed=5)[0],
    }

    def prefilled_cache():
        """Sequence 0 holds its first 25 tokens; 1 and 2 all but their last token."""
        cache = KVCache.for_model(model, max_seqs=3, max_len=64)
        model(prompts[0][:25], torch.arange(25), cache, torch.zeros(25, dtype=torch.long))
        for s in (1, 2):
            n = len(prompts[s]) - 1
            model(prompts[s][:n], torch.arange(n), cache, torch.full((n,), s))
        return cache

    # One by one: the rest of sequence 0's prompt, then one decode token each for 1 and 2.
    with torch.no_grad():
        alone = prefilled_cache()
        expected = [
            model(prompts[0][25:], torch.arange(25, 40), alone, torch.zeros(15, dtype=torch.long)),
            model(prompts[1][-1:], torch.tensor([8]), alone, torch.tensor([1])),
            model(prompts[2][-1:], torch.tensor([22]), alone, torch.tensor([2])),
        ]

    with torch.no_grad():
        together = prefilled_cache()
        # The mixed step: a decode token of 2, a 15-token prefill chunk of 0, a decode token of 1.
        tokens = torch.cat([prompts[2][-1:], prompts[0][25:], prompts[1][-1:]])
        positions = torch.cat([torch.tensor([22]), torch.arange(25, 40), torch.tensor([8])])
        seq_ids = torch.tensor([2] + [0] * 15 + [1])
        mixed = model(tokens, positions, together, seq_ids)

    for label, got, want in (
        ("sequence 2 (decode)", mixed[:1], expected[2]),
        ("sequence 0 (prefill chunk at 25..39)", mixed[1:16], expected[0]),
        ("sequence 1 (decode)", mixed[16:], expected[1]),
    ):
        torch.testing.assert_close(
            got,
            want,
            **LOGIT_TOLERANCE,
            msg=lambda detail, label=label: f"{label}: mixed-batch logits differ from running it alone. {detail}",
        )


def test_logits_rows_returns_only_the_asked_rows():
    config = MODEL_SPECS["tiny"].config()
    model = Transformer.from_hf(randomized(config))
    ids = random_prompt_ids(config, 12, seed=0)[0]
    full = full_prefill_logits(model, ids)
    with torch.no_grad():
        last = model(ids, torch.arange(12), KVCache.for_model(model, 1, 12), logits_rows=torch.tensor([11]))
    assert last.shape == (1, config.vocab_size)
    torch.testing.assert_close(last, full[11:], **LOGIT_TOLERANCE)  # a one-row matmul rounds unlike the full one


def test_every_transformers_weight_has_a_home():
    for name in ("tiny", "qwen2.5-0.5b", "llama-3.2-1b"):
        config = MODEL_SPECS[name].config()
        with torch.device("meta"):
            reference = AutoModelForCausalLM.from_config(config)
            ours = Transformer(config)
        theirs = {n for n, _ in reference.named_parameters()}
        mapped = {hf_name(n) for n, _ in ours.named_parameters()}
        assert mapped == theirs, (
            f"{name}: unmapped {sorted(theirs - mapped)[:3]}, unknown {sorted(mapped - theirs)[:3]}"
        )


def test_qwen2_has_qkv_bias_and_no_o_bias():
    arch = Arch.from_config(MODEL_SPECS["qwen2.5-1.5b"].config())
    assert arch.qkv_bias and not arch.o_bias and arch.head_dim == 128 and arch.num_kv_heads == 2


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(use_sliding_window=True), "sliding"),
        (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}), "yarn"),
        (dict(model_type="mistral"), "mistral"),
    ],
)
def test_unsupported_configs_are_rejected_with_the_reason(change, message):
    config = qwen2_tied_config()
    for key, value in change.items():
        setattr(config, key, value)
    with pytest.raises(ValueError, match=message):
        Arch.from_config(config)


def test_plan_runs_groups_tokens_and_rejects_a_broken_batch():
    runs = plan_runs(torch.tensor([5, 0, 1, 2, 9]), torch.tensor([1, 0, 0, 0, 3]))
    assert [(r.seq_id, r.row, r.start, r.n) for r in runs] == [(1, 0, 5, 1), (0, 1, 0, 3), (3, 4, 9, 1)]
    with pytest.raises(ValueError, match="consecutive"):
        plan_runs(torch.tensor([0, 2]), None)
    with pytest.raises(ValueError, match="two separate runs"):
        plan_runs(torch.tensor([0, 0, 1]), torch.tensor([0, 1, 0]))


@pytest.mark.parametrize("label", list(CONFIGS))
def test_chunked_prefill_and_decode_steps_match_one_full_pass(label):
    """The cache path: 60 tokens, a 30-token chunk at 60..89, then 10 single decode steps = transformers' one pass."""
    config = CONFIGS[label]()
    reference = randomized(config)
    ours = Transformer.from_hf(reference)
    ids = random_prompt_ids(config, 100, seed=2)[0]
    cache = KVCache.for_model(ours, max_seqs=1, max_len=100)
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
        pieces = [ours(ids[:60], torch.arange(60), cache), ours(ids[60:90], torch.arange(60, 90), cache)]
        pieces += [ours(ids[p : p + 1], torch.tensor([p]), cache) for p in range(90, 100)]
    torch.testing.assert_close(
        torch.cat(pieces),
        expected,
        **LOGIT_TOLERANCE,
        msg=lambda detail: (
            f"{label}: logits through the cache (chunk + decode steps) differ from one full pass. {detail}\n"
            "Check the shifted causal mask of a chunk (query i sees keys 0..start+i) and the rotary positions"
        ),
    )
