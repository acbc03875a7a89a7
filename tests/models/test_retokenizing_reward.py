"""A reward model with a tokenizer of its own (another vocabulary than the policy's): the loop's
decoded text is encoded again with the reward model's tokenizer, and the score equals scoring that
text directly with it (exactly); chat prompts are rendered by the reward model's own template; a
PPO run with such a reward model trains, a critic copied from it is one line."""

import json

import pytest
import torch

from fourfold.cli import main
from fourfold.config import PPOConfig, load_config
from fourfold.data import RenderedChat, ResponseRecord, collate_responses, encode_responses, load_prompts
from fourfold.errors import ModelLoadError
from fourfold.models.build import load_roles
from fourfold.models.factory import llama_config, random_scalar_model
from fourfold.models.loading import load_sequence_scorer, load_tokenizer
from fourfold.models.roles import ModelReward, RetokenizingReward, ScalarModel
from fourfold.tasks.tokenizer import build_word_tokenizer

# the reward model's words: the policy's w0..w59 and four more that sort before them, so every id differs
RM_WORDS = [f"w{i}" for i in range(60)] + ["assistant", "user", ":", "said"]
TEMPLATE = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
PROMPTS = ["w1 w2", "w3", "w4 w5 w6"]
RESPONSES = ["w7 w8 w9", "w10", "w11"]


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm_own_tok")
    tok = build_word_tokenizer(RM_WORDS)
    tok.chat_template = TEMPLATE
    cfg = llama_config(len(tok), hidden=32, layers=1, heads=2, max_positions=128, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    random_scalar_model(cfg, seed=7).save_pretrained(root / "rm")
    tok.save_pretrained(root / "rm")
    return root / "rm"


def _roles(tiny_lm, rm_dir, *extra):
    cfg = load_config(PPOConfig, None, [f"model.policy={tiny_lm / 'sft'}", f"model.reward={rm_dir}", "data.prompts=p",
                                        "model.critic_init=policy", *extra])
    return load_roles("ppo", cfg, torch.device("cpu"))


def _policy_batch(tok, prompts, responses, finished):
    """The rollout's ids as the policy's tokenizer lays them out (what the reward role receives)."""
    records = [ResponseRecord(p, r, f, line=i + 1) for i, (p, r, f) in enumerate(zip(prompts, responses, finished))]
    return collate_responses(encode_responses(records, tok, 512), tok.pad_token_id)


def _direct(rm_dir, ids, mask):
    hf = load_sequence_scorer(str(rm_dir), dtype="float32", device=torch.device("cpu"))
    return ModelReward(ScalarModel(hf))(ids, mask)


def test_the_score_is_that_of_the_text_encoded_with_the_reward_models_tokenizer(tiny_lm, rm_dir):
    roles = _roles(tiny_lm, rm_dir)
    assert isinstance(roles.reward, RetokenizingReward) and roles.reward.needs_text
    assert roles.reward_model is roles.reward.model
    finished = [True, False, True]
    ids, mask = _policy_batch(roles.tokenizer, PROMPTS, RESPONSES, finished)
    got = roles.reward(ids, mask, PROMPTS, RESPONSES)
    rm_tok = load_tokenizer(str(rm_dir))
    want_ids, want_mask = _policy_batch(rm_tok, PROMPTS, RESPONSES, finished)  # `fourfold score`'s layout
    assert torch.equal(roles.reward.encode(PROMPTS, RESPONSES, finished)[0], want_ids)
    assert not torch.equal(want_ids, ids)  # the two vocabularies really differ
    assert torch.equal(got, _direct(rm_dir, want_ids, want_mask))
    assert len(set(got.tolist())) == 3


def test_chat_prompts_are_rendered_by_the_reward_models_template(tiny_lm, rm_dir):
    roles = _roles(tiny_lm, rm_dir)
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    prompts = [RenderedChat(f"user: {p}\nassistant: ", m) for p, m in zip(PROMPTS, messages)]  # the policy's text
    ids, mask = _policy_batch(roles.tokenizer, PROMPTS, RESPONSES, [True] * 3)
    got = roles.reward(ids, mask, prompts, RESPONSES)
    rm_tok = load_tokenizer(str(rm_dir))
    texts = [rm_tok.apply_chat_template([*m, {"role": "assistant", "content": r}], tokenize=False)
             for m, r in zip(messages, RESPONSES)]
    assert texts[0] == "user : w1 w2 <eos> assistant : w7 w8 w9 <eos> "
    rows = [rm_tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    L = max(map(len, rows))
    want_ids = torch.tensor([[rm_tok.pad_token_id] * (L - len(r)) + r for r in rows])
    want_mask = torch.tensor([[0] * (L - len(r)) + [1] * len(r) for r in rows])
    assert torch.equal(got, _direct(rm_dir, want_ids, want_mask))


def test_a_prompts_files_messages_travel_with_the_rendered_text(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "w1 w2"}]}) + "\n")
    (row,) = load_prompts(path)
    assert row.prompt == "user: w1 w2\nassistant: " and row.prompt.messages == ({"role": "user", "content": "w1 w2"},)


def test_a_critic_cannot_start_as_a_reward_model_of_another_vocabulary(tiny_lm, rm_dir):
    with pytest.raises(ModelLoadError, match=r"^model\.critic_init: 'reward' copies the reward model, .*another "
                                             r"vocabulary.*use model\.critic_init=policy$"):
        _roles(tiny_lm, rm_dir, "model.critic_init=reward")


def test_grpo_with_a_reward_model_of_another_vocabulary_runs(tiny_lm, rm_dir, tmp_path, capsys):
    code = main(["ppo", "--config", "examples/grpo.yaml", f"model.policy={tiny_lm / 'sft'}", f"model.reward={rm_dir}",
                 f"data.prompts={tiny_lm / 'prompts.jsonl'}", "ppo.iterations=1", "ppo.rollout_batch_size=4",
                 "ppo.minibatch_size=4", "ppo.samples_per_prompt=2", "ppo.ppo_epochs=1", "generation.max_new_tokens=3", "run.device=cpu",
                 "run.progress=false", "run.tensorboard=false", "run.threads=1", f"run.output_dir={tmp_path / 'run'}"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward/score_mean" in r for r in rows)
