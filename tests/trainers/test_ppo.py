"""PPO and REINFORCE on tiny random models against a rule-based reward (count of a target word)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from fourfold.config import PPOConfig, ReinforceConfig, load_config
from fourfold.reporting import is_timing_key, read_metrics


def _ppo_overrides(tiny_lm, out, **extra):
    base = {
        "model.policy": tiny_lm / "sft",
        "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
        "model.critic_init": "policy",
        "data.prompts": tiny_lm / "prompts.jsonl",
        "ppo.iterations": 20,
        "ppo.rollout_batch_size": 16,
        "ppo.minibatch_size": 8,
        "ppo.lr": 3e-3,
        "ppo.critic_lr": 1e-3,
        "generation.max_new_tokens": 12,
        "run.output_dir": out,
        "run.progress": False,
        "run.seed": 0,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _mean(rows, key, sl):
    vals = [r[key] for r in rows[sl]]
    return sum(vals) / len(vals)


def test_ppo_raises_reward_and_keeps_kl_finite(tiny_lm, tmp_path):
    from fourfold.models.build import load_roles
    from fourfold.trainers.ppo import train

    cfg = load_config(PPOConfig, None, _ppo_overrides(tiny_lm, tmp_path / "ppo"))
    roles = load_roles("ppo", cfg, torch.device("cpu"))
    train(cfg, roles=roles)
    rows = read_metrics(tmp_path / "ppo" / "metrics.jsonl")
    assert len(rows) == 20
    first, last = _mean(rows, "reward/score_mean", slice(0, 3)), _mean(rows, "reward/score_mean", slice(-3, None))
    # measured (seed 0): ~0.1 -> ~1.3 over 20 iterations; random policy ~ 12 tokens/60 words/4 = 0.05
    assert last > first + 0.5, (first, last)
    assert all(abs(r["kl/k1"]) < 1e3 and r["kl/k1"] == r["kl/k1"] for r in rows)
    assert rows[0]["policy/clipfrac"] >= 0 and rows[-1]["value/explained_variance"] > 0.0
    # the saved policy loads with plain transformers and gives identical logits
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ppo" / "policy")
    ids = torch.tensor([[1, 5, 9, 13, 2]])
    roles.policy.eval()
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, roles.policy(ids).logits)
    assert (tmp_path / "ppo" / "policy" / "model.safetensors").is_file()
    assert (tmp_path / "ppo" / "critic" / "config.json").is_file()
    assert (tmp_path / "ppo" / "config.yaml").is_file()


def test_reinforce_runs_and_improves(tiny_lm, tmp_path):
    from fourfold.trainers.reinforce import train

    over = [o for o in _ppo_overrides(tiny_lm, tmp_path / "rf") if not o.startswith(("ppo.", "model.critic_init"))]
    over += ["reinforce.iterations=20", "reinforce.rollout_batch_size=16", "reinforce.lr=1e-3", "reinforce.baseline=mean"]
    cfg = load_config(ReinforceConfig, None, over)
    train(cfg)
    rows = read_metrics(tmp_path / "rf" / "metrics.jsonl")
    assert len(rows) == 20
    assert _mean(rows, "reward/score_mean", slice(-5, None)) > _mean(rows, "reward/score_mean", slice(0, 3))


def _cli(args, **kw):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "fourfold.cli", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kw)


def _comparable(rows):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in rows]


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "model.safetensors"))


@pytest.mark.parametrize("kill_after_ckpt", [2, 4])
def test_ppo_resume_after_sigkill_is_exact(tiny_lm, tmp_path, kill_after_ckpt):
    """A run killed with SIGKILL, then resumed, ends with the same metrics rows and weights."""
    over = _ppo_overrides(tiny_lm, tmp_path / "full", **{"ppo.iterations": 6, "run.save_every": 1,
                                                          "run.threads": 1})
    p = _cli(["ppo", *over])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out.decode()[-2000:]
    full_rows = read_metrics(tmp_path / "full" / "metrics.jsonl")

    killed = [o.replace(str(tmp_path / "full"), str(tmp_path / "killed")) for o in over]
    p = _cli(["ppo", *killed])
    target = tmp_path / "killed" / "checkpoints" / f"step-{kill_after_ckpt:08d}"
    deadline = time.time() + 300
    while not target.exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert target.exists()
    p = _cli(["ppo", *killed, "run.resume=true"])
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out.decode()[-2000:]
    rows = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert _comparable(rows) == _comparable(full_rows)
    a, b = _weights(tmp_path / "full" / "policy"), _weights(tmp_path / "killed" / "policy")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cli_bad_key_is_one_line_error(tiny_lm, tmp_path):
    cfg = tmp_path / "ppo.yaml"
    cfg.write_text("ppo:\n  kl_coeff: 0.1\n")
    p = subprocess.run([sys.executable, "-m", "fourfold.cli", "ppo", "--config", str(cfg)], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0
    assert "ppo.kl_coeff: unknown key (did you mean 'ppo.kl_coef'?)" in p.stderr
    assert str(cfg) in p.stderr


def test_concurrent_roles_give_identical_results(tiny_lm, tmp_path):
    """Critic epochs in a second thread (and the reference pass beside the reward/critic passes)
    change nothing but the wall time."""
    from fourfold.trainers.ppo import train

    for name, flag in (("seq", "false"), ("conc", "true")):
        cfg = load_config(PPOConfig, None, _ppo_overrides(tiny_lm, tmp_path / name, **{
            "ppo.iterations": 3, "run.concurrent_roles": flag}))
        train(cfg)
    a = _comparable(read_metrics(tmp_path / "seq" / "metrics.jsonl"))
    b = _comparable(read_metrics(tmp_path / "conc" / "metrics.jsonl"))
    assert a == b
    wa, wb = _weights(tmp_path / "seq" / "critic"), _weights(tmp_path / "conc" / "critic")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("stage", ["ppo", "reinforce"])
def test_cli_runs_from_the_example_yaml(tiny_lm, tmp_path, stage):
    from fourfold.cli import main

    algo = "ppo" if stage == "ppo" else "reinforce"
    over = [f"model.policy={tiny_lm / 'sft'}", f"model.reward={tiny_lm / 'rm'}", f"data.prompts={tiny_lm / 'prompts.jsonl'}",
            f"{algo}.iterations=2", f"{algo}.rollout_batch_size=8", "generation.max_new_tokens=4", "run.progress=false",
            "run.device=cpu", "run.save_every=0"]
    if stage == "ppo":
        over.append("ppo.minibatch_size=4")
    root = Path(__file__).resolve().parents[2]
    assert main([stage, "--config", str(root / "examples" / f"{stage}.yaml"), "--output-dir", str(tmp_path / stage), *over]) == 0
    assert len(read_metrics(tmp_path / stage / "metrics.jsonl")) == 2
    assert (tmp_path / stage / "policy" / "model.safetensors").is_file()


def test_missing_eos_score_replaces_the_score(tiny_lm, tmp_path):
    """Responses cut at max_new_tokens without EOS get generation.missing_eos_score."""
    from fourfold.config import GenerationConfig
    from fourfold.models.build import build_roles
    from fourfold.models.plan import plan_roles
    from fourfold.rollout.eager import EagerEngine
    from fourfold.trainers.rollouts import collect

    cfg = load_config(PPOConfig, None, _ppo_overrides(tiny_lm, tmp_path / "x"))
    roles = build_roles(plan_roles("ppo", cfg).without("critic"), torch.device("cpu"))
    torch.manual_seed(0)
    ids = torch.tensor([[1, 5, 6]] * 16)
    gen = GenerationConfig(max_new_tokens=2, temperature=1.0, missing_eos_score=-7.0)
    col = collect(roles, ["w4 w5"] * 16, ids, torch.ones_like(ids), gen, engine=EagerEngine(), kl_coef=0.0)
    no_eos = ~col.samples.finished
    assert bool(no_eos.any())
    assert torch.all(col.rollout.scores[no_eos] == -7.0)
    assert col.metrics["reward/no_eos_penalised"] == pytest.approx(float(no_eos.float().mean()))
    # the penalised score sits on the last valid token of each such row
    last = col.rollout.mask.sum(1).long() - 1
    rows = torch.nonzero(no_eos).squeeze(1)
    assert torch.allclose(col.rollout.rewards[rows, last[rows]], torch.full((len(rows),), -7.0))


@pytest.mark.parametrize("weights, filters", [("live", {}), ("copy", {}),
                                              ("live", {"generation.top_p": 0.9, "generation.top_k": 20})],
                         ids=["live", "copy", "live-top-p-top-k"])
def test_static_engine_gives_the_eager_run(tiny_lm, tmp_path, weights, filters):
    """generation.engine=static (the finished check every 3 tokens; the policy's own weights, or an
    inference copy synced after each update; and with top_p / top_k on both): the same responses
    every iteration, and every metric the eager run's within float tolerance (the log-probs differ
    by rounding; timing aside)."""
    from fourfold.trainers.ppo import train

    engines = {"eager": dict(filters), "static": {"generation.engine": "static", "generation.weights": weights,
                                                  "generation.stop_check_every": 3, **filters}}
    runs = {}
    for name, extra in engines.items():
        cfg = load_config(PPOConfig, None, _ppo_overrides(tiny_lm, tmp_path / name, **{"ppo.iterations": 3, **extra}))
        train(cfg)
        runs[name] = _comparable(read_metrics(tmp_path / name / "metrics.jsonl"))
    assert len(runs["eager"]) == len(runs["static"]) == 3
    assert all(("rollout/log_kept_mass" in row) == bool(filters) for row in runs["eager"])
    for eager, static in zip(runs["eager"], runs["static"]):
        assert eager.keys() == static.keys()
        for key in ("rollout/tokens", "rollout/response_length", "reward/score_mean", "rollout/no_eos_share"):
            assert static[key] == eager[key], key  # the same tokens
        for key, value in eager.items():
            assert static[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_reinforce_with_the_static_engine_gives_the_eager_run(tiny_lm, tmp_path):
    from fourfold.trainers.reinforce import train

    runs = {}
    for name, extra in {"eager": [], "static": ["generation.engine=static", "generation.weights=copy"]}.items():
        over = [o for o in _ppo_overrides(tiny_lm, tmp_path / name) if not o.startswith(("ppo.", "model.critic_init"))]
        train(load_config(ReinforceConfig, None, over + ["reinforce.iterations=2", "reinforce.rollout_batch_size=8", *extra]))
        runs[name] = _comparable(read_metrics(tmp_path / name / "metrics.jsonl"))
    for eager, static in zip(runs["eager"], runs["static"], strict=True):
        assert static["rollout/tokens"] == eager["rollout/tokens"]
        # kl/k1 is a sum of up to 12 per-token log-prob differences, each off by ~1e-6
        assert static == pytest.approx(eager, rel=1e-4, abs=1e-4)
