"""The update of a run over W ranks, in one process: each rank's share of a minibatch, its loss
normalised by the whole minibatch's counts and scaled by W, gives gradients whose average over the
ranks (what FSDP's reduce-scatter computes) is the whole minibatch's gradient, and statistics whose
sum over the ranks is the whole minibatch's, for every loss aggregation, with micro-batches."""
import copy
import dataclasses
from contextlib import contextmanager

import pytest
import torch

from fourfold.dist import World


@pytest.fixture(scope="module")
def setup(mixed_rollout):
    """Roles with a critic, the policy moved away from the reference, and a GAE rollout of 8
    responses of lengths 8, 3, 5, 1, 8, 2, 6, 4 (so that the aggregations differ)."""
    ids = torch.tensor([[1, 5, 9], [1, 7, 11], [0, 1, 4], [1, 8, 8], [0, 0, 1], [1, 3, 2], [1, 6, 5], [0, 1, 9]])
    return mixed_rollout(ids, kl_coef=0.5)


@contextmanager
def as_rank(rank: int, world_size: int):
    """A context in which this process is rank ``rank`` of ``world_size`` for the data-parallel seam
    (:mod:`fourfold.run.parallel` reads ``dist.world()``), its collectives this rank's own values
    (the shares are summed by the test)."""
    from fourfold import dist

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dist, "world", lambda: World(rank, world_size))
        patch.setattr(dist, "all_reduce_sum", lambda t: t)
        yield


def _ranks(setup, step, model_of, world_size, **algo_changes):
    """Each rank's (statistics, gradients) of one step on the minibatch of all 8 rows (permuted), as
    rank ``rank`` of ``world_size`` sees it (the collectives are this rank's own values: the
    shares are summed here)."""
    from fourfold.models.build import Roles
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.batches import minibatches
    from fourfold.trainers.ppo import make_optim

    roles, rollout, algo = setup
    algo = dataclasses.replace(algo, **algo_changes)
    perm = torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])
    out = []
    for rank in range(world_size):
        policy, critic = copy.deepcopy(roles.policy), copy.deepcopy(roles.critic)
        opt = make_optim(Roles(roles.tokenizer, policy, roles.reference, roles.reward, critic), algo)
        model, optimizer = model_of(policy, critic, opt)
        grads = []  # the accumulated gradients the optimizer steps with (no clipping: max_grad_norm 1e9)
        optimizer.register_step_pre_hook(lambda *_: grads.extend(p.grad.clone() for p in model.parameters()))
        with as_rank(rank, world_size):
            [mb] = minibatches(rollout, algo, [perm], 1)
            assert mb.rows.batch_size == 8 // world_size
            assert torch.equal(mb.rows.actions, rollout.actions[perm[rank * 8 // world_size:][:8 // world_size]])
            stats = step(model, mb, algo, opt, NonFiniteGuard())
        out.append((stats, grads))
    return out


def _check_shares(whole, ranks, additive):
    (stats, grads), = whole
    for key in additive:
        assert sum(s[key] for s, _ in ranks) == pytest.approx(stats[key], rel=1e-5, abs=1e-7), key
    assert len(grads) > 0
    for i, g in enumerate(grads):
        mean = sum(r[1][i] for r in ranks) / len(ranks)  # FSDP averages the ranks' gradients
        assert float((mean - g).abs().max()) < 1e-6


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
@pytest.mark.parametrize("micro", [None, 2])
def test_policy_gradient_of_rank_shares_is_the_minibatch_gradient(setup, agg, micro):
    from fourfold.trainers.ppo import policy_step

    def step(model, mb, algo, opt, guard):
        return policy_step(model, mb, algo, opt, 1.0, guard)

    change = dict(loss_agg=agg, micro_batch_size=micro, kl_in="loss", entropy_coef=0.01)
    model_of = lambda policy, critic, opt: (policy, opt.policy_opt)
    whole = _ranks(setup, step, model_of, 1, **change)
    for w in (2, 4):
        _check_shares(whole, _ranks(setup, step, model_of, w, **change),
                      ("policy/loss", "policy/clipfrac", "policy/approx_kl", "policy/kl_loss"))


def test_a_rank_share_alone_is_not_the_minibatch_gradient(setup):
    """The check above can fail: without the factor W the average is half the gradient."""
    from fourfold import dist
    from fourfold.trainers.ppo import policy_step

    def step(model, mb, algo, opt, guard):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(dist, "world", lambda: World(0, 1))  # every rank scaled as a lone process
            return policy_step(model, mb, algo, opt, 1.0, guard)

    model_of = lambda policy, critic, opt: (policy, opt.policy_opt)
    with pytest.raises(AssertionError):
        _check_shares(_ranks(setup, step, model_of, 1), _ranks(setup, step, model_of, 2), ())


@pytest.mark.parametrize("micro", [None, 2])
def test_critic_gradient_of_rank_shares_is_the_minibatch_gradient(setup, micro):
    from fourfold.trainers.ppo import critic_step

    model_of = lambda policy, critic, opt: (critic, opt.critic_opt)
    whole = _ranks(setup, critic_step, model_of, 1, micro_batch_size=micro)
    _check_shares(whole, _ranks(setup, critic_step, model_of, 2, micro_batch_size=micro), ("value/loss", "value/clipfrac"))


def test_reinforce_gradient_of_rank_shares_is_the_batch_gradient(setup):
    from fourfold.core import discounted_returns, masked_mean
    from fourfold.trainers.reinforce import rank_loss

    roles, rollout, _ = setup
    returns = discounted_returns(rollout.rewards, rollout.mask, 1.0)
    baseline = masked_mean(returns, rollout.mask)

    def run(world_size):
        out = []
        for rank in range(world_size):
            policy = copy.deepcopy(roles.policy)
            with as_rank(rank, world_size):
                to_backward, loss = rank_loss(policy, rollout, returns, baseline, 1.0)
            to_backward.backward()
            out.append((float(loss), [p.grad.clone() for p in policy.parameters()]))
        return out

    (loss, grads), = run(1)
    ranks = run(2)
    assert sum(r[0] for r in ranks) == pytest.approx(loss, rel=1e-5)  # each rank's share; summed over ranks
    for i, g in enumerate(grads):
        assert float((sum(r[1][i] for r in ranks) / 2 - g).abs().max()) < 1e-6


def test_global_batch_sizes_must_divide_by_the_world():
    from fourfold.errors import ConfigError
    from fourfold.run.parallel import check_world

    check_world(World(1, 2), False, {"ppo.rollout_batch_size": 8, "ppo.minibatch_size": 4})
    with pytest.raises(ConfigError, match=r"^ppo.minibatch_size: 3 does not divide by the world size 2"):
        check_world(World(1, 2), False, {"ppo.rollout_batch_size": 6, "ppo.minibatch_size": 3})
    with pytest.raises(ConfigError, match=r"^run.concurrent_roles: not with more than one process"):
        check_world(World(0, 2), True, {})
    check_world(World(), True, {"ppo.minibatch_size": 3})  # one process: anything goes
