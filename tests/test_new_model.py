"""`fourfold new-model` (issue 40, item 3): a tokenizer trained on the user's text and a random
causal LM in one directory that transformers loads offline and every stage takes; the recipe of
docs/new-model.md end to end (new-model -> sft -> ppo with a reward function -> ppo with a
multi-turn environment), and each bad input's one line."""
import json
import math
import random

import pytest
import torch

from fourfold import cli
from fourfold.apps.new_model import CHAT_TEMPLATE, ROLE_TOKENS
from fourfold.reporting import read_metrics
from fourfold.tasks.tokenizer import SPECIAL_TOKENS

WORDS = "the a cat dog sat ran on under mat tree big small red blue and then".split()
SIZES = ["--vocab", "300", "--layers", "2", "--hidden", "32", "--heads", "4", "--positions", "64"]


def _corpus(path, n=120, seed=0):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(4, 12))) + " ." for _ in range(n)]
    path.write_text("\n".join(lines) + "\n\n")  # a blank line at the end: skipped
    return path, lines


def _new_model(tmp_path, capsys, *args):
    tmp_path.mkdir(parents=True, exist_ok=True)
    corpus, lines = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "model"
    assert cli.main(["new-model", "--corpus", str(corpus), "--out", str(out), *args]) == 0, capsys.readouterr().err
    return out, lines, capsys.readouterr()


def _llama_params(v, h, layers, ffn):
    """Embeddings and LM head, each layer's q/k/v/o, gate/up/down and two RMSNorms, the final norm."""
    return 2 * v * h + layers * (4 * h * h + 3 * h * ffn + 2 * h) + h


