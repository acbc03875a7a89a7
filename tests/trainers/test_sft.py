"""SFT trainer: loss masking, learning a memorisable toy set, HF round trip, exact resume, CLI."""
import json
import os
import random
import signal

import pytest
import safetensors.torch
import torch

from fourfold.config import SFTConfig, load_config
from fourfold.core import logprobs_from_logits
from fourfold.data import collate_sft, tokenize_prompts
from fourfold.errors import DataError
from fourfold.models.build import load_roles
from fourfold.reporting import is_timing_key, read_metrics
from fourfold.tasks.tokenizer import build_word_tokenizer
from fourfold.trainers import sft

WORDS = [f"w{i}" for i in range(20)]
PROMPT_WORDS = [f"q{i}" for i in range(16)] + ["ask"]


def _write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """16 prompt/completion pairs (each prompt unique, completions random words), a word tokenizer."""
    d = tmp_path_factory.mktemp("sft_toy")
    rng = random.Random(0)
    rows = [{"prompt": f"q{i} ask", "completion": " ".join(rng.choice(WORDS) for _ in range(4))} for i in range(16)]
    build_word_tokenizer(WORDS + PROMPT_WORDS, d / "tok")
    return {"dir": d, "tok": str(d / "tok"), "train": _write_jsonl(d / "train.jsonl", rows), "rows": rows}


def _cfg(toy, out, *extra) -> SFTConfig:
    return load_config(SFTConfig, None, [
        "model.from_scratch=true", f"model.tokenizer={toy['tok']}", "model.hidden_size=64", "model.num_layers=2",
        "model.num_heads=4", "model.max_positions=32", f"data.train={toy['train']}", "train.batch_size=16",
        "train.lr=3e-3", "train.warmup_steps=10", "train.max_len=16", "train.log_every=1",
        f"run.output_dir={out}", "run.device=cpu", "run.progress=false", "run.tensorboard=false", *extra,
    ])


def _rows(out):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(os.path.join(out, "metrics.jsonl"))]


def test_prompt_tokens_carry_no_loss(toy):
    from fourfold.models.loading import load_tokenizer

    tok = load_tokenizer(toy["tok"])
    examples, skipped, _ = sft.encode_file(toy["train"], tok, 16, "raise")
    assert skipped == [] and len(examples) == 16
    # a prompt encoded for PPO is a prefix of the same example's SFT ids
    ppo_prompts = tokenize_prompts([r["prompt"] for r in toy["rows"]], tok, 16)
    for e, p in zip(examples, ppo_prompts):
        assert e.input_ids[: len(p)] == p and e.num_prompt_tokens == len(p)
        assert e.input_ids[0] == tok.bos_token_id and e.input_ids[-1] == tok.eos_token_id
    batch = collate_sft(examples[:3], tok.pad_token_id)
    for b, e in enumerate(examples[:3]):
        n, P = len(e.input_ids), e.num_prompt_tokens
        assert batch["loss_mask"][b, :P].sum() == 0  # BOS and prompt
        assert bool(batch["loss_mask"][b, P:n].all())  # completion + EOS
        assert batch["loss_mask"][b, n:].sum() == 0  # padding
    # the trainer's loss is the mean NLL of completion tokens only: prompt targets do not move it
    torch.manual_seed(0)
    model = load_roles("sft", _cfg(toy, toy["dir"] / "unused"), torch.device("cpu")).policy
    loss, _ = sft.batch_loss(model, batch)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    nll = -logprobs_from_logits(logits[:, :-1], batch["input_ids"][:, 1:])
    m = batch["loss_mask"][:, 1:].bool()
    torch.testing.assert_close(loss, nll[m].mean())
    # position t is trained iff its target t+1 is a completion token (or the EOS)
    for b, e in enumerate(examples[:3]):
        expected = torch.zeros(m.shape[1], dtype=torch.bool)
        expected[e.num_prompt_tokens - 1 : len(e.input_ids) - 1] = True
        assert torch.equal(m[b], expected)


def test_loss_falls_and_model_reloads_with_plain_transformers(toy, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from fourfold.run import export  # the final export (save_trained) calls save_hf from there

    saved = {}
    real_save = export.save_hf

    def capture(model, tok, path):
        saved["model"] = model
        return real_save(model, tok, path)

    monkeypatch.setattr(export, "save_hf", capture)
    out = tmp_path / "run"
    res = sft.train(_cfg(toy, out, "train.max_steps=150", f"data.eval={toy['train']}"))
    rows = read_metrics(out / "metrics.jsonl")
    first, last = rows[0]["sft/loss"], rows[-1]["sft/loss"]
    # measured: 3.72 at step 1 (ln 41 = 3.71: uniform over the vocabulary), 0.007 at step 150
    assert first > 3.0, first
    assert last < 0.1, last
    assert res["final"]["sft/eval_loss"] < 0.1 and res["final"]["sft/token_accuracy"] == 1.0
    assert len(rows) == 150 and res["model"] == str(out / "model")

    reloaded = AutoModelForCausalLM.from_pretrained(res["model"])
    tok = AutoTokenizer.from_pretrained(res["model"])
    assert tok.pad_token_id is not None and tok.pad_token_id != tok.eos_token_id
    ids = torch.tensor([tokenize_prompts(["q3 ask"], tok, 8)[0]])
    model = saved["model"].eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, reloaded(input_ids=ids).logits)
        # the model memorised the toy set: greedy decoding after a prompt gives its completion
        gen = reloaded.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id)
    assert tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True) == toy["rows"][3]["completion"]
    assert (out / "config.yaml").is_file()


