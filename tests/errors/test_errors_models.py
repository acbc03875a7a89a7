"""Wrong or mismatched models are refused before the first step, each with one line naming the
config key and the path: a random head, another vocabulary, a classifier as the policy, a small
embedding, pickle-only or corrupt weights, a directory without tokenizer files."""
import pytest
import torch
from errortest_utils import WORDS, copy_model, one_line_error, ppo_args, reinforce_args, reward_args, sft_args

from fourfold.errors import ModelLoadError
from fourfold.models.checks import RoleChecker, tokenizer_difference
from fourfold.models.loading import load_causal_lm, load_tokenizer, safetensors_problem


def test_a_causal_lm_as_the_reward_model_or_the_critic(zoo, tmp_path, capsys):
    line = one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.reward={zoo['lm']}"),
                          "model.reward", zoo["lm"], "score head")
    assert "random" in line
    one_line_error(capsys, ppo_args(zoo, tmp_path / "b", f"model.critic={zoo['lm']}"), "model.critic", zoo["lm"],
                   "model.critic unset")


def test_a_sequence_classifier_as_the_policy_or_reference_or_sft_model(zoo, tmp_path, capsys):
    one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.policy={zoo['rm']}"), "model.policy", zoo["rm"],
                   "not a causal language model")
    one_line_error(capsys, ppo_args(zoo, tmp_path / "b", f"model.reference={zoo['rm']}"), "model.reference",
                   "not a causal language model")
    one_line_error(capsys, sft_args(zoo, tmp_path / "c", f"model.path={zoo['rm']}"), "model.path",
                   "not a causal language model")


def test_another_vocabulary_for_reward_reference_or_tokenizer(zoo, tmp_path, capsys):
    # a reward model with its own tokenizer scores the text encoded again (models/roles.RetokenizingReward);
    # a critic cannot start as it
    one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.reward={zoo['rm_other']}"), "model.critic_init",
                   "model.reward", zoo["rm_other"], "another vocabulary", "use model.critic_init=policy")
    one_line_error(capsys, reinforce_args(zoo, tmp_path / "b", f"model.reward={zoo['rm']}",
                                          f"model.reference={zoo['lm_other']}"), "model.reference", "another vocabulary")
    one_line_error(capsys, ppo_args(zoo, tmp_path / "c", f"model.tokenizer={zoo['tok_other']}"), "model.policy",
                   "model.tokenizer", zoo["tok_other"], "another vocabulary")
    one_line_error(capsys, reward_args(zoo, tmp_path / "d", f"model.path={zoo['rm_other']}",
                                       f"model.tokenizer={zoo['lm']}"), "model.path", "another vocabulary")


def test_an_embedding_smaller_than_the_tokenizer(zoo, tmp_path, capsys):
    one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.policy={zoo['lm_small']}"), "model.policy",
                   zoo["lm_small"], "the embedding has")
    one_line_error(capsys, sft_args(zoo, tmp_path / "b", f"model.path={zoo['lm_small']}"), "model.path",
                   "the embedding has")


def test_a_reference_without_tokenizer_files_must_match_the_policys_embedding(zoo, tmp_path, capsys):
    from fourfold.models.factory import llama_config, random_causal_lm

    bigger = llama_config(len(WORDS) + 10, hidden=16, layers=1, heads=2, max_positions=128)
    random_causal_lm(bigger, seed=0).save_pretrained(tmp_path / "bigger")  # no tokenizer files
    one_line_error(capsys, reinforce_args(zoo, tmp_path / "a", f"model.reward={zoo['rm']}",
                                          f"model.reference={tmp_path / 'bigger'}"),
                   "model.reference", "30 rows, the first model's 24")


def test_pickle_only_weights_are_refused_with_the_conversion(zoo, tmp_path, capsys):
    d = copy_model(zoo["lm"], tmp_path / "pickled")
    from safetensors.torch import load_file

    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.policy={d}"), str(d), "pytorch_model.bin",
                   "safetensors only", "save_pretrained")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_or_truncated_safetensors_name_the_file(zoo, tmp_path, capsys, damage):
    d = copy_model(zoo["rm"], tmp_path / "rm")
    f = d / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) - 100], "garbage": b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}xxxxxx",
                   "empty": b""}[damage])
    assert safetensors_problem(f) is not None
    one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.reward={d}"), str(f), "corrupt or truncated")


