"""factory.grow_layers: a deeper copy that starts as the same function, then trains."""
import pytest
import torch

from fourfold.models.factory import grow_layers, llama_config, random_causal_lm
from fourfold.models.loading import load_sequence_scorer
from fourfold.models.roles import ScalarModel


@pytest.fixture(scope="module")
def small():
    return random_causal_lm(llama_config(50, hidden=32, layers=2, heads=4, max_positions=32), seed=0).eval()


def test_grown_model_computes_the_same_function(small):
    grown = grow_layers(small, 2, seed=1).eval()
    assert grown.config.num_hidden_layers == 4 and len(grown.model.layers) == 4
    assert small.config.num_hidden_layers == 2  # the original is untouched
    ids = torch.randint(0, 50, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(grown(ids).logits, small(ids).logits, rtol=0, atol=1e-6)
    for layer in grown.model.layers[2:]:
        assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
        assert layer.self_attn.q_proj.weight.abs().sum() > 0  # the rest is a random init


def test_new_layers_train(small):
    grown = grow_layers(small, 1, seed=1)
    ids = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(1))
    grown(ids, labels=ids).loss.backward()
    assert grown.model.layers[2].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert grown.model.layers[2].mlp.down_proj.weight.grad.abs().sum() > 0


def test_grown_lm_loads_as_a_scorer_and_zero_extra_is_a_copy(small, tmp_path):
    grow_layers(small, 2, seed=1).save_pretrained(tmp_path / "grown")
    rm = ScalarModel(load_sequence_scorer(str(tmp_path / "grown")))
    assert rm.hf.config.num_hidden_layers == 4
    same = grow_layers(small, 0)
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), small.state_dict().values()))
    with pytest.raises(ValueError, match="extra must be >= 0"):
        grow_layers(small, -1)


def test_other_layouts_are_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=4, n_positions=16))
    with pytest.raises(ValueError, match="Llama layer layout"):
        grow_layers(gpt2, 1)
