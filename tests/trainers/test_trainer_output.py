"""Run output of the trainers on tiny models: plain lines and the summary line through a pipe,
TensorBoard event files, samples.jsonl (with the probe's per-response values), the W&B sink in
offline mode, and saved tokenizers ready for batched generation in plain transformers."""
import glob
import json
import os
import re

import pytest

from fourfold.cli import main
from fourfold.config import ReinforceConfig, load_config
from fourfold.reporting import read_metrics

TINY = ["generation.max_new_tokens=4", "run.device=cpu", "run.threads=1"]


def test_ppo_off_a_terminal(tiny_lm, tmp_path, capfd):
    """`fourfold ppo ... | tee` (stdout and stderr are not terminals here): one plain line per
    iteration, rounded, no control characters, then the summary line; event files, samples.jsonl
    and left-padding tokenizers are written."""
    out = tmp_path / "run"
    assert main(["ppo", f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}", "model.critic_init=reward",
                 f"data.prompts={tiny_lm / 'prompts.jsonl'}", "ppo.iterations=3", "ppo.rollout_batch_size=4",
                 "ppo.minibatch_size=2", "run.samples_every=2", "run.save_every=3", f"run.output_dir={out}", *TINY]) == 0
    stdout, stderr = capfd.readouterr()
    assert not re.search(r"[\x1b\r]", stdout + stderr)  # no progress-bar control characters
    estimate, *lines, last = stdout.splitlines()  # one stream: the estimate, the rows, the summary (stderr: errors)
    assert estimate.startswith("fourfold ppo: memory estimate") and stderr == "", stderr
    assert len(lines) == 3
    for i, line in enumerate(lines, start=1):
        m = re.fullmatch(rf"ppo {i}/3: reward/score_mean=(\S+) kl/k1=(\S+) \([\d.]+ s(?:, about [\d.]+ (?:s|min|h) left)?\)",
                         line)
        assert m, line
        assert ("left)" in line) == (i < 3), line  # the time left while iterations remain
        digits = [re.sub(r"e.*", "", v).lstrip("-").replace(".", "").lstrip("0") for v in m.groups()]
        assert all(len(d) <= 4 for d in digits), line  # 4 significant digits
    head, _, where = last.partition(" s: ")
    assert re.fullmatch(r"fourfold ppo: done in [\d.]+", head), last
    assert where == (f"model {out}/policy, critic {out}/critic, metrics {out}/metrics.jsonl, samples {out}/samples.jsonl, "
                     f"tensorboard {out}/tensorboard, checkpoints {out}/checkpoints, "
                     "last checkpoint step-00000003 (--resume with more steps extends the run from it)")

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("reward/score_mean")] == [1, 2, 3]
    assert [e.step for e in acc.Tensors("samples/text_summary")] == [2, 3]

    samples = read_metrics(out / "samples.jsonl")
    prompts = {json.loads(line)["prompt"] for line in (tiny_lm / "prompts.jsonl").read_text().splitlines()}
    assert [r["step"] for r in samples] == [2] * 4 + [3] * 4  # every 2 iterations and the last one
    assert all(set(r) == {"step", "prompt", "response", "score"} and r["prompt"] in prompts
               and isinstance(r["response"], str) and isinstance(r["score"], float) for r in samples)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out / "policy")
    assert tok.padding_side == "left" and AutoTokenizer.from_pretrained(out / "critic").padding_side == "right"
    batch = tok(["w1", "w2 w3 w4"], return_tensors="pt", padding=True)
    assert batch.attention_mask.tolist() == [[0, 0, 1], [1, 1, 1]]
    gen = AutoModelForCausalLM.from_pretrained(out / "policy").generate(**batch, max_new_tokens=2, do_sample=False,
                                                                        pad_token_id=tok.pad_token_id)
    assert gen.shape == (2, 5)


