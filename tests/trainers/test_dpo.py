"""DPO trainer: the pair layout, learning separable pairs (loss falls from log 2, accuracy rises),
the exported model under plain transformers, exact resume after SIGKILL, the reference role, IPO,
config errors and the CLI with examples/dpo.yaml."""
import json
import math
import os
import random
import subprocess
import sys
import typing

import pytest
import safetensors.torch
import torch

from fourfold.checkpoint import latest_checkpoint
from fourfold.config import ConfigError, DPOAlgoConfig, DPOConfig, load_config
from fourfold.core import DPO_LOSSES
from fourfold.data import collate_pair_responses, encode_preferences, load_preferences
from fourfold.errors import ModelLoadError
from fourfold.models.factory import llama_config, random_causal_lm
from fourfold.models.loading import load_causal_lm, load_tokenizer
from fourfold.models.roles import FrozenReference
from fourfold.reporting import is_timing_key, read_metrics
from fourfold.tasks.tokenizer import build_word_tokenizer
from fourfold.trainers import dpo

WORDS = [f"w{i}" for i in range(20)]
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "dpo.yaml")


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _pairs(n, seed):
    """Separable pairs: the chosen response holds 'good', the rejected one 'bad', at a random place
    among random filler words (responses of different lengths, so padding is exercised)."""
    rng = random.Random(seed)

    def resp(tag):
        ws = [rng.choice(WORDS) for _ in range(rng.randrange(2, 5))]
        ws.insert(rng.randrange(len(ws) + 1), tag)
        return " ".join(ws)

    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(1, 4))),
             "chosen": resp("good"), "rejected": resp("bad")} for _ in range(n)]


def _save_lm(tok, path, seed, vocab=None):
    lm = random_causal_lm(llama_config(vocab or len(tok), 32, 1, 2, pad_token_id=tok.pad_token_id,
                                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id), seed=seed)
    lm.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A word tokenizer, a tiny random Llama standing in for the SFT model, separable pairs."""
    d = tmp_path_factory.mktemp("dpo_toy")
    build_word_tokenizer(WORDS + ["good", "bad"], d / "tok")
    tok = load_tokenizer(str(d / "tok"))
    return {"dir": d, "tok": tok, "sft": _save_lm(tok, d / "sft", seed=0),
            "train": _write_jsonl(d / "train.jsonl", _pairs(64, 0)), "eval": _write_jsonl(d / "eval.jsonl", _pairs(32, 1))}


def _overrides(toy, out, *extra) -> list[str]:
    return [f"model.path={toy['sft']}", f"data.train={toy['train']}", "train.batch_size=16", "train.lr=1e-2",
            "train.max_len=16", "train.log_every=1", "run.threads=1", f"run.output_dir={out}", "run.device=cpu",
            "run.progress=false", "run.tensorboard=false", *extra]


def _cfg(toy, out, *extra) -> DPOConfig:
    return load_config(DPOConfig, None, _overrides(toy, out, *extra))


def _rows(out):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(os.path.join(out, "metrics.jsonl"))]


def _weights(path):
    return safetensors.torch.load_file(str(path))


def _plain_logps(model, ids: list[int], n_prompt: int) -> float:
    """log pi(response | prompt) of one unpadded row with plain transformers: the sum over the
    response tokens (EOS included) of log_softmax(logits[t - 1])[ids[t]]."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()  # (L, V)
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
    return float(lp[n_prompt - 1:].sum())


