"""Reward-model trainer: accuracy on a separable toy set, normalisation that survives a reload,
exact resume after SIGKILL, the held-out split, heads, CLI."""
import json
import os
import random
import subprocess
import sys

import pytest
import safetensors.torch
import torch

from fourfold.checkpoint import latest_checkpoint
from fourfold.config import PreferenceDataConfig, RewardConfig, load_config
from fourfold.data import load_preferences, tokenize_preferences
from fourfold.models.build import load_roles
from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
from fourfold.models.loading import load_sequence_scorer, load_tokenizer
from fourfold.models.roles import ScalarModel
from fourfold.reporting import is_timing_key, read_metrics
from fourfold.tasks.tokenizer import build_word_tokenizer
from fourfold.trainers import pairs, reward

WORDS = [f"w{i}" for i in range(20)]
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "reward.yaml")


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _pairs(n, seed):
    """Separable pairs: the chosen response holds 'good', the rejected one 'bad', at a random place
    among random filler words."""
    rng = random.Random(seed)

    def resp(tag):
        ws = [rng.choice(WORDS) for _ in range(3)]
        ws.insert(rng.randrange(4), tag)
        return " ".join(ws)

    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(3)), "chosen": resp("good"), "rejected": resp("bad")}
            for _ in range(n)]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("rm_toy")
    build_word_tokenizer(WORDS + ["good", "bad"], d / "tok")
    return {"dir": d, "tok": str(d / "tok"), "train": _write_jsonl(d / "train.jsonl", _pairs(64, 0)),
            "eval": _write_jsonl(d / "eval.jsonl", _pairs(32, 1))}


def _overrides(toy, out, *extra) -> list[str]:
    return [
        "model.from_scratch=true", f"model.tokenizer={toy['tok']}", "model.hidden_size=32", "model.num_layers=1",
        "model.num_heads=2", "model.max_positions=32", f"data.train={toy['train']}", "train.batch_size=16",
        "train.lr=3e-3", "train.max_len=16", "train.log_every=1", "run.threads=1",
        f"run.output_dir={out}", "run.device=cpu", "run.progress=false", "run.tensorboard=false", *extra,
    ]


def _cfg(toy, out, *extra) -> RewardConfig:
    return load_config(RewardConfig, None, _overrides(toy, out, *extra))


def _rows(out):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(os.path.join(out, "metrics.jsonl"))]


def _weights(path):
    return safetensors.torch.load_file(str(path))


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_accuracy_on_separable_pairs_and_normalisation_after_reload(toy, tmp_path):
    from transformers import AutoModelForSequenceClassification

    out = tmp_path / "run"
    res = reward.train(_cfg(toy, out, "train.max_steps=40", f"data.eval={toy['eval']}", "train.eval_every=10"))
    rows = read_metrics(out / "metrics.jsonl")
    # measured: eval accuracy 1.0 from step 10 on, eval loss 0.082 at step 10 and 0.012 at step 40
    assert res["final"]["rm/eval_accuracy"] > 0.9, res["final"]
    assert res["final"]["rm/accuracy"] > 0.9
    assert rows[-1]["rm/eval_loss"] < rows[0]["rm/loss"]
    assert [r["step"] for r in rows if "rm/eval_accuracy" in r] == [10, 20, 30, 40]
    assert res["normalization"]["std"] > 0

    # reload with fourfold's loader: the training responses now score mean 0, std 1
    tok = load_tokenizer(res["model"])
    rm = ScalarModel(load_sequence_scorer(res["model"])).eval()
    batch = tokenize_preferences(load_preferences(toy["train"]), tok, 16)
    with torch.no_grad():
        chosen = rm.score(batch["chosen_input_ids"], batch["chosen_attention_mask"])
        rejected = rm.score(batch["rejected_input_ids"], batch["rejected_attention_mask"])
    scores = torch.cat([chosen, rejected]).double()
    assert abs(float(scores.mean())) < 1e-3 and abs(float(scores.std(correction=0)) - 1.0) < 1e-3
    assert bool((chosen > rejected).float().mean() > 0.9)

    # plain transformers loads it as a one-label classifier; its logits omit the recorded shift
    plain = AutoModelForSequenceClassification.from_pretrained(res["model"]).eval()
    assert plain.config.num_labels == 1
    with torch.no_grad():
        logits = plain(input_ids=batch["chosen_input_ids"], attention_mask=batch["chosen_attention_mask"]).logits[:, 0]
    shift = getattr(plain.config, "fourfold_score_shift", 0.0) or 0.0
    torch.testing.assert_close(logits + shift, chosen, atol=1e-4, rtol=1e-4)


def test_set_affine_round_trips_through_save_pretrained(tmp_path):
    torch.manual_seed(0)
    cfg = llama_config(24, 32, 1, 2, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    rm = ScalarModel(random_scalar_model(cfg)).eval()
    assert rm.head.bias is None  # Llama's score layer: the reason the shift lives in the config
    ids = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0]])
    mask = (ids != 0).long()
    raw = rm.score(ids, mask).detach()
    rm.set_affine(2.0, 3.0)
    rm.set_affine(0.5, -1.0)  # composes: 0.5 * (2 s + 3) - 1 = s + 0.5
    torch.testing.assert_close(rm.score(ids, mask).detach(), raw + 0.5)
    rm.save_pretrained(tmp_path / "rm")
    again = ScalarModel(load_sequence_scorer(str(tmp_path / "rm"))).eval()
    torch.testing.assert_close(again.score(ids, mask).detach(), raw + 0.5)