def test_the_directory_loads_in_transformers_with_the_sizes_asked(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, lines, said = _new_model(tmp_path, capsys, *SIZES)
    params = _llama_params(300, 32, 2, 128)
    assert params == 52_128
    assert said.out == (f"fourfold new-model: wrote {out}: a bpe tokenizer of 300 tokens and a random llama (2 layers, "
                        f"hidden 32, 4 heads, 64 positions) of 52,128 parameters; use it as model.path / "
                        f"model.policy={out}\n")
    assert said.err == ""  # no progress bar
    assert sorted(p.name for p in out.iterdir()) == ["chat_template.jinja", "config.json", "generation_config.json",
                                                     "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    c = model.config
    assert (len(tok), c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.intermediate_size,
            c.max_position_embeddings) == (300, 300, 32, 2, 4, 128, 64)
    assert c.model_type == "llama" and sum(p.numel() for p in model.parameters()) == params
    specials = [*SPECIAL_TOKENS, *ROLE_TOKENS]
    assert tok.convert_tokens_to_ids(specials) == list(range(8))
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (c.pad_token_id, c.bos_token_id, c.eos_token_id) == (0, 1, 2)
    for line in lines:  # byte-level BPE: every line back exactly, no special token added
        ids = tok(line, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == line and min(ids) >= 8
    assert len(tok("the cat sat on the mat .", add_special_tokens=False)["input_ids"]) < 10  # merges learnt
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the cat"}]
    assert tok.chat_template == CHAT_TEMPLATE
    assert tok.apply_chat_template(chat, tokenize=False) == "<|user|>hi<|assistant|>the cat<eos>"
    assert tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True) == "<|user|>hi<|assistant|>"
    # the weights are the seeded random model of that config: --seed 0 by default
    from fourfold.models.factory import random_causal_lm

    again = random_causal_lm(c, seed=0).state_dict()
    assert all(torch.equal(again[k], v) for k, v in model.state_dict().items())


def test_the_same_corpus_and_seed_give_the_same_directory_another_seed_other_weights(tmp_path, capsys):
    first, _, _ = _new_model(tmp_path / "a", capsys, *SIZES)
    second, _, _ = _new_model(tmp_path / "b", capsys, *SIZES)
    third, _, _ = _new_model(tmp_path / "c", capsys, *SIZES, "--seed", "1")
    for name in ("tokenizer.json", "config.json", "model.safetensors"):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    assert (first / "tokenizer.json").read_bytes() == (third / "tokenizer.json").read_bytes()
    assert (first / "model.safetensors").read_bytes() != (third / "model.safetensors").read_bytes()


def test_a_word_tokenizer_keeps_the_most_frequent_words(tmp_path, capsys):
    from transformers import AutoTokenizer

    out, lines, said = _new_model(tmp_path, capsys, "--tokenizer", "word", "--vocab", "12", "--hidden", "16",
                                  "--heads", "2", "--positions", "32", "--min-frequency", "1")
    counts = {w: sum(line.split().count(w) for line in lines) for w in [*WORDS, "."]}
    top4 = sorted(sorted(counts, key=lambda w: -counts[w])[:4])  # 12 = 4 specials + 4 words + 4 roles
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 12 and "a word tokenizer of 12 tokens and" in said.out
    assert [tok.convert_ids_to_tokens(i) for i in range(12)] == [*SPECIAL_TOKENS, *top4, *ROLE_TOKENS]
    assert tok.decode(tok(" ".join(top4), add_special_tokens=False)["input_ids"]) == " ".join(top4)
    # a vocabulary the corpus cannot fill says what it reached
    out2 = tmp_path / "all"
    assert cli.main(["new-model", "--corpus", str(tmp_path / "corpus.txt"), "--out", str(out2), "--tokenizer", "word",
                     "--vocab", "100", "--hidden", "16", "--heads", "2"]) == 0
    n = 4 + len(counts) + 4
    assert f"a word tokenizer of {n} tokens (of --vocab 100: the corpus gives no more)" in capsys.readouterr().out


@pytest.mark.parametrize("arch,model_type", [("qwen2", "qwen2"), ("mistral", "mistral"), ("gpt2", "gpt2")])
def test_each_architecture_saves_a_causal_lm_of_its_family(tmp_path, capsys, arch, model_type):
    from transformers import AutoModelForCausalLM

    out, _, _ = _new_model(tmp_path, capsys, *SIZES, "--arch", arch, "--intermediate", "48")
    model = AutoModelForCausalLM.from_pretrained(out)
    c = model.config
    assert c.model_type == model_type and c.vocab_size == 300 and c.get_text_config().hidden_size == 32
    ffn = c.n_inner if arch == "gpt2" else c.intermediate_size
    positions = c.n_positions if arch == "gpt2" else c.max_position_embeddings
    assert (ffn, positions, c.num_hidden_layers, c.num_attention_heads) == (48, 64, 2, 4)
    logits = model(torch.tensor([[1, 9, 10]])).logits
    assert logits.shape == (1, 3, 300)


def test_a_jsonl_corpus_reads_its_text_fields(tmp_path):
    from fourfold.apps.new_model import read_corpus

    path = tmp_path / "c.jsonl"
    rows = [{"text": "one two"}, {"prompt": "three", "completion": "four", "n": 1},
            {"messages": [{"role": "user", "content": "five"}, {"role": "assistant", "content": "six"}]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert read_corpus(str(path)) == ["one two", "three", "four", "five", "six"]
    bom = tmp_path / "bom.txt"
    bom.write_bytes("\ufeffone two\r\n\r\nthree\n".encode("utf-8"))  # a BOM and CRLF lines: the text alone
    assert read_corpus(str(bom)) == ["one two", "three"]


def test_help_lists_every_flag_with_its_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["new-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, default in [("--vocab N", "1024"), ("--layers N", "2"), ("--hidden N", "128"), ("--heads N", "4"),
                          ("--intermediate N", "4 x --hidden"), ("--positions N", "256"), ("--arch", "llama"),
                          ("--tokenizer", "bpe"), ("--min-frequency N", "2"), ("--seed N", "0")]:
        assert flag in text and f"(default: {default})" in text, flag
    assert "--corpus FILE" in text and "--out DIR" in text and "--force" in text
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "new-model" in capsys.readouterr().out


# --- the recipe end to end ---------------------------------------------------------------------------

ENVS = '''
class Echo:
    """Three turns: after each reply the environment says the row's secret word; a reply holding it scores 1."""

    def __init__(self, row):
        self.secret = row["secret"]

    def reset(self):
        return "say the word after me"

    def step(self, action):
        return self.secret, float(self.secret in action.split()), False


def make_env(row):
    return Echo(row)
'''
REWARD = "def reward(prompts, responses):\n    return [r.split().count('cat') / 4.0 for r in responses]\n"
RUN = ["run.progress=false", "run.device=cpu", "run.report_to=[]"]
PPO = ["model.critic_init=policy", "ppo.iterations=2", "ppo.rollout_batch_size=8", "ppo.minibatch_size=4",
       "ppo.ppo_epochs=1", "generation.max_new_tokens=6", "run.samples_every=1"]


def test_the_recipe_new_model_sft_ppo_and_an_environment(tmp_path, capsys):
    out, lines, _ = _new_model(tmp_path, capsys, *SIZES)
    sft_rows = tmp_path / "sft.jsonl"
    sft_rows.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    secrets = ["cat", "dog", "mat", "tree"]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(line.split()[:3]), "secret": secrets[i % 4]}) + "\n"
                               for i, line in enumerate(lines[:16])))
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "envs.py").write_text(ENVS)

    sft = tmp_path / "sft"
    assert cli.main(["sft", f"model.path={out}", f"data.train={sft_rows}", "train.max_steps=3", "train.batch_size=8",
                     "train.max_len=64", "train.lr=1e-3", "train.log_every=1", *RUN, "--output-dir", str(sft)]) == 0
    rows = read_metrics(sft / "metrics.jsonl")
    losses = [r["sft/loss"] for r in rows]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert abs(losses[0] - math.log(300)) < 0.05  # a random model's first loss: uniform over the 300 tokens

    ppo = tmp_path / "ppo"
    assert cli.main(["ppo", f"model.policy={sft / 'model'}", f"model.reward_fn={tmp_path / 'reward.py'}:reward",
                     f"data.prompts={prompts}", "data.max_prompt_len=24", *PPO, *RUN, "--output-dir", str(ppo)]) == 0
    rows = read_metrics(ppo / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("reward/score_mean" in r for r in rows)
    samples = [json.loads(s) for s in (ppo / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["score"] == s["response"].split().count("cat") / 4.0 for s in samples)

    env = tmp_path / "env"
    assert cli.main(["ppo", f"model.policy={ppo / 'policy'}", f"data.prompts={prompts}",
                     f"env.factory={tmp_path / 'envs.py'}:make_env", "env.max_turns=3", "env.max_tokens=64",
                     "env.observation_role=user", *PPO, *RUN, "--output-dir", str(env)]) == 0
    rows = read_metrics(env / "metrics.jsonl")
    assert len(rows) == 2 and all(r["env/turns_mean"] == 3.0 and r["env/done_frac"] == 0.0 for r in rows)
    samples = [json.loads(s) for s in (env / "samples.jsonl").read_text().splitlines()]
    assert samples and all(len(s["turns"]) == 3 for s in samples)
    for s in samples:
        secret = s["turns"][0]["observation"]
        assert secret in secrets and s["turns"][1]["observation"] == secret
        assert s["return"] == sum(float(secret in t["action"].split()) for t in s["turns"])


def test_the_new_model_generates_and_trains_a_reward_model_that_scores(tmp_path, capsys):
    out, lines, _ = _new_model(tmp_path, capsys, *SIZES)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": " ".join(line.split()[:3])}) + "\n" for line in lines[:6]))
    assert cli.main(["generate", f"model.path={out}", f"data.prompts={prompts}", "generation.max_new_tokens=5",
                     *RUN, "--output-dir", str(tmp_path / "gen")]) == 0
    completions = [json.loads(s) for s in (tmp_path / "gen" / "completions.jsonl").read_text().splitlines()]
    assert [c["prompt"] for c in completions] == [" ".join(line.split()[:3]) for line in lines[:6]]

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": "the", "chosen": line, "rejected": lines[i + 1]}) + "\n"
                             for i, line in enumerate(lines[:16])))
    reward = tmp_path / "reward"
    assert cli.main(["reward", f"model.path={out}", f"data.train={pairs}", "data.eval_fraction=0", "train.max_steps=2",
                     "train.batch_size=4", "train.max_len=64", *RUN, "--output-dir", str(reward)]) == 0
    assert cli.main(["score", f"model.reward={reward / 'model'}", f"data.rows={tmp_path / 'gen' / 'completions.jsonl'}",
                     *RUN, "--output-dir", str(tmp_path / "scores")]) == 0
    scores = [json.loads(s) for s in (tmp_path / "scores" / "scores.jsonl").read_text().splitlines()]
    assert len(scores) == 6 and all(isinstance(s["score"], float) for s in scores)


