"""collect_turns against collect: a single-turn environment whose reward is the run's reward
function gives the plain rollout's tensors exactly (tokens, mask, log-probs, reference log-probs,
values, rewards with the KL penalty, scores) and the same GAE advantages; with several turns the
observation tokens carry no reward, KL, value, advantage or gradient."""

import importlib.util

import pytest
import torch

from fourfold.config import EnvConfig, GenerationConfig, PPOConfig, load_config
from fourfold.core import ppo_policy_loss
from fourfold.core.turns import turn_ids_from_mask
from fourfold.data.observations import ObservationEncoder
from fourfold.models.roles import response_logprobs
from fourfold.rollout.eager import EagerEngine
from fourfold.rollout.env import make_envs
from fourfold.rollout.noise import RowNoise
from fourfold.trainers.env_rollouts import collect_turns
from fourfold.trainers.ppo import compute_advantages
from fourfold.trainers.rollouts import collect, sample_rows

PROMPTS = ["w1 w2", "w3", "w4 w5 w6", "w7", "w8 w9", "w10 w11", "w12", "w13 w14 w15"]


@pytest.fixture(scope="module")
def setup(tiny_lm):
    from fourfold.models.build import load_roles

    over = {"model.policy": tiny_lm / "sft", "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
            "model.critic_init": "policy", "data.prompts": tiny_lm / "prompts.jsonl", "ppo.rollout_batch_size": 8,
            "ppo.minibatch_size": 8}
    cfg = load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()])
    roles = load_roles("ppo", cfg, torch.device("cpu"))
    torch.manual_seed(0)
    with torch.no_grad():  # a critic and a policy that differ from the reference
        for p in [*roles.policy.parameters(), *roles.critic.parameters()]:
            p.add_(0.05 * torch.randn_like(p))
    spec = importlib.util.spec_from_file_location("tiny_reward", tiny_lm / "reward_fn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return roles, cfg, module.reward


N_PROMPTS = len(PROMPTS)


def _alone(roles):
    """The roles without their reward function: the environment's rewards alone (a reward role
    beside an environment is scored too, and added to the trajectories' last turns)."""
    import dataclasses

    return dataclasses.replace(roles, reward=None)


def _envs(factory, n=N_PROMPTS):
    return make_envs(factory, [{"prompt": p} for p in PROMPTS[:n]], [f"p.jsonl:{i + 1}" for i in range(n)])


def test_one_turn_is_collect_with_the_reward_function(setup):
    roles, cfg, reward = setup

    class OneTurn:
        def __init__(self, row):
            self.prompt = row["prompt"]

        def reset(self):
            return self.prompt

        def step(self, action):
            return "", reward([self.prompt], [action])[0], True

    gen = GenerationConfig(max_new_tokens=6, temperature=1.3)
    env = EnvConfig(max_turns=1, max_tokens=64)
    got = collect_turns(_alone(roles), _envs(OneTurn), env, gen, kl_coef=0.1, noise=RowNoise(4, 2))
    enc = ObservationEncoder(roles.tokenizer)
    first = [enc.first(p, "x", 64) for p in PROMPTS]
    width = max(map(len, first))
    ids = torch.tensor([[0] * (width - len(f)) + f for f in first])
    want = collect(roles, PROMPTS, ids, (ids != 0).long(), gen, engine=EagerEngine(), kl_coef=0.1, noise=RowNoise(4, 2))
    a, b = got.rollout, want.rollout
    for name in ("actions", "mask", "logprobs", "ref_logprobs", "values", "rewards", "scores"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(a.context[key], b.context[key]), key
    assert torch.equal(got.kl, want.kl)
    assert got.bootstrap.tolist() == [0.0] * 8  # every row ended (done)
    adv = compute_advantages(got.rollout, cfg.ppo, got.bootstrap)
    ref = compute_advantages(want.rollout, cfg.ppo)
    assert torch.equal(adv.advantages, ref.advantages) and torch.equal(adv.returns, ref.returns)
    assert got.metrics["env/turns_mean"] == 1.0 and got.metrics["env/done_frac"] == 1.0


class Repeat:
    """Answers every turn with the same word ('w7' x 3) and reward 1 - 0.1 * turn; never done."""

    def __init__(self, row):
        self.n = 0

    def reset(self):
        return "w1 w2"

    def step(self, action):
        self.n += 1
        return "w7 w7 w7", 1.0 - 0.1 * self.n, False


def test_observation_tokens_get_no_reward_kl_value_or_gradient(setup):
    roles, cfg, _ = setup
    gen = GenerationConfig(max_new_tokens=4, temperature=1.0, stop_at_eos=False)
    env = EnvConfig(max_turns=3, max_tokens=64, truncation="bootstrap")
    col = collect_turns(_alone(roles), _envs(Repeat, 4), env, gen, kl_coef=0.2, noise=RowNoise(2, 0))
    r = col.rollout
    obs = (r.mask == 0) & (r.context["attention_mask"][:, -r.mask.shape[1]:] == 1)
    assert int(obs.sum()) == 4 * 2 * 3  # two observations of 3 tokens per row (none after the last turn)
    assert bool((r.rewards[obs] == 0).all()) and bool((col.kl[obs] == 0).all()) and bool((r.values[obs] == 0).all())
    # each turn's reward sits on its last token; truncated by max_turns, the last one bootstraps
    ends = turn_ids_from_mask(r.mask)
    assert all(t.truncated for t in col.trajectories) and col.metrics["env/truncated_frac"] == 1.0
    assert torch.equal(col.bootstrap, roles.critic.score(r.context["input_ids"], r.context["attention_mask"]))
    for b in range(4):
        last = [int((ends[b] == k).nonzero().max()) for k in range(3)]
        scores = r.rewards[b, last] + 0.2 * col.kl[b, last]
        assert torch.allclose(scores, torch.tensor([0.9, 0.8, 0.7]), atol=1e-6)
    (row,) = sample_rows(col, roles.tokenizer, n=1)
    assert row["prompt"] == "w1 w2" and row["truncated"] and not row["done"]
    assert [t.get("observation") for t in row["turns"]] == ["w7 w7 w7", "w7 w7 w7", None]
    assert [t["reward"] for t in row["turns"]] == pytest.approx([0.9, 0.8, 0.7]) and row["return"] == pytest.approx(2.4)
    assert all(len(t["action"].split()) == 4 for t in row["turns"])
    adv = compute_advantages(col.rollout, cfg.ppo, col.bootstrap)
    assert bool((adv.advantages[obs] == 0).all()) and bool((adv.returns[obs] == 0).all())
    # the policy loss gives the observation positions' log-probs exactly zero gradient
    ids, attn, T = r.context["input_ids"], r.context["attention_mask"], r.mask.shape[1]
    logprobs, _ = response_logprobs(roles.policy, ids, attn, T, gen.temperature)
    logprobs.retain_grad()
    loss, _ = ppo_policy_loss(logprobs, r.logprobs, adv.advantages, r.mask)
    loss.backward()
    assert bool((logprobs.grad[obs] == 0).all()) and bool((logprobs.grad[r.mask.bool()] != 0).any())
    roles.policy.zero_grad()


def _p_word(policy, col, word_id):
    """Mean probability of ``word_id`` as the next token at the policy's own positions."""
    r = col.rollout
    ids, attn, T = r.context["input_ids"], r.context["attention_mask"], r.mask.shape[1]
    with torch.no_grad():
        logits = policy(input_ids=ids, attention_mask=attn).logits[:, -T - 1:-1]
    p = torch.softmax(logits.float(), -1)[..., word_id]
    return float(p[r.mask.bool()].mean())


def test_a_policy_does_not_learn_the_word_its_environment_repeats(tiny_lm):
    """Every turn is rewarded alike and every observation is 'w7 w7 w7': trained over the policy
    mask, the policy's probability of w7 barely moves; the same updates with the observations
    inside the mask (the bug) teach it w7."""
    from fourfold.models.build import load_roles

    over = {"model.policy": tiny_lm / "sft", "model.reward_fn": f"{tiny_lm / 'reward_fn.py'}:reward",
            "data.prompts": tiny_lm / "prompts.jsonl", "ppo.rollout_batch_size": 8, "ppo.minibatch_size": 8,
            "ppo.use_critic": "false"}
    cfg = load_config(PPOConfig, None, [f"{k}={v}" for k, v in over.items()])
    gen = GenerationConfig(max_new_tokens=3, temperature=1.0, stop_at_eos=False)
    env = EnvConfig(max_turns=3, max_tokens=64)
    probs = {}
    for leaky in (False, True):
        roles = load_roles("ppo", cfg, torch.device("cpu"))
        word = roles.tokenizer.convert_tokens_to_ids("w7")
        opt = torch.optim.Adam(roles.policy.parameters(), lr=3e-3)
        before = None
        for it in range(6):
            col = collect_turns(_alone(roles), _envs(Repeat, 4), env, gen, kl_coef=0.0, noise=RowNoise(it, 0))
            before = _p_word(roles.policy, col, word) if before is None else before
            r = col.rollout
            T = r.mask.shape[1]
            mask = r.context["attention_mask"][:, -T:].float() if leaky else r.mask
            ids, attn = r.context["input_ids"], r.context["attention_mask"]
            logprobs, _ = response_logprobs(roles.policy, ids, attn, T, gen.temperature)
            loss, _ = ppo_policy_loss(logprobs, logprobs.detach(), torch.ones_like(mask), mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
        probs[leaky] = (before, _p_word(roles.policy, col, word))
    (b0, a0), (b1, a1) = probs[False], probs[True]
    assert a1 > 3 * b1  # the leak teaches the repeated word (measured: 0.015 -> 0.12)
    assert a0 < 1.5 * b0  # the policy mask does not (measured: 0.015 -> 0.017)


def test_the_ppo_update_runs_unchanged_on_a_multi_turn_rollout(setup):
    """ppo_update (policy and critic epochs) on collect_turns' rollout with advantages over the
    policy's tokens: finite statistics, both models move, and the critic's targets are returns on
    policy tokens only."""
    from fourfold.run.optim import NonFiniteGuard
    from fourfold.trainers.ppo import make_optim, ppo_update

    roles, cfg, _ = setup
    algo = cfg.ppo
    gen = GenerationConfig(max_new_tokens=3, temperature=1.0, stop_at_eos=False)
    env = EnvConfig(max_turns=2, max_tokens=32, truncation="bootstrap")
    opt = make_optim(roles, algo)
    guard = NonFiniteGuard()
    before = [p.detach().clone() for p in (next(roles.policy.parameters()), next(roles.critic.parameters()))]
    for it in range(2):
        col = collect_turns(_alone(roles), _envs(Repeat), env, gen, kl_coef=0.05, noise=RowNoise(11, it))
        rollout = compute_advantages(col.rollout, algo, col.bootstrap)
        obs = (rollout.mask == 0) & (rollout.context["attention_mask"][:, -rollout.mask.shape[1]:] == 1)
        assert bool(obs.any()) and bool((rollout.returns[obs] == 0).all())
        stats = ppo_update(roles, rollout, algo, opt, gen.temperature, guard, it + 1)
        assert all(v == v for v in stats.values()), stats  # no NaN
    assert guard.total == 0
    after = [next(roles.policy.parameters()), next(roles.critic.parameters())]
    assert all(not torch.equal(a, b) for a, b in zip(after, before))


def test_a_first_observation_longer_than_max_tokens_names_the_key(setup):
    from fourfold.errors import ConfigError

    roles, _, _ = setup
    env = EnvConfig(max_turns=2, max_tokens=3)
    with pytest.raises(ConfigError, match="env.max_tokens: the first observation of row p.jsonl:1 has 3 tokens, leaving none of the 3"):
        collect_turns(_alone(roles), _envs(lambda row: _Long(row), 4), env, GenerationConfig(max_new_tokens=2), kl_coef=0.0)


class _Long:
    def __init__(self, row):
        self.prompt = row["prompt"]

    def reset(self):
        return self.prompt

    def step(self, action):
        return "", 0.0, True


def _trajectory(prompt, turns, observations, rewards, done):
    """A Trajectory of policy ``turns`` (id lists) with ``observations`` between them."""
    from fourfold.rollout.turns import Trajectory

    t = Trajectory(prompt=list(prompt))
    for k, ids in enumerate(turns):
        t.add_turn(ids, [-0.5] * len(ids))
        if k < len(observations):
            t.add_observation(observations[k])
    t.turn_rewards, t.done, t.truncated = list(rewards), done, not done
    return t


def test_turn_metrics_of_two_ranks_rows_weigh_by_counts_not_the_ranks_means():
    """Two ranks' rows gathered (rank 0: two one-turn rows; rank 1: two three-turn rows): the
    metrics are those of the 4 rows and 8 stepped turns, by hand. The ranks step different numbers
    of turns, so the mean reward per turn is 5/8, not the mean of the ranks' own (1/2 + 4/6) / 2."""
    from fourfold.rollout.turns import stack_trajectories
    from fourfold.trainers.env_rollouts import turn_metrics

    rank0 = [_trajectory([5, 6], [[7, 8]], [], [1.0], True), _trajectory([5], [[9]], [], [0.0], True)]
    rank1 = [_trajectory([5, 6, 7], [[7], [8], [9]], [[10, 11], [12]], [0.0, 0.0, 1.0], False),
             _trajectory([5], [[7, 8], [9], [8, 8]], [[10], [11]], [1.0, 1.0, 1.0], True)]
    got = turn_metrics(stack_trajectories(rank0 + rank1, pad_token_id=0))
    assert got == {"env/turns_mean": 2.0, "env/truncated_frac": 0.25, "env/done_frac": 0.75,
                   "env/observation_tokens_mean": 1.25, "env/policy_tokens_mean": 2.75,
                   "env/turn_reward_mean": 0.625, "env/return_mean": 1.25}
    means = [turn_metrics(stack_trajectories(r, pad_token_id=0))["env/turn_reward_mean"] for r in (rank0, rank1)]
    assert means == [0.5, pytest.approx(4 / 6)] and sum(means) / 2 != pytest.approx(0.625)

