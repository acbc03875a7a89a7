"""The update's measurements of issue 39: policy/dual_clipfrac (0 without ppo.dual_clip, > 0 where
ratios get large) and the opt-in policy/grad_snr of PPO (and GRPO through it) and REINFORCE, which
appears, is finite and changes no other metric and no weight."""
import math

import pytest
import torch
from safetensors.torch import load_file

from fourfold.config import PPOConfig, ReinforceConfig, load_config
from fourfold.errors import ConfigError
from fourfold.reporting import is_timing_key, read_metrics


def _run(tiny_lm, out, cls=PPOConfig, **extra):
    from fourfold.trainers.ppo import train as ppo
    from fourfold.trainers.reinforce import train as reinforce

    over = {"model.policy": tiny_lm / "sft", "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
            "data.prompts": tiny_lm / "prompts.jsonl", "generation.max_new_tokens": 12, "run.output_dir": out,
            "run.progress": False, "run.seed": 0}
    if cls is PPOConfig:
        over.update({"ppo.iterations": 2, "ppo.rollout_batch_size": 16, "ppo.minibatch_size": 8, "ppo.lr": 3e-3})
    else:
        over.update({"reinforce.iterations": 2, "reinforce.rollout_batch_size": 16, "reinforce.lr": 3e-3})
    over.update(extra)
    cfg = load_config(cls, None, [f"{k}={v}" for k, v in over.items()])
    (ppo if cls is PPOConfig else reinforce)(cfg)
    return read_metrics(out / "metrics.jsonl")


def _weights(out):
    return load_file(str(out / "policy" / "model.safetensors"))


def test_dual_clipfrac_is_zero_off_and_positive_where_ratios_are_large(tiny_lm, tmp_path):
    """8 epochs at lr 3e-2 (seed 0) move the ratios far from 1 (approx_kl ~2 in iteration 1):
    with dual_clip 3 (verl's) the bound acts on a measured 2.0% of tokens in iteration 1 (0.4% in
    iteration 2); the same run without it logs exactly 0."""
    big = {"model.critic_init": "policy", "ppo.ppo_epochs": 8, "ppo.lr": 3e-2}
    off = _run(tiny_lm, tmp_path / "off", **big)
    on = _run(tiny_lm, tmp_path / "on", **big, **{"ppo.dual_clip": 3.0})
    assert [r["policy/dual_clipfrac"] for r in off] == [0.0, 0.0]
    assert on[0]["policy/dual_clipfrac"] > 0.01, on[0]["policy/dual_clipfrac"]
    assert all(0 <= r["policy/dual_clipfrac"] <= r["policy/clipfrac"] for r in on)


def _same_but_snr(a, b):
    keys = {k for k in a if not is_timing_key(k)} - {"policy/grad_snr"}
    assert keys == {k for k in b if not is_timing_key(k)} - {"policy/grad_snr"}
    assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


def _check_snr_run(tmp_path, plain, snr):
    """The SNR run logs a finite, positive policy/grad_snr every iteration and changes no other
    metric and no weight of the plain run (both under tmp_path's 'plain' and 'snr')."""
    values = [r["policy/grad_snr"] for r in snr]
    assert all(math.isfinite(v) and v > 0 for v in values), values
    for a, b in zip(plain, snr, strict=True):
        _same_but_snr(a, b)
    wa, wb = _weights(tmp_path / "plain"), _weights(tmp_path / "snr")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("arm", ["gae", "grpo"])
def test_ppo_grad_snr_appears_and_changes_nothing_else(tiny_lm, tmp_path, arm):
    extra = ({"model.critic_init": "policy"} if arm == "gae"
             else {"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4, "ppo.minibatch_size": 4})
    plain = _run(tiny_lm, tmp_path / "plain", **extra)
    snr = _run(tiny_lm, tmp_path / "snr", **extra, **{"ppo.log_grad_snr": True})
    assert all("policy/grad_snr" not in r for r in plain)
    _check_snr_run(tmp_path, plain, snr)


def test_grad_snr_needs_two_minibatches():
    with pytest.raises(ConfigError, match="ppo.log_grad_snr.*2 minibatches"):
        load_config(PPOConfig, None, ["model.policy=p", "model.reward=r", "data.prompts=x.jsonl", "ppo.log_grad_snr=true",
                                       "ppo.rollout_batch_size=8", "ppo.minibatch_size=8"])


def test_reinforce_update_rows_default_is_the_one_step_of_before():
    """The defaults (1 pass, 1 minibatch) are one step on the whole batch, named as before, and draw
    nothing from torch's generator; 2 passes x 4 minibatches are 8 steps, each pass a partition."""
    from fourfold.trainers.reinforce import update_rows

    torch.manual_seed(5)
    state = torch.get_rng_state()
    assert update_rows(16, 1, 1, 3) == [("iteration 3", None)]
    assert torch.equal(torch.get_rng_state(), state)
    steps = update_rows(16, 2, 4, 3)
    assert len(steps) == 8 and steps[5][0] == "iteration 3 epoch 1 minibatch 1"
    for e in range(2):
        rows = torch.cat([r for _, r in steps[4 * e:4 * e + 4]])
        assert sorted(rows.tolist()) == list(range(16))


@pytest.mark.parametrize("baseline", ["none", "mean", "loo"])
def test_reinforce_at_matched_steps_logs_a_finite_grad_snr(tiny_lm, tmp_path, baseline):
    """2 passes x 4 minibatches (8 steps per batch, as PPO's 2 epochs x 16 / 4) with each
    baseline: policy/grad_snr appears, finite and > 0; the measurement changes no other metric
    and no weight."""
    steps = {"reinforce.baseline": baseline, "reinforce.batch_epochs": 2, "reinforce.minibatches": 4}
    plain = _run(tiny_lm, tmp_path / "plain", ReinforceConfig, **steps)
    snr = _run(tiny_lm, tmp_path / "snr", ReinforceConfig, **steps, **{"reinforce.log_grad_snr": True})
    _check_snr_run(tmp_path, plain, snr)


def test_reinforce_baselines_differ_and_steps_matter(tiny_lm, tmp_path):
    """The same first batch (seed 0): 'loo' and 'mean' give different losses (their baselines
    differ per row), and 8 steps per batch move the weights elsewhere than 1."""
    rows = {b: _run(tiny_lm, tmp_path / b, ReinforceConfig, **{"reinforce.baseline": b, "reinforce.iterations": 1})
            for b in ("mean", "loo")}
    assert rows["mean"][0]["reward/score_mean"] == rows["loo"][0]["reward/score_mean"]
    assert rows["mean"][0]["policy/loss"] != rows["loo"][0]["policy/loss"]
    _run(tiny_lm, tmp_path / "eight", ReinforceConfig, **{"reinforce.iterations": 1, "reinforce.baseline": "mean",
                                                          "reinforce.minibatches": 4, "reinforce.batch_epochs": 2})
    wa, wb = _weights(tmp_path / "mean"), _weights(tmp_path / "eight")
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("key,value,message", [
    ("reinforce.minibatches", "3", "divide rollout_batch_size=16"),
    ("reinforce.batch_epochs", "0", "must be >= 1"),
    ("reinforce.log_grad_snr", "true", "needs >= 2 minibatches"),
    ("reinforce.baseline", "median", "reinforce.baseline"),
])
def test_reinforce_bad_update_keys_are_one_line(key, value, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ReinforceConfig, None, ["model.policy=p", "model.reward=r", "data.prompts=x.jsonl",
                                            "reinforce.rollout_batch_size=16", f"{key}={value}"])