def test_too_long_example_names_file_and_line(toy, tmp_path):
    path = _write_jsonl(tmp_path / "long.jsonl", [toy["rows"][0], {"prompt": "q1 ask", "completion": " ".join(WORDS)}])
    with pytest.raises(DataError, match=r"long\.jsonl:2: .*max_len=16"):
        sft.train(_cfg(toy, tmp_path / "run", f"data.train={path}", "train.max_steps=1"))


def test_skip_mode_trains_on_the_rest_and_warns(toy, tmp_path):
    path = _write_jsonl(tmp_path / "mixed.jsonl", [*toy["rows"][:4], {"prompt": "q1 ask", "completion": " ".join(WORDS)},
                                                   {"prompt": "q2"}])
    out = tmp_path / "run"
    sft.train(_cfg(toy, out, f"data.train={path}", "data.on_error=skip", "train.max_steps=2", "train.batch_size=4"))
    warnings = [e for e in read_metrics(out / "events.jsonl") if e["kind"] == "warning"]
    assert len(warnings) == 1 and "2 bad rows skipped" in warnings[0]["message"]
    assert "mixed.jsonl:5:" in warnings[0]["message"]


def test_non_finite_losses_stop_with_the_last_good_weights(toy, tmp_path, monkeypatch):
    from fourfold.errors import NonFiniteError

    real_loss = sft.sft_loss
    calls = {"n": 0}

    def loss_nan_after_two(logits, labels, mask):
        calls["n"] += 1
        loss, stats = real_loss(logits, labels, mask)
        return (loss * float("nan") if calls["n"] > 2 else loss), stats

    monkeypatch.setattr(sft, "sft_loss", loss_nan_after_two)
    out = tmp_path / "run"
    with pytest.raises(NonFiniteError, match="3 consecutive non-finite"):
        sft.train(_cfg(toy, out, "train.max_steps=10", "run.save_every=2"))
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["train/nonfinite_skips"] for r in rows] == [0, 0, 1, 2]  # the 3rd skip raised before its row
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step-00000004", "step-00000005"]
    a = safetensors.torch.load_file(str(out / "checkpoints" / ckpts[0] / "modules" / "model.safetensors"))
    b = safetensors.torch.load_file(str(out / "checkpoints" / ckpts[1] / "modules" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # skipped steps never touched the weights


def test_resume_after_sigterm_is_exact(toy, tmp_path, monkeypatch):
    full = tmp_path / "full"
    sft.train(_cfg(toy, full, "train.max_steps=12", "train.batch_size=5", "train.log_every=2"))

    # interrupted run: SIGTERM arrives during step 5 -> checkpoint at 5, KeyboardInterrupt
    from fourfold.run import optim

    real_step = optim.clip_and_step  # called by the guarded step in run.optim
    calls = {"n": 0}

    def step_then_term(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args, **kwargs)

    part = tmp_path / "part"
    handler_before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(optim, "clip_and_step", step_then_term)
    with pytest.raises(KeyboardInterrupt):
        sft.train(_cfg(toy, part, "train.max_steps=12", "train.batch_size=5", "train.log_every=2"))
    monkeypatch.setattr(optim, "clip_and_step", real_step)
    assert signal.getsignal(signal.SIGTERM) is handler_before  # the trainer put the handler back
    assert sorted(p.name for p in (part / "checkpoints").iterdir()) == ["step-00000005"]
    assert not (part / "model").exists()

    sft.train(_cfg(toy, part, "train.max_steps=12", "train.batch_size=5", "train.log_every=2", "run.resume=true"))
    assert _rows(part) == _rows(full)
    a = safetensors.torch.load_file(str(full / "model" / "model.safetensors"))
    b = safetensors.torch.load_file(str(part / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_runs_example_config_and_refuses_bad_keys(toy, tmp_path, capsys):
    from fourfold.cli import main

    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "sft.yaml")
    overrides = ["model.path=null", "model.from_scratch=true", f"model.tokenizer={toy['tok']}", "model.hidden_size=32",
                 "model.num_layers=1", "model.num_heads=2", "model.max_positions=32", f"data.train={toy['train']}",
                 "train.max_len=16", "train.max_steps=3", "run.progress=false", "run.tensorboard=false"]
    out = tmp_path / "cli"
    assert main(["sft", "--config", example, "--output-dir", str(out), *overrides]) == 0
    assert (out / "model" / "model.safetensors").is_file() and len(read_metrics(out / "metrics.jsonl")) == 1

    capsys.readouterr()
    assert main(["sft", "--config", example, "train.lrr=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "train.lrr" in err and "did you mean 'train.lr'" in err


def test_example_config_is_valid_and_scratch_length_checked():
    from fourfold.errors import ConfigError

    example = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "sft.yaml")
    cfg = load_config(SFTConfig, example)
    assert cfg.data.train.startswith("path/to/") and cfg.model.path.startswith("path/to/")
    with pytest.raises(ConfigError, match="train.max_len"):
        load_config(SFTConfig, example, ["model.from_scratch=true", "model.max_positions=64", "train.max_len=128"])