# --- bad input: one line each, nothing lost ------------------------------------------------------------


def _bad(tmp_path, capsys, args):
    assert cli.main(["new-model", *args]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1, said.err
    return said.err.strip()


def test_each_bad_input_is_one_line_naming_the_flag(tmp_path, capsys):
    corpus, _ = _corpus(tmp_path / "corpus.txt")
    (tmp_path / "blank.txt").write_text("\n  \n\n")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9\n".encode("latin-1"))
    (tmp_path / "rows.jsonl").write_text('{"text": "a b"}\n{"label": 1}\n')
    (tmp_path / "broken.jsonl").write_text('{"text": "a b"}\n{"text": \n')
    good = ["--corpus", str(corpus), *SIZES]
    cases = [
        (["--corpus", str(tmp_path / "nope.txt"), "--out", "x"],
         f"--corpus: {tmp_path / 'nope.txt'}: no such file; expected a text file (one document a line) or a JSONL "
         "file with a 'text' or 'prompt' field"),
        (["--corpus", str(tmp_path), "--out", str(tmp_path / "m")], f"--corpus: {tmp_path} is a directory; expected"),
        (["--corpus", str(tmp_path / "blank.txt"), "--out", str(tmp_path / "m")],
         f"--corpus: {tmp_path / 'blank.txt'}: no text in it (empty, or every line blank); expected a text file"),
        (["--corpus", str(tmp_path / "latin1.txt"), "--out", str(tmp_path / "m")],
         f"--corpus: {tmp_path / 'latin1.txt'}: not UTF-8 text (byte 3)"),
        (["--corpus", str(tmp_path / "rows.jsonl"), "--out", str(tmp_path / "m")],
         f"--corpus: {tmp_path / 'rows.jsonl'}:2: no text field; expected a string in one of 'text', 'prompt'"),
        (["--corpus", str(tmp_path / "broken.jsonl"), "--out", str(tmp_path / "m")],
         f"--corpus: {tmp_path / 'broken.jsonl'}:2: "),
        ([*good, "--vocab", "100", "--out", str(tmp_path / "m")],
         "--vocab: 100 is too small for the 8 special tokens and the 256 bytes of byte-level BPE: expected at least "
         "264 (or --tokenizer word)"),
        ([*good, "--tokenizer", "word", "--vocab", "8", "--out", str(tmp_path / "m")],
         "--vocab: 8 is too small for the 8 special tokens and at least one word: expected at least 9"),
        ([*good, "--hidden", "30", "--out", str(tmp_path / "m")],
         "--hidden: 30 is not divisible by --heads 4: expected a multiple of it"),
        ([*good, "--hidden", "12", "--out", str(tmp_path / "m")],
         "--hidden: 12 / --heads 4 = 3 per head; llama's rotary positions need an even head size"),
        ([*good, "--layers", "0", "--out", str(tmp_path / "m")], "--layers: 0: expected an integer >= 1"),
        ([*good, "--tokenizer", "word", "--min-frequency", "1000", "--out", str(tmp_path / "m")],
         "--min-frequency: 1000: no word of the corpus occurs that often; expected a smaller count"),
        ([*good, "--out", str(corpus)], f"--out: {corpus} is a file: expected a directory"),
        ([*good, "--out", str(tmp_path / "m"), "extra=1"], "unexpected arguments extra=1 (new-model takes flags only)"),
    ]
    for args, expected in cases:
        err = _bad(tmp_path, capsys, args)
        assert err.startswith(f"fourfold new-model: error: {expected}"), (args, err)
    assert not (tmp_path / "m").exists()


def test_an_out_that_holds_files_is_kept_without_force_and_replaced_whole_with_it(tmp_path, capsys, monkeypatch):
    corpus, _ = _corpus(tmp_path / "corpus.txt")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    args = ["new-model", "--corpus", str(corpus), "--out", str(out), *SIZES]
    assert _bad(tmp_path, capsys, args[1:]) == (f"fourfold new-model: error: --out: {out} exists and is not empty: "
                                                "expected a new or empty directory (or --force to replace it)")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]

    import fourfold.tasks.tokenizer as tokenizer_module

    def full_disk(fast, directory):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tokenizer_module, "save_tokenizer", full_disk)
    assert _bad(tmp_path, capsys, [*args[1:], "--force"]) == \
        f"fourfold new-model: error: --out: {out}: cannot be written (No space left on device)"
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "mine"]  # no temporary left
    monkeypatch.undo()

    assert cli.main([*args, "--force"]) == 0
    assert "notes.txt" not in {p.name for p in out.iterdir()} and (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt", "mine"]
