"""Vector-env stepping -> ``Rollout`` ``[num_envs, T]`` (the gym counterpart of ``rollout/eager.py``).

One batched forward pass of actor and critic per vector step, one batched critic pass per rollout
for the truncation bootstrap, and no per-env Python loop: what Gymnasium needs (``envs.step``) and a
few numpy operations on ``[num_envs]`` arrays are all the per-step work.

Gymnasium 1.x autoreset, and why it matters for the advantages
---------------------------------------------------------------
A vector env resets a finished sub-env by itself. Two modes are supported:

* ``same_step``: the step that ends an episode returns the *next* episode's first observation;
  the final observation of the finished episode is in ``infos["final_obs"][i]``. Every step is a
  real transition (mask 1).
* ``next_step`` (Gymnasium's default): the step that ends an episode returns the final
  observation; the *following* ``step()`` ignores the action, resets the sub-env and returns the
  first observation with reward 0 and terminated = truncated = False. That reset step is not a
  transition of the MDP: it is kept in the Rollout (so rows stay ``[num_envs, T]``) with mask 0 and
  done 1, which makes GAE skip it and cuts bootstrapping across it.

Termination vs truncation: ``terminated`` means the MDP reached a terminal state, whose value is 0:
the step is marked done and nothing bootstraps. ``truncated`` (a time limit) means the episode was
cut although the state still has a future: the step is marked done as well (the next observation
belongs to another episode), but its reward gets ``+ gamma * V(final_obs)``, so GAE sees the same
target as if the episode had continued. This is the convention of ``fourfold.core.gae``. In both
modes the final observation is known (``infos["final_obs"]`` or the returned observation), so the
bootstrapped rewards -- and hence advantages and returns -- are identical.

gymnasium is imported only here and in ``trainers/gym.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from torch import Tensor

from fourfold.core import Rollout, logprobs_from_logits
from fourfold.errors import ConfigError

__all__ = [
    "AUTORESET_MODES",
    "Actor",
    "Critic",
    "EpisodeStats",
    "VecEnvRunner",
    "make_vec_env",
    "collect_steps",
    "collect_episodes",
    "greedy_returns",
]

AUTORESET_MODES = {"same_step": AutoresetMode.SAME_STEP, "next_step": AutoresetMode.NEXT_STEP}

Actor = Callable[[Tensor], Tensor]
"""obs ``[E, *obs_shape]`` float32 -> action logits ``[E, num_actions]``."""
Critic = Callable[[Tensor], Tensor]
"""obs ``[E, *obs_shape]`` float32 -> state values ``[E]``."""


def make_vec_env(
    env_id: str, num_envs: int, *, autoreset_mode: str = "same_step", env_kwargs: Optional[dict] = None
) -> gym.vector.VectorEnv:
    """A SyncVectorEnv of ``num_envs`` copies of ``env_id`` (sync: for classic-control envs the
    per-step cost is microseconds, far below the cost of inter-process messages). An unknown env,
    one whose package is not installed, or keyword arguments it does not take: one ConfigError line."""
    try:
        return gym.make_vec(
            env_id,
            num_envs=num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AUTORESET_MODES[autoreset_mode]},
            **(env_kwargs or {}),
        )
    except (gym.error.Error, ImportError) as e:
        raise ConfigError(f"env.id: {env_id!r} cannot be made ({_first_line(e)})") from None
    except TypeError as e:
        raise ConfigError(f"env.kwargs: {env_kwargs!r} for {env_id!r}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


@dataclass
class EpisodeStats:
    """Undiscounted return and length of each episode that ended during a collection."""

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


@dataclass
class _Step:
    """What one vector step returns, as ``[E]`` arrays; ``valid`` False on next_step reset steps."""

    obs: Tensor
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    final_obs: Optional[np.ndarray]  # [k, *obs_shape] for the envs in `truncated & ~terminated`


class VecEnvRunner:
    """A vector env plus what carries over from one rollout to the next: the current observation
    ``obs [E, *obs_shape]``, which sub-envs face a reset step (next_step mode), and the running
    return/length of every unfinished episode. ``env_steps`` counts every sub-env transition the
    env executed (next_step reset steps included)."""

    def __init__(self, envs: gym.vector.VectorEnv, seed: int) -> None:
        self.envs = envs
        self.num_envs = envs.num_envs
        mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP):
            raise ValueError(f"autoreset mode {mode} is not supported (use same_step or next_step)")
        self.same_step = mode == AutoresetMode.SAME_STEP
        self.env_steps = 0
        self._seed: Optional[int] = seed
        self.reset()

    def reset(self) -> None:
        """Start a fresh episode in every sub-env (seeded the first time only, then the envs' own
        RNG streams continue) and forget unfinished episodes."""
        obs, _ = self.envs.reset(seed=self._seed)
        self._seed = None
        self.obs = torch.as_tensor(obs, dtype=torch.float32)
        self.pending_reset = np.zeros(self.num_envs, dtype=bool)
        self.ep_return = np.zeros(self.num_envs, dtype=np.float64)
        self.ep_length = np.zeros(self.num_envs, dtype=np.int64)

    def step(self, actions: Tensor, stats: EpisodeStats) -> _Step:
        valid = ~self.pending_reset
        obs, rewards, terminated, truncated, infos = self.envs.step(actions.cpu().numpy())
        self.env_steps += self.num_envs
        rewards = np.asarray(rewards, dtype=np.float64)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        boot = truncated & ~terminated  # terminal wins when both are set: no future to bootstrap
        final_obs = None
        if boot.any():
            # same_step: the returned obs already starts the next episode; the last one is in infos.
            final_obs = np.stack(infos["final_obs"][boot]) if self.same_step else np.asarray(obs)[boot]
        done = terminated | truncated
        self.ep_return += np.where(valid, rewards, 0.0)
        self.ep_length += valid
        ended = done & valid
        if ended.any():
            stats.returns.extend(self.ep_return[ended].tolist())
            stats.lengths.extend(self.ep_length[ended].tolist())
            self.ep_return[ended] = 0.0
            self.ep_length[ended] = 0
        if not self.same_step:
            self.pending_reset = done  # next_step: the next step() of these sub-envs only resets
        self.obs = torch.as_tensor(obs, dtype=torch.float32)
        return _Step(self.obs, rewards, terminated, truncated, valid, final_obs)


def _act(actor: Actor, obs: Tensor) -> tuple[Tensor, Tensor]:
    """Sample actions from softmax(logits): ``([E] long, [E] log pi(a|s))``."""
    logits = actor(obs)  # (E, A)
    actions = torch.multinomial(torch.softmax(logits, dim=-1), 1).squeeze(-1)  # (E,)
    return actions, logprobs_from_logits(logits, actions)


def _bootstrap_truncations(rewards: Tensor, steps: list[_Step], critic: Optional[Critic], gamma: float) -> None:
    """rewards[e, t] += gamma * V(final_obs) for every truncated (not terminated) step, with one
    batched critic pass over all those final observations (in place)."""
    where = [(t, torch.from_numpy(np.flatnonzero(s.truncated & ~s.terminated))) for t, s in enumerate(steps)
             if s.final_obs is not None]
    if critic is None or not where:
        return
    final_obs = torch.as_tensor(np.concatenate([s.final_obs for s in steps if s.final_obs is not None]),
                                dtype=torch.float32)
    env_idx = torch.cat([e for _, e in where])
    t_idx = torch.cat([torch.full_like(e, t) for t, e in where])
    rewards[env_idx, t_idx] += gamma * critic(final_obs).to(rewards.dtype)


def _to_rollout(
    steps: list[_Step], obs: list[Tensor], actions: list[Tensor], logprobs: list[Tensor],
    values: list[Tensor], critic: Optional[Critic], gamma: float, mask: Optional[Tensor] = None,
) -> Rollout:
    """Stack per-step ``[E]`` lists along dim 1 into the ``[E, T]`` Rollout."""
    f32 = torch.float32
    terminated = torch.as_tensor(np.stack([s.terminated for s in steps], axis=1))  # (E, T)
    truncated = torch.as_tensor(np.stack([s.truncated for s in steps], axis=1))
    valid = torch.as_tensor(np.stack([s.valid for s in steps], axis=1))
    raw_rewards = torch.as_tensor(np.stack([s.rewards for s in steps], axis=1), dtype=f32)
    rewards = torch.where(valid, raw_rewards, torch.zeros((), dtype=f32))
    _bootstrap_truncations(rewards, steps, critic, gamma)
    if mask is None:
        mask = valid.to(f32)
    # dones: the episode ended at t (terminated or truncated), or t is not a transition at all.
    dones = (terminated | truncated | ~valid).to(f32)
    return Rollout(
        actions=torch.stack(actions, dim=1),
        mask=mask,
        logprobs=torch.stack(logprobs, dim=1).to(f32),
        values=torch.stack(values, dim=1).to(f32),
        rewards=rewards * mask,
        context={
            "obs": torch.stack(obs, dim=1),  # (E, T, *obs_shape)
            "dones": dones,
            "terminated": terminated,
            "truncated": truncated,
            "raw_rewards": raw_rewards * mask,
        },
    )


@torch.no_grad()
def collect_steps(
    runner: VecEnvRunner, actor: Actor, critic: Optional[Critic], num_steps: int, gamma: float
) -> tuple[Rollout, EpisodeStats]:
    """Step every sub-env ``num_steps`` times with actions sampled from ``actor``.

    Returns a Rollout ``[E, T]``: ``actions``, ``logprobs`` (of the sampled actions), ``values``
    V(s_t) (zeros without a critic), ``rewards`` (truncated steps bootstrapped with
    gamma * V(final_obs)), ``mask`` (0 on next_step reset steps) and ``context``: ``obs
    [E, T, *obs_shape]``, ``dones [E, T]`` (for ``core.gae``), ``terminated``, ``truncated``,
    ``raw_rewards``, ``last_values [E]`` = V(obs after the last step). Episodes run on across
    rollouts (the runner keeps their state).
    """
    E = runner.num_envs
    steps, obs, actions, logprobs, values = [], [], [], [], []
    stats = EpisodeStats()
    zeros = torch.zeros(E)
    for _ in range(num_steps):
        o = runner.obs
        a, lp = _act(actor, o)
        obs.append(o)
        actions.append(a)
        logprobs.append(lp)
        values.append(critic(o) if critic is not None else zeros)
        steps.append(runner.step(a, stats))
    rollout = _to_rollout(steps, obs, actions, logprobs, values, critic, gamma)
    rollout.context["last_values"] = critic(runner.obs).float() if critic is not None else zeros.clone()
    return rollout, stats


@torch.no_grad()
def collect_episodes(
    runner: VecEnvRunner, actor: Actor, max_steps: int = 100_000
) -> tuple[Rollout, EpisodeStats]:
    """Reset every sub-env and play exactly one complete episode in each (for REINFORCE).

    Returns a Rollout ``[E, T]`` with T the longest episode; ``mask[e, t]`` = 1 up to and including
    the step that ended env e's first episode, 0 after it (steps an env takes after its episode
    ended, while others finish, are discarded and not counted in ``int(mask.sum())``).
    ``context["dones"]`` marks each episode's last step, so ``core.discounted_returns`` gives the
    Monte-Carlo return. Raises if an episode is still running after ``max_steps`` steps.
    """
    runner.reset()
    E = runner.num_envs
    steps, obs, actions, logprobs, values = [], [], [], [], []
    finished = np.zeros(E, dtype=bool)
    masks = []
    zeros = torch.zeros(E)
    while not finished.all():
        if len(steps) >= max_steps:
            raise RuntimeError(f"an episode ran longer than {max_steps} steps; set a time limit")
        o = runner.obs
        a, lp = _act(actor, o)
        obs.append(o)
        actions.append(a)
        logprobs.append(lp)
        values.append(zeros)
        masks.append(torch.as_tensor(~finished))
        s = runner.step(a, EpisodeStats())  # per-episode stats are read off the mask below
        steps.append(s)
        finished |= (s.terminated | s.truncated) & s.valid
    mask = torch.stack(masks, dim=1).float()  # (E, T)
    rollout = _to_rollout(steps, obs, actions, logprobs, values, None, 1.0, mask=mask)
    stats = EpisodeStats(returns=rollout.context["raw_rewards"].sum(dim=1).double().tolist(),
                         lengths=mask.sum(dim=1).long().tolist())
    return rollout, stats


@torch.no_grad()
def greedy_returns(envs: gym.vector.VectorEnv, actor: Actor, seed: int, max_steps: int = 100_000) -> list[float]:
    """One greedy (argmax) episode per sub-env of ``envs``, all reset from ``seed`` (sub-env i
    gets seed + i); returns the undiscounted return of each. ``envs`` is a dedicated eval env."""
    obs, _ = envs.reset(seed=seed)
    E = envs.num_envs
    total = np.zeros(E)
    finished = np.zeros(E, dtype=bool)
    t = 0
    while not finished.all():
        if t >= max_steps:
            raise RuntimeError(f"an evaluation episode ran longer than {max_steps} steps; set a time limit")
        actions = actor(torch.as_tensor(obs, dtype=torch.float32)).argmax(dim=-1)
        obs, rewards, terminated, truncated, _ = envs.step(actions.numpy())
        # next_step mode: a finished env's reset step adds reward 0 and is ignored anyway
        total += np.where(finished, 0.0, rewards)
        finished |= np.asarray(terminated) | np.asarray(truncated)
        t += 1
    return total.tolist()