def test_normalisation_removes_an_offset_the_loss_cannot_see(toy, tmp_path):
    """Bradley-Terry is blind to a constant offset; start from a reward-model directory whose scores
    are all shifted by +5 and check that the saved model's training scores are centred again."""
    tok = load_tokenizer(toy["tok"])
    torch.manual_seed(0)
    start = ScalarModel(random_scalar_model(llama_config(len(tok), 32, 1, 2, pad_token_id=tok.pad_token_id)))
    start.set_affine(1.0, 5.0)
    start.save_pretrained(tmp_path / "start")
    tok.save_pretrained(tmp_path / "start")
    res = reward.train(_cfg(toy, tmp_path / "run", "model.from_scratch=false", f"model.path={tmp_path / 'start'}",
                            "train.max_steps=5", "data.eval_fraction=0"))
    assert abs(res["normalization"]["mean"] - 5.0) < 1.0
    rm = ScalarModel(load_sequence_scorer(res["model"])).eval()
    batch = tokenize_preferences(load_preferences(toy["train"]), tok, 16)
    with torch.no_grad():
        scores = torch.cat([rm.score(batch["chosen_input_ids"], batch["chosen_attention_mask"]),
                            rm.score(batch["rejected_input_ids"], batch["rejected_attention_mask"])]).double()
    assert abs(float(scores.mean())) < 1e-3 and abs(float(scores.std(correction=0)) - 1.0) < 1e-3


def test_resume_after_sigkill_is_exact(toy, tmp_path):
    args = ["train.max_steps=14", "data.eval_fraction=0.25", "train.eval_every=5", "train.log_every=3"]
    full = tmp_path / "full"
    reward.train(_cfg(toy, full, *args))

    # a real SIGKILL in the middle of step 11 (no handler runs, no finally): checkpoints at 4 and 8
    part = tmp_path / "part"
    script = (
        "import os, signal, sys\n"
        "from fourfold.config import RewardConfig, load_config\n"
        "from fourfold.run import optim\n"
        "from fourfold.trainers import reward\n"
        "real, calls = optim.clip_and_step, [0]\n"
        "def step(*a, **k):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 11:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*a, **k)\n"
        "optim.clip_and_step = step  # the guarded step calls it through run.optim\n"
        "reward.train(load_config(RewardConfig, None, sys.argv[1:]))\n"
    )
    argv = _overrides(toy, part, *args, "run.save_every=4")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert latest_checkpoint(part).name == "step-00000008"
    assert [r["step"] for r in read_metrics(part / "metrics.jsonl")][-1] == 10  # rows past the checkpoint
    assert not (part / "model").exists()

    res = reward.train(_cfg(toy, part, *args, "run.save_every=4", "run.resume=true"))
    assert _rows(part) == _rows(full)
    assert res["final"]["rm/eval_accuracy"] == _rows(full)[-1]["rm/eval_accuracy"]
    assert _same(_weights(full / "model" / "model.safetensors"), _weights(part / "model" / "model.safetensors"))
    shift = [json.loads((d / "model" / "config.json").read_text()).get("fourfold_score_shift") for d in (full, part)]
    assert shift[0] == shift[1]
    ck = [latest_checkpoint(d) / "modules" / "reward_model.safetensors" for d in (full, part)]
    assert _same(_weights(ck[0]), _weights(ck[1]))


def test_held_out_split_is_seeded_disjoint_and_complete(toy):
    tok = load_tokenizer(toy["tok"])
    data = PreferenceDataConfig(train=toy["train"], eval_fraction=0.25)
    train, held, *_ = pairs.split_records(data, tok, seed=3)
    assert len(held) == 16 and len(train) == 48
    assert sorted(r.line for r in train + held) == list(range(1, 65))
    assert [r.line for r in pairs.split_records(data, tok, seed=3)[1]] == [r.line for r in held]
    assert [r.line for r in pairs.split_records(data, tok, seed=4)[1]] != [r.line for r in held]
    none = PreferenceDataConfig(train=toy["train"], eval_fraction=0.0)
    assert pairs.split_records(none, tok, seed=3)[1] is None


def test_bad_pairs_raise_with_file_and_line_or_are_skipped(toy, tmp_path):
    from fourfold.errors import DataError

    rows = _pairs(6, 2)
    rows[3] = dict(rows[3], chosen=" ".join(WORDS))  # prompt + chosen + EOS = 24 tokens > max_len 16
    path = _write_jsonl(tmp_path / "prefs.jsonl", rows)
    with pytest.raises(DataError, match=r"prefs\.jsonl:4: .*max_len=16"):
        reward.train(_cfg(toy, tmp_path / "a", f"data.train={path}", "train.max_steps=1"))
    out = tmp_path / "b"
    res = reward.train(_cfg(toy, out, f"data.train={path}", "data.on_error=skip", "data.eval_fraction=0",
                            "train.max_steps=1", "train.batch_size=5"))
    assert res["model"] == str(out / "model")
    warnings = [e["message"] for e in read_metrics(out / "events.jsonl") if e["kind"] == "warning"]
    assert len(warnings) == 1 and "1 bad rows skipped" in warnings[0] and "prefs.jsonl:4:" in warnings[0]


