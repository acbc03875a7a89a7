"""PPO's estimator keys in the trainer, on tiny random models: the critic-free estimators (grpo,
dr_grpo, rloo, reinforce_pp) train the policy with no critic in memory, the K samples of a prompt
are K consecutive rows, kl_in=loss moves the KL from the rewards to the loss, the loss aggregation
survives micro-batching, and the defaults are today's PPO."""
import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from fourfold.config import PPOConfig, load_config
from fourfold.core import Rollout, discounted_returns, gae, grpo_advantages, masked_sum, masked_whiten
from fourfold.reporting import is_timing_key, read_metrics

ROOT = Path(__file__).resolve().parents[2]


def _over(tiny_lm, out, **extra):
    base = {"model.policy": tiny_lm / "sft", "model.reward": tiny_lm / "rm", "data.prompts": tiny_lm / "prompts.jsonl",
            "ppo.iterations": 3, "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4, "ppo.lr": 3e-3,
            "ppo.critic_lr": 1e-3, "generation.max_new_tokens": 8, "run.output_dir": out, "run.progress": False,
            "run.tensorboard": False, "run.save_every": 0, "run.device": "cpu", "run.seed": 0}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def _rows(out):
    return [{k: v for k, v in r.items() if not is_timing_key(k)} for r in read_metrics(Path(out) / "metrics.jsonl")]


def _weights(path):
    return load_file(str(Path(path) / "model.safetensors"))


@pytest.mark.parametrize("example,extra", [
    ("grpo", ["ppo.samples_per_prompt=4"]),
    ("grpo", ["ppo.advantage=dr_grpo", "ppo.samples_per_prompt=4", "ppo.loss_agg=seq-mean-token-sum", "ppo.kl_in=reward",
              "ppo.micro_batch_size=2", "ppo.clip_eps_high=0.28"]),
    ("rloo", []),
    ("reinforce_pp", []),
], ids=["grpo", "dr_grpo", "rloo", "reinforce_pp"])
def test_critic_free_estimators_train_the_policy_without_a_critic(tiny_lm, tmp_path, monkeypatch, example, extra):
    """`fourfold ppo --config examples/<example>.yaml`: no critic is loaded (the only scalar model
    read is the reward model), no value loss runs, and the policy moves."""
    from fourfold.cli import main
    from fourfold.models import build
    from fourfold.trainers import prelude

    loaded, scorers = [], []
    real_build_roles, real_scorer = prelude.build_roles, build.load_sequence_scorer
    monkeypatch.setattr(prelude, "build_roles", lambda *a, **k: loaded.append(real_build_roles(*a, **k)) or loaded[-1])
    monkeypatch.setattr(build, "load_sequence_scorer", lambda path, **k: scorers.append(str(path)) or real_scorer(path, **k))
    out = tmp_path / "run"
    over = [o for o in _over(tiny_lm, out) if not o.startswith("run.output_dir=")] + extra
    assert main(["ppo", "--config", str(ROOT / "examples" / f"{example}.yaml"), "--output-dir", str(out), *over]) == 0
    assert len(loaded) == 1 and loaded[0].critic is None
    assert scorers == [str(tiny_lm / "rm")]
    rows = _rows(out)
    assert [r["samples"] for r in rows] == [8, 16, 24]  # responses, whatever the samples per prompt
    assert not [k for r in rows for k in r if k.startswith("value/")]
    assert not (out / "critic").exists()
    before, after = _weights(tiny_lm / "sft"), _weights(out / "policy")
    assert not all(torch.equal(before[k], after[k]) for k in before)


