"""Model roles: loading rules, pad handling, per-token log-probs, scalar heads."""
import json

import pytest
import torch

from fourfold.errors import ModelLoadError
from fourfold.models.loading import ensure_pad_embedding, load_causal_lm, load_sequence_scorer, load_tokenizer
from fourfold.models.roles import (
    FrozenReference,
    FunctionReward,
    ModelReward,
    ScalarModel,
    last_valid_position,
    position_ids_from_mask,
    response_logprobs,
)


def test_position_ids_ignore_left_padding():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]


def test_last_valid_position():
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1], [0, 0, 0, 0]])
    assert last_valid_position(mask).tolist() == [1, 3, 0]


def test_response_logprobs_match_full_log_softmax(tiny_lm):
    model = load_causal_lm(str(tiny_lm / "sft"))
    ids = torch.tensor([[0, 0, 1, 10, 11, 12, 13], [1, 20, 21, 22, 23, 24, 25]])
    attn = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    T, temp = 3, 0.7
    got, ent = response_logprobs(model, ids, attn, T, temp, with_entropy=True)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn)).logits
    ref = torch.log_softmax(logits[:, -T - 1:-1].double() / temp, -1)
    want = ref.gather(-1, ids[:, -T:, None]).squeeze(-1)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    want_ent = -(ref.exp() * ref).sum(-1)
    torch.testing.assert_close(ent.double(), want_ent, atol=1e-5, rtol=1e-5)
    # left padding must not change a row's log-probs: row 0 without its pads gives the same values
    alone, _ = response_logprobs(model, ids[:1, 2:], attn[:1, 2:], T, temp)
    torch.testing.assert_close(alone, got[:1], atol=1e-5, rtol=1e-5)


def test_scalar_model_scores_last_valid_token(tiny_lm):
    rm = ScalarModel(load_sequence_scorer(str(tiny_lm / "rm")))
    ids = torch.tensor([[1, 10, 11, 2, 0, 0], [1, 12, 13, 14, 15, 2]])
    attn = (ids != 0).long()
    with torch.no_grad():
        per_pos = rm(ids, attn)
        scores = rm.score(ids, attn)
        values = rm.response_values(ids, attn, 2)
    assert per_pos.shape == (2, 6) and scores.shape == (2,) and values.shape == (2, 2)
    assert scores[0] == per_pos[0, 3] and scores[1] == per_pos[1, 5]
    torch.testing.assert_close(values, per_pos[:, 3:5])
    # the same as HF's own sequence-classification pooling on right-padded input
    with torch.no_grad():
        hf = rm.hf(input_ids=ids, attention_mask=attn).logits.squeeze(-1)
    torch.testing.assert_close(scores, hf, atol=1e-5, rtol=1e-5)


def test_reset_head_zero_gives_zero_values(tiny_lm):
    critic = ScalarModel(load_sequence_scorer(str(tiny_lm / "sft")))  # causal-LM dir: fresh head
    critic.reset_head("zero")
    ids = torch.tensor([[1, 5, 6, 7]])
    assert torch.count_nonzero(critic(ids, torch.ones_like(ids))) == 0


def test_frozen_reference_has_no_grad(tiny_lm):
    ref = FrozenReference(load_causal_lm(str(tiny_lm / "sft")))
    assert not any(p.requires_grad for p in ref.model.parameters())
    assert not ref.model.training
    lp = ref.logprobs(torch.tensor([[1, 5, 6, 7]]), torch.ones(1, 4, dtype=torch.long), 2)
    assert lp.shape == (1, 2) and not lp.requires_grad


def test_function_reward_and_model_reward(tiny_lm):
    fr = FunctionReward(lambda p, r: [len(x.split()) for x in r])
    out = fr(torch.zeros(2, 3, dtype=torch.long), None, ["a", "b"], ["x y", "z"])
    assert out.tolist() == [2.0, 1.0]
    bad = FunctionReward(lambda p, r: [1.0])
    with pytest.raises(ValueError, match="1 scores for 2 responses"):
        bad(torch.zeros(2, 3, dtype=torch.long), None, ["a", "b"], ["x", "y"])
    mr = ModelReward(ScalarModel(load_sequence_scorer(str(tiny_lm / "rm"))))
    assert not any(p.requires_grad for p in mr.model.parameters())


def test_tokenizer_without_pad_gets_one(tmp_path, tiny_lm):
    from fourfold.tasks.tokenizer import build_word_tokenizer

    tok = build_word_tokenizer(["a", "b"])
    tok.pad_token = None
    tok.save_pretrained(tmp_path / "tok")
    cfg = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    cfg.pop("pad_token", None)
    (tmp_path / "tok" / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.warns(UserWarning, match="no dedicated pad token"):
        loaded = load_tokenizer(str(tmp_path / "tok"))
    assert loaded.pad_token_id is not None and loaded.pad_token_id != loaded.eos_token_id
    model = load_causal_lm(str(tiny_lm / "sft"))
    before = model.get_input_embeddings().num_embeddings
    loaded.add_special_tokens({"additional_special_tokens": [f"<x{i}>" for i in range(before)]})
    ensure_pad_embedding(model, loaded)
    assert model.get_input_embeddings().num_embeddings == len(loaded)
    assert model.config.pad_token_id == loaded.pad_token_id


def test_remote_code_is_refused(tmp_path, tiny_lm):
    import shutil

    shutil.copytree(tiny_lm / "sft", tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilLM"}
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="trust_remote_code=true"):
        load_causal_lm(str(tmp_path / "m"))


def test_missing_dir_and_non_causal_lm(tmp_path):
    with pytest.raises(ModelLoadError, match="no such directory"):
        load_causal_lm(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_causal_lm(str(tmp_path / "empty"))
    from transformers import ViTConfig

    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path / "vit")
    with pytest.raises(ModelLoadError, match="not a causal language model"):
        load_causal_lm(str(tmp_path / "vit"))