def test_tied_pairs_are_left_out_with_one_warning_and_only_all_ties_is_an_error(toy, tmp_path):
    """A pair whose chosen and rejected are the same (as text, but for spaces at the ends, or as
    tokens) carries no preference: public preference sets hold such ties, so they are left out,
    counted in one warning line (events.jsonl too), whatever data.on_error says."""
    from fourfold.errors import DataError

    rows = _pairs(8, 2)
    rows[1] = dict(rows[1], rejected=rows[1]["chosen"])
    rows[4] = dict(rows[4], rejected=rows[4]["chosen"] + " ")
    rows[6] = dict(rows[6], chosen="qqq", rejected="rrr")  # two words the tokenizer reads as the same UNK
    path = _write_jsonl(tmp_path / "prefs.jsonl", rows)
    out = tmp_path / "a"
    res = reward.train(_cfg(toy, out, f"data.train={path}", "data.eval_fraction=0", "train.max_steps=1",
                            "train.batch_size=5"))
    assert res["model"] == str(out / "model")
    warnings = [e["message"] for e in read_metrics(out / "events.jsonl") if e["kind"] == "warning"]
    assert warnings == [f"3 tied preference pairs left out ('chosen' and 'rejected' the same: no preference to learn); "
                        f"first: {path}:2: 'chosen' and 'rejected' are identical"]
    train_ex, _, skipped, notes = pairs.load_examples(_cfg(toy, out, f"data.train={path}", "data.eval_fraction=0"),
                                                      load_tokenizer(toy["tok"]))
    assert [e.line for e in train_ex] == [1, 3, 4, 6, 8] and skipped == [] and notes == warnings
    # every pair a tie: nothing to learn, an error naming the file
    ties = _write_jsonl(tmp_path / "ties.jsonl", [dict(r, rejected=r["chosen"]) for r in rows[:3]])
    with pytest.raises(DataError) as info:
        reward.train(_cfg(toy, tmp_path / "b", f"data.train={ties}", "train.max_steps=1"))
    assert str(info.value) == (f"{ties}: every preference pair is a tie (3 with 'chosen' identical to 'rejected'): "
                               "no preference to learn")


def test_causal_lm_directory_gets_a_fresh_head_and_a_reward_directory_keeps_it(toy, tmp_path):
    tok = load_tokenizer(toy["tok"])
    lm = random_causal_lm(llama_config(len(tok), 32, 1, 2, pad_token_id=tok.pad_token_id), seed=0)
    lm.save_pretrained(tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    cfg = load_config(RewardConfig, None, [f"model.path={tmp_path / 'lm'}", f"data.train={toy['train']}"])
    torch.manual_seed(0)
    rm = load_roles("reward", cfg, torch.device("cpu")).reward_model
    w = rm.head.weight.detach().clone()
    assert 0.005 < float(w.std()) < 0.05  # N(0, 0.02^2)
    torch.manual_seed(0)
    rm2 = load_roles("reward", cfg, torch.device("cpu")).reward_model
    assert torch.equal(rm2.head.weight, w)  # seeded
    # the backbone came from the LM directory
    assert torch.equal(rm.backbone.embed_tokens.weight, lm.model.embed_tokens.weight)

    with torch.no_grad():
        rm.head.weight.fill_(0.5)
    rm.save_pretrained(tmp_path / "rm")
    tok.save_pretrained(tmp_path / "rm")
    cfg.model.path = str(tmp_path / "rm")
    kept = load_roles("reward", cfg, torch.device("cpu")).reward_model
    assert bool((kept.head.weight == 0.5).all())


def test_cli_runs_example_config_and_refuses_bad_keys(toy, tmp_path, capsys):
    from fourfold.cli import main

    overrides = ["model.path=null", "model.from_scratch=true", f"model.tokenizer={toy['tok']}", "model.hidden_size=32",
                 "model.num_layers=1", "model.num_heads=2", "model.max_positions=32", f"data.train={toy['train']}",
                 "train.max_len=16", "train.max_steps=3", "run.progress=false", "run.tensorboard=false"]
    out = tmp_path / "cli"
    assert main(["reward", "--config", EXAMPLE, "--output-dir", str(out), *overrides]) == 0
    assert (out / "model" / "model.safetensors").is_file()
    assert "rm/eval_accuracy" in read_metrics(out / "metrics.jsonl")[-1]  # default eval_fraction 0.1

    capsys.readouterr()
    assert main(["reward", "--config", EXAMPLE, "reward.margn=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "reward.margn" in err and "did you mean 'reward.margin'" in err
    assert load_config(RewardConfig, EXAMPLE).data.train.startswith("path/to/")
