"""The training-step levers of PPO, each the eager step's result within float tolerance:
``ppo.micro_batch_tokens`` (micro-batches of length-sorted rows by a token budget: no compute on a
mixed-length minibatch's padding) and ``model.compile`` (each micro-batch's forward and loss through
torch.compile, dynamic shapes). The compiled test is slow-marked: compiling takes tens of seconds on
CI's two cores."""
import copy
import dataclasses

import pytest
import torch

from fourfold.config import PPOConfig, load_config
from fourfold.errors import ConfigError


@pytest.fixture(scope="module")
def setup(mixed_rollout):
    """A policy and critic, and a GAE rollout of 8 responses of lengths 8, 3, 5, 1, 8, 2, 6, 4
    after prompts of 1-3 tokens (a minibatch with padding to lose)."""
    ids = torch.tensor([[1, 5, 9], [0, 1, 11], [0, 1, 4], [1, 8, 8], [0, 0, 1], [1, 3, 2], [0, 1, 5], [0, 1, 9]])
    return mixed_rollout(ids, entropy_coef=0.01)


def _step(setup, compiled: bool = False, **algo_changes):
    """(statistics, gradients) of one policy step and one critic step on the whole rollout."""
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.batches import minibatches
    from fourfold.trainers.ppo import critic_step, make_optim, policy_step

    roles, rollout, algo = setup
    algo = dataclasses.replace(algo, **algo_changes)
    policy, critic = copy.deepcopy(roles.policy), copy.deepcopy(roles.critic)
    opt = make_optim(dataclasses.replace(roles, policy=policy, critic=critic), algo, compiled=compiled)
    grads = []
    for model, optimizer in ((policy, opt.policy_opt), (critic, opt.critic_opt)):
        optimizer.register_step_pre_hook(lambda *_, m=model: grads.extend(p.grad.clone() for p in m.parameters()))
    [mb] = minibatches(rollout, algo, [torch.arange(8)], 1)
    stats = {**policy_step(policy, mb, algo, opt, 1.0, NonFiniteGuard()), **critic_step(critic, mb, algo, opt,
                                                                                         NonFiniteGuard())}
    return stats, grads


def _close(a, b, tol):
    (stats_a, grads_a), (stats_b, grads_b) = a, b
    assert stats_a.keys() == stats_b.keys()
    for k in stats_a:
        assert stats_a[k] == pytest.approx(stats_b[k], rel=tol, abs=tol), k
    assert len(grads_a) == len(grads_b) > 0
    for ga, gb in zip(grads_a, grads_b):
        assert float((ga - gb).abs().max()) <= tol * (1 + float(gb.abs().max()))


def test_micro_batches_by_tokens_group_sorted_rows_within_the_budget(setup):
    from fourfold.trainers.batches import micro_groups

    _, rollout, algo = setup
    lengths = rollout.context["attention_mask"].sum(1)  # prompt + response: 11, 5, 7, 4, 9, 5, 8, 6
    groups = micro_groups(rollout, dataclasses.replace(algo, micro_batch_tokens=20))
    assert sorted(i for g in groups for i in g.tolist()) == list(range(8))  # every row once
    for g in groups:
        longest = int(lengths[g].max())
        assert len(g) * longest <= 20 or len(g) == 1
    assert [g.tolist() for g in groups] == [[3, 1, 5], [7, 2], [6, 4], [0]]
    padded = sum(len(g) * int(lengths[g].max()) for g in groups)
    assert (padded, 8 * int(lengths.max())) == (58, 88)  # tokens run through the model, padding included
    whole = micro_groups(rollout, algo)
    assert len(whole) == 1 and whole[0] == slice(0, 8)


def test_micro_batches_by_tokens_give_the_whole_minibatch_step(setup):
    whole = _step(setup)
    _close(_step(setup, micro_batch_tokens=20), whole, 1e-5)
    _close(_step(setup, micro_batch_tokens=1), whole, 1e-5)  # every row alone


def test_the_levers_are_checked():
    base = ["model.policy=p", "model.reward=r", "data.prompts=x"]
    for over, message in ((["ppo.micro_batch_tokens=0"], "ppo.micro_batch_tokens: must be >= 1"),
                          (["ppo.micro_batch_tokens=64", "ppo.micro_batch_size=4"], "leave micro_batch_size null"),
                          (["model.compile=true", "model.logits_chunk=8"], "model.compile: a compiled pass")):
        with pytest.raises(ConfigError, match=message):
            load_config(PPOConfig, None, base + over)


@pytest.mark.slow
def test_a_compiled_step_is_the_eager_step(setup):
    """model.compile: the policy's and the critic's compiled passes give the eager step's statistics
    and gradients; a second micro-batch width reuses the dynamic graph."""
    eager = _step(setup, micro_batch_tokens=20)
    _close(_step(setup, compiled=True, micro_batch_tokens=20), eager, 2e-5)
