import time

import pytest
import torch

from infer import models
from infer.models import MODEL_SPECS, ModelSpec, load_model
from infer.prompts import random_prompt_ids


def test_every_shipped_config_builds():
    for name, spec in MODEL_SPECS.items():
        config = spec.config()
        assert config.vocab_size > 256, f"{name}: vocabulary too small for the byte tokenizer"


def test_qwen_configs_have_published_shapes():
    small, large = MODEL_SPECS["qwen2.5-0.5b"].config(), MODEL_SPECS["qwen2.5-1.5b"].config()
    assert (small.num_attention_heads, small.num_key_value_heads, small.hidden_size) == (14, 2, 896)
    assert (large.num_attention_heads, large.num_key_value_heads, large.hidden_size, large.num_hidden_layers) == (
        12,
        2,
        1536,
        28,
    )


def test_unknown_model_lists_valid_names():
    with pytest.raises(ValueError, match="valid names: tiny, tiny-draft, qwen2.5-0.5b"):
        load_model("gpt-5")


def test_tiny_loads_random_and_prints_header(capsys):
    loaded = load_model("tiny")
    header = capsys.readouterr().out.strip()
    assert loaded.weights == "random"
    for part in ("device: cpu", "model: tiny", "weights: random", "dtype: float32", "profile: cpu"):
        assert part in header, f"the header line must state {part!r}; got: {header}"
    assert 1e6 < loaded.num_parameters < 1e7, "the cpu profile's model should have a few million parameters"


def test_random_weights_are_seeded():
    a = load_model("tiny", quiet=True, seed=1).model
    b = load_model("tiny", quiet=True, seed=1).model
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_offline_fallback_is_quick_and_never_probes_the_network(monkeypatch):
    monkeypatch.setitem(MODEL_SPECS, "tiny-hub", ModelSpec("tiny", "example/not-cached"))
    monkeypatch.setattr(models, "_hub_reachable", lambda: pytest.fail("probed the network despite HF_HUB_OFFLINE=1"))
    started = time.perf_counter()
    loaded = load_model("tiny-hub", quiet=True)
    assert loaded.weights == "random" and "HF_HUB_OFFLINE" in loaded.weights_note
    assert time.perf_counter() - started < 30


def test_pretrained_required_but_unavailable_says_why():
    with pytest.raises(RuntimeError, match="no pretrained checkpoint"):
        load_model("tiny", weights="pretrained", quiet=True)


def test_local_path_loads_pretrained(tmp_path, tiny):
    tiny.model.save_pretrained(tmp_path)
    tiny.tokenizer.save_pretrained(tmp_path)
    loaded = load_model("tiny", local_path=tmp_path, quiet=True)
    assert loaded.weights == "pretrained"
    ids = random_prompt_ids(loaded.config, 8)
    assert torch.equal(loaded.model(ids).logits, tiny.model(ids).logits)


def test_local_path_without_config_is_rejected(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_model("tiny", local_path=tmp_path, quiet=True)


def test_offline_tokenizer_round_trips_text(tiny):
    text = "Prefill, then decode: 안녕하세요 ✓"
    ids = tiny.tokenizer(text)["input_ids"]
    assert tiny.tokenizer.decode(ids) == text
    assert tiny.tokenizer.decode([300]) == "<|id:300|>"
    assert tiny.tokenizer.eos_token_id == tiny.config.eos_token_id


def test_prompts_have_exact_length_no_special_tokens_and_are_seeded(tiny):
    ids = random_prompt_ids(tiny.config, 137, batch=3, seed=7)
    assert ids.shape == (3, 137)
    specials = {tiny.config.bos_token_id, tiny.config.eos_token_id, tiny.config.pad_token_id}
    assert not any(int(i) in specials for i in ids.flatten())
    assert torch.equal(ids, random_prompt_ids(tiny.config, 137, batch=3, seed=7))
    assert not torch.equal(ids, random_prompt_ids(tiny.config, 137, batch=3, seed=8))
    with pytest.raises(ValueError, match="length and batch must be >= 1"):
        random_prompt_ids(tiny.config, 0)


def test_infer_weights_chooses_the_weights_of_every_load(monkeypatch):
    """make gpu-check picks its weights once, for every notebook, through $INFER_WEIGHTS."""
    monkeypatch.setenv("INFER_WEIGHTS", "random")
    monkeypatch.setitem(MODEL_SPECS, "tiny-hub", ModelSpec("tiny", "example/on-the-hub"))
    monkeypatch.setattr(models, "_pretrained_source", lambda *a: pytest.fail("looked for pretrained weights"))
    loaded = load_model("tiny-hub", quiet=True)
    assert loaded.weights == "random" and "$INFER_WEIGHTS asks for random weights" in loaded.weights_note
    monkeypatch.setenv("INFER_WEIGHTS", "downloaded")
    with pytest.raises(ValueError, match=r"not 'downloaded' \(\$INFER_WEIGHTS asks for it\)"):
        load_model("tiny", quiet=True)