def test_pairs_are_laid_out_as_ppo_scores_responses(toy):
    tok = toy["tok"]
    examples = encode_preferences(load_preferences(toy["train"]).records[:3], tok, 16)
    batch = collate_pair_responses(examples, tok.pad_token_id)
    P = max(e.num_prompt_tokens for e in examples)
    rows = [(e.chosen_ids, e.num_prompt_tokens) for e in examples] + [(e.rejected_ids, e.num_prompt_tokens)
                                                                       for e in examples]
    assert batch["input_ids"].shape == (6, P + batch["response_mask"].shape[1])
    for b, (ids, n) in enumerate(rows):
        got = batch["input_ids"][b][batch["attention_mask"][b].bool()].tolist()
        assert got == ids and ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
        assert batch["attention_mask"][b, :P].sum() == n  # the prompt, left-padded to P
        assert batch["response_mask"][b].tolist() == batch["attention_mask"][b, P:].tolist()
        assert batch["response_mask"][b].sum() == len(ids) - n  # the response + EOS, right-padded


def test_loss_falls_and_accuracy_rises_and_the_export_loads_with_plain_transformers(toy, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    res = dpo.train(_cfg(toy, out, "train.max_steps=24", f"data.eval={toy['eval']}", "train.eval_every=8"))
    rows = read_metrics(out / "metrics.jsonl")
    # step 1 runs the policy at the reference: loss log 2, margin 0
    assert abs(rows[0]["dpo/loss"] - math.log(2)) < 1e-4 and abs(rows[0]["dpo/reward_margin"]) < 1e-4
    # measured: eval accuracy 1.0 from step 8 on; eval loss 0.40, 0.24, 0.20 at steps 8, 16, 24;
    # training loss 0.13 and margin 2.05 at step 24
    evals = [r for r in rows if "dpo/eval_accuracy" in r]
    assert [r["step"] for r in evals] == [8, 16, 24]
    assert evals[0]["dpo/eval_loss"] > evals[1]["dpo/eval_loss"] > evals[2]["dpo/eval_loss"]
    final = res["final"]
    assert final["dpo/eval_accuracy"] > 0.9 and final["dpo/accuracy"] > 0.9
    assert final["dpo/loss"] < 0.25 and final["dpo/eval_loss"] < 0.3
    assert final["dpo/chosen_reward"] > 0 > final["dpo/rejected_reward"] and final["dpo/eval_reward_margin"] > 1
    assert final["dpo/chosen_logps"] > final["dpo/rejected_logps"]
    assert {"dpo/lr", "dpo/grad_norm", "train/nonfinite_skips", "time/step_s"} <= set(final)

    # plain transformers loads the export; its sequence log-probs (one unpadded row at a time) are
    # the trainer's (padded, stacked) and rank the held-out pairs as the trainer's accuracy says
    policy = AutoModelForCausalLM.from_pretrained(res["model"]).eval()
    ref = AutoModelForCausalLM.from_pretrained(toy["sft"]).eval()
    examples = encode_preferences(load_preferences(toy["eval"]).records, load_tokenizer(res["model"]), 16)
    chosen, rejected = dpo.all_pair_logps(dpo.policy_logprobs(policy), examples, 5, toy["tok"].pad_token_id,
                                          torch.device("cpu"))
    plain = [_plain_logps(policy, e.chosen_ids, e.num_prompt_tokens) for e in examples]
    torch.testing.assert_close(chosen.double(), torch.tensor(plain, dtype=torch.float64), atol=1e-4, rtol=1e-5)
    wins = [(_plain_logps(policy, e.chosen_ids, e.num_prompt_tokens) - _plain_logps(ref, e.chosen_ids, e.num_prompt_tokens))
            > (_plain_logps(policy, e.rejected_ids, e.num_prompt_tokens) - _plain_logps(ref, e.rejected_ids, e.num_prompt_tokens))
            for e in examples]
    assert sum(wins) / len(wins) == final["dpo/eval_accuracy"]
    assert bool((chosen > rejected).float().mean() > 0.9)


def test_tied_pairs_are_left_out_with_one_warning(toy, tmp_path):
    rows = _pairs(6, 3)
    rows[2] = dict(rows[2], rejected=rows[2]["chosen"])
    path = _write_jsonl(tmp_path / "prefs.jsonl", rows)
    out = tmp_path / "run"
    dpo.train(_cfg(toy, out, f"data.train={path}", "data.eval_fraction=0", "train.max_steps=1", "train.batch_size=5"))
    warnings = [e["message"] for e in read_metrics(out / "events.jsonl") if e["kind"] == "warning"]
    assert warnings == [f"1 tied preference pair left out ('chosen' and 'rejected' the same: no preference to learn); "
                        f"first: {path}:3: 'chosen' and 'rejected' are identical"]


def test_resume_after_sigkill_is_exact(toy, tmp_path):
    args = ["train.max_steps=14", "data.eval_fraction=0.25", "train.eval_every=5", "train.log_every=3"]
    full = tmp_path / "full"
    dpo.train(_cfg(toy, full, *args))

    # a real SIGKILL in the middle of step 11 (no handler runs, no finally): checkpoints at 4 and 8
    part = tmp_path / "part"
    script = (
        "import os, signal, sys\n"
        "from fourfold.config import DPOConfig, load_config\n"
        "from fourfold.run import optim\n"
        "from fourfold.trainers import dpo\n"
        "real, calls = optim.clip_and_step, [0]\n"
        "def step(*a, **k):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 11:\n"
        "        os.kill(os.getpid(), signal.SIGKILL)\n"
        "    return real(*a, **k)\n"
        "optim.clip_and_step = step  # the guarded step calls it through run.optim\n"
        "dpo.train(load_config(DPOConfig, None, sys.argv[1:]))\n"
    )
    argv = _overrides(toy, part, *args, "run.save_every=4")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run([sys.executable, "-c", script, *argv], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert latest_checkpoint(part).name == "step-00000008"
    assert [r["step"] for r in read_metrics(part / "metrics.jsonl")][-1] == 10  # rows past the checkpoint
    assert not (part / "model").exists()

    res = dpo.train(_cfg(toy, part, *args, "run.save_every=4", "run.resume=true"))
    assert _rows(part) == _rows(full)
    assert "dpo/eval_accuracy" in res["final"]
    model = [_weights(d / "model" / "model.safetensors") for d in (full, part)]
    assert model[0].keys() == model[1].keys() and all(torch.equal(model[0][k], model[1][k]) for k in model[0])
    ck = [_weights(latest_checkpoint(d) / "modules" / "policy.safetensors") for d in (full, part)]
    assert all(torch.equal(ck[0][k], ck[1][k]) for k in ck[0])


def test_a_reference_role_ipo_and_a_reference_of_another_vocabulary(toy, tmp_path):
    args = ["train.max_steps=2", "data.eval_fraction=0"]
    dpo.train(_cfg(toy, tmp_path / "default", *args))
    role = FrozenReference(load_causal_lm(toy["sft"]))
    dpo.train(_cfg(toy, tmp_path / "role", *args), reference=role)
    assert _rows(tmp_path / "role") == _rows(tmp_path / "default")

    # IPO at the reference: h = 0, loss = (0 - 1/(2 beta))^2 = 25 for beta 0.1 (per-token or summed)
    for kind in ("ipo", "ipo_sum"):
        res = dpo.train(_cfg(toy, tmp_path / kind, "train.max_steps=1", "data.eval_fraction=0", f"dpo.loss={kind}"))
        assert abs(res["final"]["dpo/loss"] - 25.0) < 1e-3

    other = _save_lm(toy["tok"], tmp_path / "other", seed=1, vocab=len(toy["tok"]) + 3)
    with pytest.raises(ModelLoadError, match=r"dpo\.reference: .*other has 29 token embeddings, model\.path 26"):
        dpo.train(_cfg(toy, tmp_path / "bad", *args, f"dpo.reference={other}"))


def test_ipo_step_takes_per_token_means_of_plain_transformers_log_probs(toy, tmp_path):
    """The trainer's 'ipo' step loss, by hand from plain transformers: per pair, the log-ratio of
    each response summed over its tokens (EOS included) and divided by their number; 'ipo_sum' and
    'sigmoid' on the sums."""
    tok = toy["tok"]
    policy = load_causal_lm(_save_lm(tok, tmp_path / "policy", seed=1))
    ref = load_causal_lm(toy["sft"])
    examples = encode_preferences(load_preferences(toy["train"]).records[:6], tok, 16)
    tokens = dpo.response_tokens(examples)
    assert tokens[0].tolist() == [len(e.chosen_ids) - e.num_prompt_tokens for e in examples]
    assert len(set(tokens[0].tolist() + tokens[1].tolist())) > 1  # responses of several lengths

    def ratio(e, ids):
        return _plain_logps(policy, ids, e.num_prompt_tokens) - _plain_logps(ref, ids, e.num_prompt_tokens)

    batch = dpo.pair_batch(examples, tok.pad_token_id, torch.device("cpu"))
    refs = dpo.all_pair_logps(FrozenReference(ref).logprobs, examples, 4, tok.pad_token_id, torch.device("cpu"))
    beta, target = 0.5, 1.0
    sums = [(ratio(e, e.chosen_ids), ratio(e, e.rejected_ids)) for e in examples]
    means = [(c / nc, r / nr) for (c, r), nc, nr in zip(sums, tokens[0].tolist(), tokens[1].tolist())]
    for kind, margins in (("ipo", means), ("ipo_sum", sums)):
        loss = dpo.step_loss(policy, batch, refs, DPOAlgoConfig(beta=beta, loss=kind), tokens)[0].detach()
        expected = sum((c - r - target) ** 2 for c, r in margins) / len(margins)
        assert abs(float(loss) - expected) < 1e-4 * max(1.0, expected), (kind, float(loss), expected)
    loss = dpo.step_loss(policy, batch, refs, DPOAlgoConfig(beta=beta))[0].detach()
    expected = sum(math.log1p(math.exp(-beta * (c - r))) for c, r in sums) / len(sums)
    assert abs(float(loss) - expected) < 1e-4


def test_memory_levers_apply_to_the_policy_and_the_reference(toy, tmp_path, monkeypatch):
    """model.gradient_checkpointing gives the same rows; model.precision=bf16-mixed runs the
    reference's log-probs and the policy's forwards under bf16 autocast (float32 weights) with rows
    close to fp32's; model.precision=bf16 loads policy and reference in bf16."""
    args = ["train.max_steps=3", "data.eval_fraction=0.25", "train.eval_every=2"]
    dpo.train(_cfg(toy, tmp_path / "plain", *args))
    dpo.train(_cfg(toy, tmp_path / "ckpt", *args, "model.gradient_checkpointing=true"))
    plain, ckpt = _rows(tmp_path / "plain"), _rows(tmp_path / "ckpt")
    assert len(plain) == 3 and all(r.keys() == c.keys() for r, c in zip(plain, ckpt))
    for r, c in zip(plain, ckpt):
        assert all(math.isclose(r[k], c[k], rel_tol=1e-5, abs_tol=1e-6) for k in r), (r, c)

    seen = []  # (autocast on, weights dtype) of each reference forward
    reference_logps = dpo.reference_logps

    def spy(reference, *a, **kw):
        seen.append((torch.is_autocast_enabled("cpu"), next(reference.model.parameters()).dtype))
        return reference_logps(reference, *a, **kw)

    monkeypatch.setattr(dpo, "reference_logps", spy)
    dpo.train(_cfg(toy, tmp_path / "mixed", *args, "model.precision=bf16-mixed"))
    mixed = _rows(tmp_path / "mixed")
    assert seen == [(True, torch.float32)] and _weights(tmp_path / "mixed" / "model" / "model.safetensors")[
        "lm_head.weight"].dtype == torch.float32
    assert all(math.isfinite(r["dpo/loss"]) for r in mixed) and abs(mixed[0]["dpo/loss"] - plain[0]["dpo/loss"]) < 0.02
    dpo.train(_cfg(toy, tmp_path / "bf16", "train.max_steps=1", "data.eval_fraction=0", "model.precision=bf16"))
    assert seen[-1] == (False, torch.bfloat16)


def _err(overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(DPOConfig, None, overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize("overrides,fragment", [
    (["dpo.beta=0"], "dpo.beta: must be > 0, got 0"),
    (["dpo.beta=-0.1"], "dpo.beta: must be > 0, got -0.1"),
    (["dpo.loss=hinge"], "dpo.loss: expected one of 'sigmoid', 'ipo', 'ipo_sum', got 'hinge'"),
    (["dpo.label_smoothing=0.5"], "dpo.label_smoothing: must be in [0, 0.5), got 0.5"),
    (["dpo.label_smoothing=-0.1"], "dpo.label_smoothing: must be in [0, 0.5), got -0.1"),
    (["dpo.loss=ipo", "dpo.label_smoothing=0.1"], "dpo.label_smoothing: applies to loss: sigmoid only"),
    (["dpo.loss=ipo_sum", "dpo.label_smoothing=0.1"], "loss: ipo_sum has none"),
    (["dpo.bta=1"], "dpo.bta: unknown key (did you mean 'dpo.beta'?)"),
    (["model.path=null", "model.from_scratch=true", "model.tokenizer=t"], "model.from_scratch: DPO starts from a trained"),
    (["model.path=null"], "model.path: missing"),
])
def test_config_errors_are_one_line_and_name_the_key(overrides, fragment):
    assert fragment in _err(["model.path=sft", "data.train=p.jsonl", *overrides])


def test_config_defaults_and_loss_names():
    cfg = load_config(DPOConfig, None, ["model.path=sft", "data.train=p.jsonl"])
    assert (cfg.dpo.beta, cfg.dpo.label_smoothing, cfg.dpo.loss, cfg.dpo.reference) == (0.1, 0.0, "sigmoid", None)
    assert cfg.run.output_dir == "runs/dpo" and cfg.train.lr == 1e-6 and cfg.data.eval_fraction == 0.1
    assert typing.get_args(typing.get_type_hints(DPOAlgoConfig)["loss"]) == DPO_LOSSES


def test_cli_runs_the_example_config(toy, tmp_path, capsys):
    from fourfold.cli import STAGES, main

    assert (STAGES["dpo"].config, STAGES["dpo"].run) == ("fourfold.config:DPOConfig", "fourfold.trainers.dpo:train")
    example = load_config(DPOConfig, EXAMPLE)
    assert example == DPOConfig(model=example.model, data=example.data)  # the example states the defaults
    assert example.model.path.startswith("path/to/") and example.data.train.startswith("path/to/")
    out = tmp_path / "cli"
    overrides = [f"model.path={toy['sft']}", f"data.train={toy['train']}", "train.max_len=16", "train.max_steps=2",
                 "run.device=cpu", "run.progress=false", "run.tensorboard=false"]
    assert main(["dpo", "--config", EXAMPLE, "--output-dir", str(out), *overrides]) == 0
    assert (out / "model" / "model.safetensors").is_file()
    assert "dpo/eval_accuracy" in read_metrics(out / "metrics.jsonl")[-1]  # default eval_fraction 0.1
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("fourfold dpo: done in ")  # the summary line

    # the directory now holds a run: refused without a flag, rerun from scratch with --overwrite
    assert main(["dpo", "--config", EXAMPLE, "--output-dir", str(out), *overrides]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main(["dpo", "--overwrite", "--config", EXAMPLE, "--output-dir", str(out), *overrides]) == 0
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if "dpo/loss" in r] == [2]  # the new run's row alone

    capsys.readouterr()
    assert main(["dpo", "--config", EXAMPLE, *overrides, "dpo.loss=hinge"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "dpo.loss: expected one of 'sigmoid', 'ipo'" in err
