"""Fixtures of the trainer tests."""
import dataclasses

import pytest
import torch

from fourfold.config import PPOConfig, load_config


@pytest.fixture(scope="session")
def mixed_rollout(tiny_lm):
    """A function of (prompt ids [8, 3], PPO overrides) giving (roles, GAE rollout, ``cfg.ppo``): the
    tiny model's roles with a critic, the policy and critic moved away from the reference by seeded
    noise, and a rollout of 8 responses cut to lengths 8, 3, 5, 1, 8, 2, 6, 4 (the attention mask
    cut with them), so that a minibatch has padding and the loss aggregations differ."""

    def build(ids: torch.Tensor, **ppo):
        from fourfold.config import GenerationConfig
        from fourfold.models.build import load_roles
        from fourfold.rollout.eager import EagerEngine
        from fourfold.rollout.noise import RowNoise
        from fourfold.trainers.ppo import compute_advantages
        from fourfold.trainers.rollouts import collect

        over = {"model.policy": tiny_lm / "sft", "model.reward": tiny_lm / "rm", "model.critic_init": "policy",
                "data.prompts": tiny_lm / "prompts.jsonl", "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 8,
                "ppo.max_grad_norm": 1e9, **{f"ppo.{k}": v for k, v in ppo.items()}}
        cfg = load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()])
        roles = load_roles("ppo", cfg, torch.device("cpu"))
        torch.manual_seed(0)
        with torch.no_grad():
            for p in [*roles.policy.parameters(), *roles.critic.parameters()]:
                p.add_(0.05 * torch.randn_like(p))
        col = collect(roles, ["p"] * 8, ids, (ids != 0).long(),
                      GenerationConfig(max_new_tokens=8, stop_at_eos=False), engine=EagerEngine(), kl_coef=0.1,
                      noise=RowNoise(0, 1))
        lengths = torch.tensor([8, 3, 5, 1, 8, 2, 6, 4])
        short = (torch.arange(8)[None, :] < lengths[:, None]).to(col.rollout.mask.dtype)
        rollout = dataclasses.replace(col.rollout, mask=short)
        rollout.context["attention_mask"] = torch.cat([(ids != 0).long(), short.long()], 1)
        return roles, compute_advantages(rollout, cfg.ppo), cfg.ppo

    return build
