"""Linear layers on weights packed once for oneDNN (infer.cpu_linear): the same products as
F.linear, within float32's rounding, and the same model around them."""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from infer.cpu_linear import MIN_PACKED_ROWS, PackedLinear, pack_linears, packing_unavailable_reason
from infer.engine import Engine
from infer.model import Transformer
from infer.serve.settings import EngineSettings, make_engine
from tests.engine_helpers import greedy

# oneDNN sums in another order than F.linear: relative error ~1e-6 of a sum of 256 products of ~1
TOLERANCE = {"rtol": 1e-5, "atol": 1e-4}


@pytest.fixture(scope="module")
def model(tiny):
    return Transformer.from_hf(tiny.model)


@pytest.fixture(scope="module")
def packed(model):
    packed = copy.deepcopy(model)
    pack_linears(packed)
    return packed


@pytest.mark.parametrize("rows", [MIN_PACKED_ROWS, 32, 300])
@pytest.mark.parametrize("bias", [True, False])
def test_a_packed_layer_computes_what_f_linear_does(rows, bias):
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(256, 96, bias=bias)
    x = torch.randn(rows, 256, generator=generator)
    with torch.no_grad():
        torch.testing.assert_close(PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias), **TOLERANCE)


def test_a_small_call_takes_f_linear_exactly():
    linear = nn.Linear(64, 32)
    x = torch.randn(MIN_PACKED_ROWS - 1, 64)
    with torch.no_grad():
        assert torch.equal(PackedLinear(linear)(x), F.linear(x, linear.weight, linear.bias))


def test_packing_keeps_the_model_its_weights_and_its_tied_head(model, packed):
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == linears
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert packed.state_dict().keys() == model.state_dict().keys()
    if model.arch.tie_word_embeddings:
        assert packed.lm_head.weight is packed.embed.weight, "the output head must stay tied to the embedding"


def test_the_engine_keeps_its_greedy_tokens_with_packed_linears(model, packed):
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, model.arch.vocab_size, (n,), generator=generator).tolist() for n in (9, 30, 17, 4)]
    tokens = [
        [r.token_ids for r in Engine(m, max_num_seqs=4, max_model_len=64).generate(prompts, greedy(max_tokens=12))]
        for m in (model, packed)
    ]
    assert tokens[0] == tokens[1]


def test_a_model_that_cannot_be_packed_says_why(model):
    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    assert "float32" in packing_unavailable_reason(bf16)
    with pytest.raises(ValueError, match="float32"):
        pack_linears(bf16)


def test_the_servers_setting_packs_the_engines_model(model):
    copied = copy.deepcopy(model)
    make_engine(copied, EngineSettings(max_num_seqs=2, max_model_len=32, packed_linears=True))
    assert any(isinstance(m, PackedLinear) for m in copied.modules())