def test_k_samples_of_a_prompt_are_consecutive_rows_and_form_the_groups(tiny_lm, tmp_path, monkeypatch):
    """K = 4 and 8 responses per iteration: 2 prompts (the PromptStream's next two), each on 4
    consecutive rows; GRPO's groups are those rows."""
    from fourfold.trainers import ppo
    from fourfold.trainers import rollouts as rollouts_module
    from fourfold.trainers.prompts import PromptStream

    seen, rollouts = [], []
    real_collect, real_advantages = rollouts_module.collect, ppo.compute_advantages
    monkeypatch.setattr(rollouts_module, "collect", lambda roles, texts, ids, mask, *a, **k: seen.append((texts, ids, mask))
                        or real_collect(roles, texts, ids, mask, *a, **k))
    monkeypatch.setattr(ppo, "compute_advantages",
                        lambda r, algo, boot=None: rollouts.append(real_advantages(r, algo, boot)) or rollouts[-1])
    cfg = load_config(PPOConfig, None, _over(tiny_lm, tmp_path / "g", **{"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4}))
    ppo.train(cfg)

    from fourfold.models.loading import load_tokenizer

    stream = PromptStream(cfg.data, load_tokenizer(str(tiny_lm / "sft")), 2, cfg.run.seed)
    for texts, ids, mask in seen:
        assert len(texts) == 8 and ids.shape[0] == mask.shape[0] == 8
        assert texts[::4] == stream.next("cpu")[0]
        for g in range(2):
            rows = slice(4 * g, 4 * g + 4)
            assert len(set(texts[rows])) == 1
            assert torch.equal(ids[rows], ids[4 * g].expand_as(ids[rows]))
            assert torch.equal(mask[rows], mask[4 * g].expand_as(mask[rows]))
    assert len(rollouts) == 3
    for r in rollouts:
        R = masked_sum(r.rewards, r.mask, dim=-1)  # kl_in=reward: score - beta * summed KL
        assert torch.equal(r.advantages, grpo_advantages(R, r.mask, 4)[0])
        per_seq = r.advantages[:, 0].reshape(2, 4)
        assert torch.allclose(per_seq.sum(1), torch.zeros(2), atol=1e-5)  # each group centred on its mean


def _old_compute_advantages(rollout, algo):
    """fourfold.trainers.ppo.compute_advantages before the estimator registry (commit e0f8751)."""
    mask, rewards = rollout.mask, rollout.rewards
    if algo.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    if algo.use_critic:
        advantages, returns = gae(rewards, rollout.values, mask, algo.gamma, algo.lam)
    else:
        returns = discounted_returns(rewards, mask, algo.gamma)
        advantages = returns
    if algo.whiten_advantages:
        advantages = masked_whiten(advantages, mask)
    return advantages, returns


@pytest.mark.parametrize("use_critic,whiten_rewards,whiten_advantages", [
    (True, False, True), (True, True, True), (True, False, False), (False, False, True), (False, True, True)])
def test_default_estimator_is_todays_computation_bit_for_bit(use_critic, whiten_rewards, whiten_advantages):
    """(use_critic=false with whiten_advantages=false, the raw returns, is refused by the config.)"""
    from fourfold.config import PPOAlgoConfig
    from fourfold.trainers.ppo import compute_advantages

    g = torch.Generator().manual_seed(3)
    mask = (torch.arange(7)[None, :] < torch.tensor([7, 3, 5, 1, 6, 7])[:, None]).float()
    rollout = Rollout(actions=torch.zeros(6, 7, dtype=torch.long), mask=mask, logprobs=torch.zeros(6, 7),
                      values=torch.randn(6, 7, generator=g) * mask, rewards=torch.randn(6, 7, generator=g) * mask)
    algo = PPOAlgoConfig(use_critic=use_critic, whiten_rewards=whiten_rewards, whiten_advantages=whiten_advantages,
                         gamma=0.97, lam=0.9)
    want_adv, want_ret = _old_compute_advantages(rollout, algo)
    got = compute_advantages(dataclasses.replace(rollout), algo)
    assert torch.equal(got.advantages, want_adv) and torch.equal(got.returns, want_ret)


def test_explicit_defaults_and_reinforce_pp_reproduce_todays_runs(tiny_lm, tmp_path):
    """The new keys at their defaults, spelled out, give the default run's metrics and weights; and
    advantage=reinforce_pp gives exactly today's no-critic ablation (use_critic=false)."""
    from fourfold.trainers.ppo import train

    runs = {
        "default": {},
        "explicit": {"ppo.advantage": "gae", "ppo.samples_per_prompt": 1, "ppo.kl_in": "reward", "ppo.loss_agg": "token-mean",
                     "ppo.clip_eps_low": 0.2, "ppo.clip_eps_high": 0.2},
        "no_critic": {"ppo.use_critic": "false"},
        "reinforce_pp": {"ppo.advantage": "reinforce_pp"},
    }
    for name, extra in runs.items():
        train(load_config(PPOConfig, None, _over(tiny_lm, tmp_path / name, **{"ppo.iterations": 2, **extra})))
    for a, b in (("default", "explicit"), ("no_critic", "reinforce_pp")):
        assert _rows(tmp_path / a) == _rows(tmp_path / b), (a, b)
        wa, wb = _weights(tmp_path / a / "policy"), _weights(tmp_path / b / "policy")
        assert all(torch.equal(wa[k], wb[k]) for k in wa), (a, b)
    assert "value/loss" in _rows(tmp_path / "default")[0] and "value/loss" not in _rows(tmp_path / "no_critic")[0]


def test_kl_in_loss_leaves_the_rewards_and_joins_the_loss(tiny_lm, tmp_path):
    from fourfold.trainers.ppo import train

    for kl_in in ("reward", "loss"):
        train(load_config(PPOConfig, None, _over(tiny_lm, tmp_path / kl_in, **{
            "ppo.advantage": "grpo", "ppo.samples_per_prompt": 4, "ppo.kl_in": kl_in, "ppo.kl_coef": 0.5})))
    in_reward, in_loss = _rows(tmp_path / "reward"), _rows(tmp_path / "loss")
    # iteration 1 samples from the reference itself (KL 0); afterwards the policy has moved
    for r in in_loss:
        assert r["reward/token_reward_sum_mean"] == pytest.approx(r["reward/score_mean"], abs=1e-6)
        assert r["policy/kl_loss"] > 0 and r["kl/coef"] == 0.5
    assert abs(in_loss[-1]["kl/k1"]) > 1e-4
    last = in_reward[-1]
    assert last["reward/token_reward_sum_mean"] == pytest.approx(last["reward/score_mean"] - 0.5 * last["kl/k1"], abs=1e-5)
    assert abs(last["kl/k1"]) > 1e-4 and "policy/kl_loss" not in last


# ---- one policy step on a fixed minibatch ---------------------------------------------------------


@pytest.fixture(scope="module")
def step_setup(tiny_lm):
    """Roles without a critic, a policy moved away from the reference, and a GRPO minibatch of 8
    responses (2 prompts x 4) of different lengths."""
    from fourfold.config import GenerationConfig
    from fourfold.models.build import build_roles
    from fourfold.models.plan import plan_roles
    from fourfold.rollout.eager import EagerEngine
    from fourfold.trainers.ppo import compute_advantages
    from fourfold.trainers.prompts import repeat_prompts
    from fourfold.trainers.rollouts import collect

    cfg = load_config(PPOConfig, None, _over(tiny_lm, "unused", **{"ppo.advantage": "grpo", "ppo.samples_per_prompt": 4}))
    roles = build_roles(plan_roles("ppo", cfg).without("critic"), torch.device("cpu"))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in roles.policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.tensor([[1, 5, 9], [1, 7, 11]])
    texts, ids, mask = repeat_prompts(["a", "b"], ids, torch.ones_like(ids), 4)
    col = collect(roles, texts, ids, mask, GenerationConfig(max_new_tokens=8, stop_at_eos=False), engine=EagerEngine(),
                  kl_coef=0.0)
    # responses of 8, 3, 5, 1 | 8, 2, 6, 4 tokens (a shorter mask: the rest is padding), so that
    # the three aggregations differ; R = the score on the full rows, 0 on the others
    lengths = torch.tensor([8, 3, 5, 1, 8, 2, 6, 4])
    short = (torch.arange(8)[None, :] < lengths[:, None]).to(col.rollout.mask.dtype)
    rollout = compute_advantages(dataclasses.replace(col.rollout, mask=short), cfg.ppo)
    assert torch.all(rollout.advantages[:, 0] != 0)
    return roles, rollout, cfg.ppo


def _step(setup, **algo_changes):
    from fourfold.core import aggregation_units
    from fourfold.models.build import Roles
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.ppo import Minibatch, make_optim, policy_step

    roles, rollout, algo = setup
    algo = dataclasses.replace(algo, **algo_changes)
    policy = copy.deepcopy(roles.policy)
    opt = make_optim(Roles(roles.tokenizer, policy, roles.reference, roles.reward), algo)
    grads = []  # the accumulated (clipped) gradients the optimizer steps with
    opt.policy_opt.register_step_pre_hook(lambda *_: grads.extend(p.grad.clone() for p in policy.parameters()))
    mb = Minibatch("test", rollout, float(aggregation_units(rollout.mask, algo.loss_agg)), float(rollout.mask.sum()))
    stats = policy_step(policy, mb, algo, opt, 1.0, NonFiniteGuard())
    return stats, grads


def test_kl_in_loss_adds_kl_coef_times_k3_to_the_policy_loss(step_setup):
    reward, _ = _step(step_setup, kl_in="reward", kl_coef=0.5)
    loss, _ = _step(step_setup, kl_in="loss", kl_coef=0.5)
    assert "policy/kl_loss" not in reward and loss["policy/kl_loss"] > 1e-3
    assert loss["policy/loss"] - reward["policy/loss"] == pytest.approx(0.5 * loss["policy/kl_loss"], rel=1e-4)
    assert loss["policy/grad_norm"] != pytest.approx(reward["policy/grad_norm"], rel=1e-3)


def test_entropy_bonus_reaches_the_gradient(step_setup):
    """entropy_coef > 0 subtracts coef x entropy from the loss and its gradient from the step's."""
    plain, g_plain = _step(step_setup, max_grad_norm=1e9)
    bonus, g_bonus = _step(step_setup, entropy_coef=0.5, max_grad_norm=1e9)
    entropy = bonus["policy/loss"] - plain["policy/loss"]
    assert entropy < -1e-3  # minus 0.5 x a positive entropy
    changed = max(float((a - b).abs().max()) for a, b in zip(g_plain, g_bonus))
    assert changed > 1e-4


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_are_weighted_to_the_minibatch_aggregate(step_setup, agg):
    """One micro-batch per response gives the loss and the gradient of the whole minibatch."""
    whole, g_whole = _step(step_setup, loss_agg=agg, kl_in="loss", entropy_coef=0.01)
    split, g_split = _step(step_setup, loss_agg=agg, kl_in="loss", entropy_coef=0.01, micro_batch_size=1)
    for key in ("policy/loss", "policy/grad_norm", "policy/kl_loss", "policy/approx_kl"):
        assert split[key] == pytest.approx(whole[key], rel=1e-4, abs=1e-7), key
    assert len(g_whole) == len(g_split) > 0
    for a, b in zip(g_whole, g_split):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)


def test_loss_agg_and_clip_ranges_reach_the_surrogate(step_setup, monkeypatch):
    from fourfold.trainers import ppo

    calls = []
    real = ppo.ppo_policy_loss
    monkeypatch.setattr(ppo, "ppo_policy_loss", lambda *a, **k: calls.append(k) or real(*a, **k))
    losses = {agg: _step(step_setup, loss_agg=agg)[0]["policy/loss"]
              for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")}
    assert len(set(losses.values())) == 3
    _step(step_setup, clip_eps_low=0.1, clip_eps_high=0.28)
    assert calls[-1] == {"clip_eps_low": 0.1, "clip_eps_high": 0.28, "agg": "token-mean"}
    assert [c["agg"] for c in calls[:3]] == ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]


def test_roles_with_a_critic_are_refused_by_a_critic_free_estimator(tiny_lm, tmp_path):
    from fourfold.errors import ConfigError
    from fourfold.models.build import load_roles
    from fourfold.trainers.ppo import train

    cfg = load_config(PPOConfig, None, _over(tiny_lm, tmp_path / "x", **{"ppo.advantage": "rloo"}))
    gae = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, advantage="gae", samples_per_prompt=1))
    roles = load_roles("ppo", gae, torch.device("cpu"))  # with a critic
    assert roles.critic is not None
    with pytest.raises(ConfigError, match="ppo.advantage: rloo uses no critic"):
        train(cfg, roles=roles)


def test_roles_with_a_critic_are_refused_by_gae_without_the_critic(tiny_lm, tmp_path):
    # advantage gae with use_critic false computes reinforce_pp: the check asks algo.estimator
    # (it asked algo.advantage, gae, which needs a critic, and let the roles through)
    from fourfold.errors import ConfigError
    from fourfold.models.build import load_roles
    from fourfold.trainers.ppo import train

    cfg = load_config(PPOConfig, None, _over(tiny_lm, tmp_path / "x", **{"ppo.advantage": "gae"}))
    roles = load_roles("ppo", cfg, torch.device("cpu"))  # with a critic
    assert roles.critic is not None
    # (validation resolved the unset critic_init to 'reward'; the critic-free run leaves it unset)
    no_critic = dataclasses.replace(cfg, ppo=dataclasses.replace(cfg.ppo, use_critic=False),
                                    model=dataclasses.replace(cfg.model, critic_init=None))
    with pytest.raises(ConfigError, match="ppo.advantage: gae uses no critic"):
        train(no_critic, roles=roles)