def _reinforce(tiny_lm, out, *extra):
    return load_config(ReinforceConfig, None, [
        f"model.policy={tiny_lm / 'sft'}", f"model.reward_fn={tiny_lm / 'reward_fn.py'}:reward",
        f"data.prompts={tiny_lm / 'prompts.jsonl'}", "reinforce.iterations=3", "reinforce.rollout_batch_size=4",
        "run.samples_every=2", f"run.output_dir={out}", "run.progress=false", "run.tensorboard=false", *TINY, *extra])


def test_reinforce_samples_carry_the_probes_per_response_values(tiny_lm, tmp_path, capsys):
    from fourfold.trainers.reinforce import train

    calls = {"probe": 0, "per_response": 0}

    def probe(prompts, responses):
        calls["probe"] += 1
        return {"probe/words": sum(len(r.split()) for r in responses) / len(responses)}

    def per_response(prompts, responses):
        calls["per_response"] += 1
        return {"words": [len(r.split()) for r in responses], "prompt_words": [len(p.split()) for p in prompts]}

    probe.per_response = per_response
    train(_reinforce(tiny_lm, tmp_path / "run"), probe=probe)
    assert calls == {"probe": 3, "per_response": 2}  # the probe as before; per_response on sample iterations
    rows = read_metrics(tmp_path / "run" / "samples.jsonl")
    assert [r["step"] for r in rows] == [2] * 4 + [3] * 4
    for r in rows:
        assert r["words"] == len(r["response"].split()) and r["prompt_words"] == len(r["prompt"].split())
        assert r["score"] == r["response"].split().count("w7") / 4.0  # the reward_fn's score of that response
    out = capsys.readouterr().out
    assert out.splitlines()[-1].startswith("fourfold reinforce: done in ")  # progress off: only the summary
    assert len(out.splitlines()) == 1

    train(_reinforce(tiny_lm, tmp_path / "off", "run.samples_every=0"))
    assert not (tmp_path / "off" / "samples.jsonl").exists()


def test_wandb_sink_in_offline_mode(tiny_lm, tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from fourfold.trainers.reinforce import train

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    train(_reinforce(tiny_lm, tmp_path / "run", "run.report_to=[wandb]"))
    wandb.teardown()  # the W&B service writes the run's log file after finish() returns: wait for it
    (run_dir,) = glob.glob(str(tmp_path / "wandb_dir" / "wandb" / "offline-run-*"))
    (log,) = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    data = open(log, "rb").read()
    assert b"reward/score_mean" in data and b"policy/loss" in data  # the metrics went into the run
    tables = sorted(glob.glob(os.path.join(run_dir, "files", "media", "table", "samples_*.table.json")))
    assert len(tables) == 2  # iterations 2 and 3
    table = json.loads(open(tables[0]).read())
    assert table["columns"] == ["prompt", "response", "score"] and len(table["data"]) == 4
    assert not (tmp_path / "run" / "tensorboard").exists()  # run.tensorboard=false and not listed


def test_saved_tokenizers_pad_left_next_to_generative_models_only(tiny_lm, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from fourfold.models.loading import load_tokenizer
    from fourfold.run.export import save_hf

    tok = load_tokenizer(str(tiny_lm / "sft"))
    save_hf(AutoModelForCausalLM.from_pretrained(tiny_lm / "sft"), tok, tmp_path / "lm")
    save_hf(AutoModelForSequenceClassification.from_pretrained(tiny_lm / "rm"), tok, tmp_path / "rm")
    assert AutoTokenizer.from_pretrained(tmp_path / "lm").padding_side == "left"
    assert AutoTokenizer.from_pretrained(tmp_path / "rm").padding_side == "right"  # what a classifier batch expects
    for d in ("lm", "rm"):  # fourfold's own loading chooses its side whatever was saved
        assert load_tokenizer(str(tmp_path / d)).padding_side == "left"
        ids = load_tokenizer(str(tmp_path / d))("w1 w2", add_special_tokens=False)["input_ids"]
        assert ids == tok("w1 w2", add_special_tokens=False)["input_ids"]
