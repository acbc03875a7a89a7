"""`fourfold demo`'s report.html on a small fake run directory shaped exactly like the demo's."""
import base64
import json
import random
import shutil
from html.parser import HTMLParser

import pytest

from fourfold.tasks import ReviewTask

N_SHOW = 3


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.imgs, self.token_divs, self.token_spans, self.tags = [], 0, 0, []
        self._in_tokens = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "img":
            self.imgs.append(a.get("src", ""))
        if tag == "div" and a.get("class") == "tokens":
            self.token_divs += 1
            self._in_tokens = 1
        elif tag == "div" and self._in_tokens:
            self._in_tokens += 1
        if tag == "span" and self._in_tokens and "title" in a and a.get("style", "").startswith("background:"):
            self.token_spans += 1

    def handle_endtag(self, tag):
        if tag == "div" and self._in_tokens:
            self._in_tokens -= 1


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def _done(root, name, result):
    d = root / "stages" / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "DONE").write_text(json.dumps({"key": "0123456789abcdef", "result": result}, sort_keys=True))


@pytest.fixture(scope="module")
def fake_run(tmp_path_factory):
    import yaml

    from fourfold.models.factory import llama_config, random_causal_lm, random_scalar_model
    from fourfold.tasks.tokenizer import build_word_tokenizer

    root = tmp_path_factory.mktemp("demo_run")
    task = ReviewTask()
    tok = build_word_tokenizer(task.tokenizer_corpus())
    cfg = llama_config(len(tok), hidden=32, layers=1, heads=2, max_positions=64, pad_token_id=tok.pad_token_id,
                       bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    for name, seed in (("sft", 0), ("policy", 1)):
        random_causal_lm(cfg, seed=seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    for name, seed in (("reward", 2), ("critic", 3)):
        random_scalar_model(cfg, seed=seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    (root / "config.yaml").write_text(yaml.safe_dump({
        "quick": True, "model": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "max_positions": 64},
        "ppo": {"iterations": 6, "gamma": 1.0, "lam": 0.95, "kl_coef": 0.05, "kl_estimator": "k1", "whiten_rewards": False},
        "generation": {"max_new_tokens": 8, "temperature": 1.0, "missing_eos_score": None, "stop_at_eos": True},
        "eval": {"prompts": 5, "samples_in_report": N_SHOW},
        "run": {"output_dir": str(root), "seed": 0},
    }, sort_keys=False))

    # the PPO stage's own config (the per-token view reads its ppo, generation and data sections)
    from fourfold.config import PPOConfig, config_from_dict, save_config

    save_config(config_from_dict(PPOConfig, {
        "model": {"policy": str(root / "sft"), "reward": str(root / "reward"), "critic_init": "reward"},
        "data": {"prompts": str(root / "data" / "ppo_prompts.jsonl"), "task": "review", "max_prompt_len": 16},
        "generation": {"max_new_tokens": 8, "temperature": 1.0, "missing_eos_score": None, "stop_at_eos": True},
        "ppo": {"iterations": 6, "gamma": 1.0, "lam": 0.95, "kl_coef": 0.05, "kl_estimator": "k1", "whiten_rewards": False},
        "run": {"output_dir": str(root / "stages" / "ppo"), "seed": 0},
    }), root / "stages" / "ppo" / "config.yaml")

    # stage results (DONE) and eval.json, with recognisable numbers
    summary = {
        "sft": {"eval_loss": 1.91, "wall_s": 109.48},
        "pairs": {"eval_pairs": 40, "labels_agree_with_gold": 0.747, "labels_prefer_longer": 0.689, "pairs": 160,
                  "slip_eval_pairs": 37, "slips_labels_choose_intact": 0.811, "wall_s": 45.05},
        "reward": {"accuracy_vs_gold": 0.589, "accuracy_vs_labelers": 0.68, "eval_loss": 0.85,
                   "slips_accuracy_vs_gold": 0.543, "wall_s": 92.74},
    }
    ev = {
        "gold_gain_sd": 0.6, "proxy_gain_sd": 1.41,
        "sft": {"gold": 0.125, "gold_std": 0.5, "kl": 0.0, "length": 16.0, "proxy": 0.143, "proxy_std": 0.93,
                "repetition": 0.0, "well_formed": 0.8},
        "ppo": {"gold": 0.375, "gold_std": 0.55, "kl": 3.946, "length": 25.0, "proxy": 1.458, "proxy_std": 0.43,
                "repetition": 0.2, "well_formed": 0.6},
    }
    for name, res in summary.items():
        _done(root, name, res)
    _done(root, "ppo", {"final": {"kl/k1": 4.36, "reward/score_mean": 1.55}, "wall_s": 194.44})
    _done(root, "eval", {**ev, "wall_s": 5.67})
    (root / "eval.json").write_text(json.dumps(ev, indent=2, sort_keys=True))
    summary["eval"] = {**ev, "wall_s": 5.67}

    # metrics.jsonl of each trainer
    rng = random.Random(0)
    _jsonl(root / "stages" / "sft" / "metrics.jsonl",
           [{"step": s, "sft/loss": 4.0 / (1 + s / 50), "sft/token_accuracy": 0.3, "sft/lr": 1e-3, "train/nonfinite_skips": 0}
            for s in (25, 50, 75)] + [{"step": 100, "sft/eval_loss": 1.91, "sft/loss": 1.9, "train/nonfinite_skips": 0}])
    _jsonl(root / "stages" / "reward" / "metrics.jsonl",
           [{"step": s, "rm/accuracy": 0.6 + s / 1000, "rm/loss": 0.6, "train/nonfinite_skips": 0} for s in (25, 50)]
           + [{"step": 75, "rm/accuracy": 0.9, "rm/eval_accuracy": 0.68, "rm/eval_loss": 0.85, "rm/loss": 0.3}])
    _jsonl(root / "stages" / "ppo" / "metrics.jsonl", [
        {"step": i, "iteration": i, "kl/coef": 0.05, "kl/k1": 0.7 * (i - 1), "reward/score_mean": 0.2 * i,
         "reward/score_std": 0.5, "reward/gold_mean": rng.uniform(-0.3, 0.3), "rollout/response_length": 16.0 + i,
         "policy/entropy": 2.0 - 0.05 * i, "value/explained_variance": None if i == 1 else 0.3, "samples": 32 * i}
        for i in range(1, 7)])

    # held-out samples: the same prompts for both models, SFT rows first
    prompts = task.sample_prompts(5, random.Random(4))
    rows = []
    for model, resp in (("sft", "seems sturdy . it is light ."), ("ppo", "is great . i love it . i would recommend it !")):
        for i, p in enumerate(prompts):
            r = resp if i else resp + " <script>alert(1)</script>"  # must come out escaped
            rows.append({"model": model, "prompt": p, "response": r, "proxy": 0.1 * i + (1.0 if model == "ppo" else 0.0),
                         "gold": task.gold_reward([p], [r])[0], "kl": 0.0 if model == "sft" else 2.5})
    _jsonl(root / "stages" / "eval" / "samples.jsonl", rows)
    return root, summary, prompts


def _render(root, summary):
    from fourfold.apps.demo.report import write_report

    path = write_report(root, task=ReviewTask(), summary=summary)
    assert path == root / "report.html" and path.is_file()
    return path.read_text(encoding="utf-8")


def test_report_is_self_contained_and_complete(fake_run):
    root, summary, prompts = fake_run
    page = _render(root, summary)
    parser = _Collect()
    parser.feed(page)
    parser.close()

    # plots: embedded PNGs only, nothing external
    pngs = [s for s in parser.imgs if s.startswith("data:image/png;base64,")]
    assert len(pngs) >= 3 and len(pngs) == len(parser.imgs)
    for src in pngs:
        assert base64.b64decode(src.split(",", 1)[1]).startswith(b"\x89PNG\r\n\x1a\n")
    assert "http://" not in page and "https://" not in page and "<link" not in page and "<script" not in page
    assert "&lt;script&gt;" in page  # sample text is escaped
    assert len(page.encode()) < 1_000_000

    # section 1: stages, wall times, headline numbers
    for text in ("109.5 s", "194.4 s", "0.125", "0.375", "1.458", "3.95", "Gold gain: +0.60 SFT standard deviations",
                 "proxy gain: +1.41", "80%", "60%"):
        assert text in page, text
    # section 2: reward model and the labelers' length bias
    for text in ("68.0%", "58.9%", "74.7%", "68.9%", "81.1%", "54.3%", "it barely sees grammar"):
        assert text in page, text
    # section 4: N before/after rows (from config), scores shown
    assert page.count('<span class="prompt">') >= 2 * N_SHOW
    assert "seems sturdy . it is light ." in page and "i would recommend it !" in page
    # section 5: one heatmap per shown response, spans with tooltips
    assert parser.token_divs == N_SHOW
    assert parser.token_spans >= N_SHOW
    assert "could not be computed" not in page
    # section 6
    assert "fourfold demo --quick --output-dir" in page and "ppo.kl_coef=0</code>" in page and "fourfold experiments" in page

    # deterministic given the run directory
    assert _render(root, summary) == page


def test_report_without_critic_and_without_eval_files(fake_run, tmp_path):
    root, summary, _ = fake_run
    run = tmp_path / "run"
    shutil.copytree(root, run)
    shutil.rmtree(run / "critic")
    (run / "eval.json").unlink()  # falls back to summary["eval"]
    page = _render(run, summary)
    assert "no critic directory found" in page
    assert page.count('<div class="tokens">') == N_SHOW
    assert "Gold gain: +0.60" in page

    shutil.rmtree(run / "policy")  # a broken run directory gives a note, not a crash
    page = _render(run, summary)
    assert "could not be computed" in page
    assert page.count("data:image/png;base64,") >= 3


def test_credit_view_runs_under_the_ppo_stage_config(fake_run, tmp_path):
    """The per-token view takes its settings from stages/ppo/config.yaml (typed) and its models from
    the run directory; without that config it says so instead of guessing defaults."""
    import dataclasses

    from fourfold.apps.demo.credit import credit_config
    from fourfold.config import PPOConfig, load_config, save_config

    root, summary, _ = fake_run
    run = tmp_path / "run"
    shutil.copytree(root, run)
    cfg = credit_config(run)
    assert cfg.ppo.kl_coef == 0.05 and cfg.generation.max_new_tokens == 8 and cfg.data.max_prompt_len == 16
    assert (cfg.model.policy, cfg.model.reference, cfg.model.critic) == (
        str(run / "policy"), str(run / "sft"), str(run / "critic"))
    stage_cfg = run / "stages" / "ppo" / "config.yaml"
    loaded = load_config(PPOConfig, stage_cfg)
    save_config(dataclasses.replace(loaded, ppo=dataclasses.replace(loaded.ppo, kl_coef=0.125)), stage_cfg)
    assert "&minus;0.125&middot;KL" in _render(run, summary)
    stage_cfg.unlink()
    page = _render(run, summary)
    assert "could not be computed" in page and "config file not found" in page


def test_a_kl_estimate_of_zero_is_never_minus_zero_and_the_length_line_is_in_tokens(fake_run, tmp_path):
    """The SFT model's KL to itself, a k1 estimate a hair below 0, reads 0.00 in the headline table
    (the column says why k1 can be negative), and the response-length panel's SFT line is in the
    panel's unit, tokens: the eval's words plus the EOS (one token a word with the review tokenizer)."""
    from fourfold.apps.demo.report import fmt, sft_line

    root, summary, _ = fake_run
    run = tmp_path / "run"
    shutil.copytree(root, run)
    shutil.rmtree(run / "policy")  # the credit view is not what this test reads
    ev = json.loads((run / "eval.json").read_text())
    ev["sft"]["kl"] = -0.0004
    (run / "eval.json").write_text(json.dumps(ev))
    page = _render(run, summary)
    row = page[page.index("KL to SFT reference"):].split("</tr>")[0]
    assert "-0.00" not in row and "<td>0.00</td>" in row.replace(' class="num"', ""), row
    assert "can fall a little below 0" in row
    assert fmt(-0.004, 2) == "0.00" and fmt(-0.006, 2) == "-0.01" and fmt(None) == "n/a"
    assert sft_line("rollout/response_length", None, ev["sft"]) == (17.0, "SFT (held-out eval: words + EOS, in tokens)")
    assert sft_line("kl/k1", "kl", ev["sft"]) == (-0.0004, "SFT (held-out eval)")
    assert sft_line("policy/entropy", None, ev["sft"]) is None