def test_a_whole_safetensors_file_passes(zoo):
    from pathlib import Path

    assert safetensors_problem(Path(zoo["lm"]) / "model.safetensors") is None


def test_a_model_directory_without_tokenizer_files(zoo, tmp_path, capsys):
    one_line_error(capsys, ppo_args(zoo, tmp_path / "a", f"model.policy={zoo['lm_notok']}"), zoo["lm_notok"])
    # GPT-2 and Qwen2 directories without tokenizer files give transformers an empty tokenizer
    from transformers import GPT2Config, Qwen2Config

    for name, config in [("gpt2", GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=30)),
                         ("qwen2", Qwen2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                               num_key_value_heads=2, intermediate_size=32, vocab_size=30))]:
        config.save_pretrained(tmp_path / name)
        with pytest.raises(ModelLoadError, match="no tokens besides its special ones"):
            load_tokenizer(str(tmp_path / name))
    gpt2 = tmp_path / "gpt2"
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=30)).save_pretrained(gpt2)
    one_line_error(capsys, sft_args(zoo, tmp_path / "b", f"model.path={gpt2}"), str(gpt2), "no tokens besides")


def test_tokenizer_files_that_load_as_another_class_stop_the_run_at_the_first_row(zoo, tmp_path, capsys):
    """A Qwen2 model directory whose tokenizer files were written from a word-level tokenizer loads
    them as Qwen2Tokenizer, which reads these plain words as no tokens: without a check, every row
    would train as BOS and EOS alone. SFT and the RL prompt stream stop at the first row, named."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from fourfold.tasks.tokenizer import build_word_tokenizer

    qwen = tmp_path / "qwen2"
    tok = build_word_tokenizer(WORDS)
    Qwen2ForCausalLM(Qwen2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                 intermediate_size=32, vocab_size=len(tok))).save_pretrained(qwen)
    tok.save_pretrained(qwen)
    why = "the prompt encodes to no tokens: the tokenizer reads nothing in its"
    one_line_error(capsys, sft_args(zoo, tmp_path / "sft", f"model.path={qwen}"), f"{zoo['sft']}:1: {why}")
    reward_fn = tmp_path / "reward_fn.py"
    reward_fn.write_text("def score(prompts, responses):\n    return [0.0] * len(responses)\n")
    one_line_error(capsys, reinforce_args(zoo, tmp_path / "rl", f"model.policy={qwen}", f"model.reward_fn={reward_fn}:score"),
                   f"{zoo['prompts']}:1: {why}")


def test_matching_models_pass_the_checks(zoo, tmp_path):
    tok = load_tokenizer(zoo["lm"])
    check = RoleChecker(tok, "model.policy", zoo["lm"])
    check.causal_lm(load_causal_lm(zoo["lm"]), "model.policy", zoo["lm"])
    check.causal_lm(load_causal_lm(zoo["lm"]), "model.reference", str(copy_model(zoo["lm"], tmp_path / "copy")))
    assert tokenizer_difference(tok, load_tokenizer(zoo["rm"])) is None
    assert "another vocabulary" in tokenizer_difference(tok, load_tokenizer(zoo["lm_other"]))


def test_eos_as_pad_is_the_same_tokenizer(tmp_path):
    """A tokenizer without a pad token gets a fresh ``<pad>`` here; elsewhere the same tokenizer is
    often given EOS as its pad: both are the same vocabulary."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {"<bos>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                            unk_token="<unk>").save_pretrained(tmp_path / "nopad")
    with pytest.warns(UserWarning, match="no dedicated pad token"):
        ours = load_tokenizer(str(tmp_path / "nopad"))
    theirs = AutoTokenizer.from_pretrained(tmp_path / "nopad")
    theirs.pad_token = theirs.eos_token
    assert ours.pad_token == "<pad>" and tokenizer_difference(ours, theirs) is None
