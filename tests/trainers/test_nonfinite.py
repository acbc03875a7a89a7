"""Non-finite guards: a NaN/Inf in a reward, in the logits or in a loss never reaches the weights;
the skip is logged with what and where; K consecutive skips stop the run with a checkpoint."""
import json

import pytest
import torch

from fourfold.checkpoint import latest_checkpoint
from fourfold.config import PPOConfig, load_config
from fourfold.errors import NonFiniteError
from fourfold.reporting import read_metrics


def _cfg(tiny_lm, out, reward_fn, **extra):
    over = {
        "model.policy": tiny_lm / "sft", "model.reward_fn": reward_fn, "model.critic_init": "policy",
        "data.prompts": tiny_lm / "prompts.jsonl", "ppo.iterations": 4, "ppo.rollout_batch_size": 8,
        "ppo.minibatch_size": 4, "ppo.ppo_epochs": 2, "ppo.lr": 1e-3, "generation.max_new_tokens": 6,
        "run.output_dir": out, "run.progress": False, "run.device": "cpu",
    }
    over.update(extra)
    return load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()])


def _events(out):
    path = out / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _reward_module(tmp_path, body):
    path = tmp_path / "rewards.py"
    path.write_text("CALLS = [0]\n\ndef reward(prompts, responses):\n    CALLS[0] += 1\n" + body)
    return f"{path}:reward"


def test_nan_reward_once_is_skipped_and_logged(tiny_lm, tmp_path):
    from fourfold.trainers.ppo import train

    fn = _reward_module(tmp_path, "    bad = CALLS[0] == 2\n    return [float('nan') if bad else 1.0 for _ in responses]\n")
    train(_cfg(tiny_lm, tmp_path / "run", fn))
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 3, 4]  # iteration 2 never reached an update
    ev = [e for e in _events(tmp_path / "run") if e["kind"] == "nonfinite_skip"]
    assert len(ev) == 1 and ev[0]["quantity"] == "reward_score" and ev[0]["where"] == "iteration 2"
    assert rows[-1]["train/nonfinite_skips"] == 1


def test_always_nan_reward_stops_with_a_checkpoint(tiny_lm, tmp_path):
    from fourfold.trainers.ppo import train

    fn = _reward_module(tmp_path, "    return [float('inf')] * len(responses)\n")
    with pytest.raises(NonFiniteError, match="3 consecutive non-finite updates.*reward_score"):
        train(_cfg(tiny_lm, tmp_path / "run", fn, **{"ppo.iterations": 6}))
    assert latest_checkpoint(tmp_path / "run") is not None
    assert len([e for e in _events(tmp_path / "run") if e["kind"] == "nonfinite_skip"]) == 3


def test_nan_logits_never_reach_the_weights(tiny_lm, tmp_path, monkeypatch):
    """Poison the policy's logits in the training forward of iteration 2: every update of that
    iteration is skipped, so the weights after it equal the weights before it."""
    from fourfold.trainers import ppo

    fn = _reward_module(tmp_path, "    return [r.split().count('w7') for r in responses]\n")
    state = {"iteration": 0, "snapshots": {}}
    real_update = ppo.ppo_update

    def update(roles, rollout, algo, opt, temperature, guard, iteration, **kw):
        state["iteration"] = iteration
        state["snapshots"][iteration] = {k: v.clone() for k, v in roles.policy.state_dict().items()}
        return real_update(roles, rollout, algo, opt, temperature, guard, iteration, **kw)

    real_logprobs = ppo.response_logprobs

    def poisoned(model, *a, **k):
        lp, ent = real_logprobs(model, *a, **k)
        if state["iteration"] == 2 and torch.is_grad_enabled():
            lp = lp * float("nan")
        return lp, ent

    monkeypatch.setattr(ppo, "ppo_update", update)
    monkeypatch.setattr(ppo, "response_logprobs", poisoned)
    cfg = _cfg(tiny_lm, tmp_path / "run", fn, **{"run.max_consecutive_skips": 100})
    ppo.train(cfg)
    before, after = state["snapshots"][2], state["snapshots"][3]
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not all(torch.equal(state["snapshots"][1][k], before[k]) for k in before)  # iteration 1 did train
    ev = [e for e in _events(tmp_path / "run") if e["kind"] == "nonfinite_skip"]
    assert ev and all(e["quantity"] == "policy_loss" and e["where"].startswith("iteration 2") for e in ev)


def test_nan_value_loss_stops_after_k_consecutive_skips(tiny_lm, tmp_path, monkeypatch):
    from fourfold.trainers import ppo

    fn = _reward_module(tmp_path, "    return [1.0] * len(responses)\n")
    real = ppo.value_loss
    monkeypatch.setattr(ppo, "value_loss", lambda *a, **k: (real(*a, **k)[0] * float("nan"), real(*a, **k)[1]))
    with pytest.raises(NonFiniteError, match="value_loss at iteration 1"):
        ppo.train(_cfg(tiny_lm, tmp_path / "run", fn))
    ckpt = latest_checkpoint(tmp_path / "run")
    assert ckpt is not None
