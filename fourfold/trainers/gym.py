"""`fourfold gym`: PPO (and a REINFORCE baseline) on a discrete-action Gymnasium environment.

The same ``fourfold.core`` functions that train the language model train this agent: GAE
(``gae``), Monte-Carlo returns (``discounted_returns``), the clipped policy loss
(``ppo_policy_loss``), the (clipped) value loss (``value_loss``), ``reinforce_loss`` with
``mean_baseline``, ``masked_whiten``, ``masked_mean``, ``logprobs_from_logits``,
``entropy_from_logits``, ``explained_variance`` and the ``Rollout`` type. Nothing here re-derives
that math; this module only wires environments, two small MLPs and an optimizer around it.

PPO implementation details (numbered as in docs/gym.md; CleanRL's ppo.py uses the same ones):

 1. Vectorised environments: ``env.num_envs`` copies stepped together; a batch is
    ``num_envs * num_steps`` transitions, rows ``[num_envs, num_steps]``.
 2. Separate actor and critic MLPs (no shared trunk), orthogonal init: hidden layers gain
    sqrt(2), policy head 0.01 (a near-uniform initial policy), value head 1, biases 0.
 3. Adam with eps 1e-5 over both networks.
 4. Learning rate annealed linearly from ``ppo.lr`` to 0 over the run (``lr_schedule: linear``).
 5. GAE(gamma, lambda) across episode boundaries inside a row: ``terminated`` cuts the return
    (V = 0 after a terminal state); ``truncated`` also cuts it but bootstraps, adding
    gamma * V(final_obs) to the last reward. Gymnasium 1.x autoreset is handled in
    ``fourfold.rollout.gym`` (same_step by default; next_step reset steps are masked out).
 6. ``ppo_epochs`` passes over the batch, each in shuffled minibatches of ``minibatch_size``.
 7. Advantages whitened per minibatch (``whiten_advantages``).
 8. Clipped surrogate objective (``clip_eps``).
 9. Optional clipped value loss (``vf_clip_eps``) around the rollout's values.
10. Entropy bonus (``entropy_coef``).
11. Global gradient-norm clipping over actor and critic together (``max_grad_norm``).
12. Optional early stop of the epochs once approx_kl > ``target_kl``.
13. Diagnostics: approx_kl (k3 estimator), clipfrac, explained variance, entropy, episodic
    return/length, greedy evaluation return, env steps per second.

REINFORCE (``algo: reinforce``): no critic, no clipping; each iteration plays one complete episode
in each of the ``env.num_envs`` envs with the current policy, weights every log-prob by the
Monte-Carlo return from that step on (optionally minus the batch mean return), and takes one
gradient step.

The training loop reads as numbered steps: 1. collect, 2. advantages, 3. update, 4. evaluate/log.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn

from fourfold.config import GymConfig
from fourfold.core import (
    Rollout,
    discounted_returns,
    entropy_from_logits,
    explained_variance,
    gae,
    logprobs_from_logits,
    masked_mean,
    masked_whiten,
    mean_baseline,
    ppo_policy_loss,
    reinforce_loss,
    value_loss,
)
from fourfold.errors import ConfigError, NonFiniteError
from fourfold.rollout.gym import EpisodeStats, VecEnvRunner, collect_episodes, collect_steps, greedy_returns, make_vec_env
from fourfold.run.optim import NonFiniteGuard, guarded_step, make_optimizer
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.gym_plots import plot_run

__all__ = [
    "train",
    "build_actor",
    "build_critic",
    "compute_advantages",
    "flatten_valid",
    "ppo_update",
    "reinforce_update",
    "solved_threshold",
]


# ---- networks --------------------------------------------------------------------------------


def _layer(n_in: int, n_out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(n_in: int, hidden: Sequence[int], n_out: int, head_gain: float, activation: str) -> nn.Sequential:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [_layer(n_in, h, math.sqrt(2)), act()]
        n_in = h
    layers.append(_layer(n_in, n_out, head_gain))
    return nn.Sequential(*layers)


def build_actor(obs_dim: int, num_actions: int, hidden: Sequence[int] = (64, 64), activation: str = "tanh") -> nn.Module:
    """obs ``[N, obs_dim]`` -> logits ``[N, num_actions]``; head gain 0.01: initial policy ~ uniform."""
    return _mlp(obs_dim, hidden, num_actions, 0.01, activation)


def build_critic(obs_dim: int, hidden: Sequence[int] = (64, 64), activation: str = "tanh") -> nn.Module:
    """obs ``[N, obs_dim]`` -> values ``[N]`` (head gain 1)."""
    return nn.Sequential(*_mlp(obs_dim, hidden, 1, 1.0, activation), nn.Flatten(0))


# ---- step 2: advantages ----------------------------------------------------------------------


def compute_advantages(rollout: Rollout, gamma: float, lam: float) -> Rollout:
    """Fill ``advantages`` and ``returns`` ``[E, T]`` with ``core.gae`` (episode ends from
    ``context["dones"]``, the row's tail bootstrapped from ``context["last_values"]``; truncated
    steps already carry gamma * V(final_obs) in their reward, see ``rollout/gym.py``)."""
    rollout.advantages, rollout.returns = gae(
        rollout.rewards, rollout.values, rollout.mask, gamma, lam,
        dones=rollout.context["dones"], last_values=rollout.context["last_values"],
    )
    return rollout


def flatten_valid(rollout: Rollout) -> Rollout:
    """``[E, T]`` -> a Rollout of the ``N`` valid steps, every field ``[N]`` (obs ``[N, obs_dim]``),
    so minibatches are ``.select(idx)`` of it. Context entries that are per-row only are dropped."""
    valid = rollout.mask.bool().reshape(-1)
    E, T = rollout.mask.shape

    def flat(x: Optional[Tensor]) -> Optional[Tensor]:
        return None if x is None else x.reshape(E * T, *x.shape[2:])[valid]

    return Rollout(
        actions=flat(rollout.actions), mask=flat(rollout.mask), logprobs=flat(rollout.logprobs),
        values=flat(rollout.values), rewards=flat(rollout.rewards), advantages=flat(rollout.advantages),
        returns=flat(rollout.returns),
        context={k: flat(v) for k, v in rollout.context.items() if v.dim() >= 2 and v.shape[:2] == (E, T)},
    )


# ---- step 3: updates -------------------------------------------------------------------------


def _ppo_minibatch_loss(actor: nn.Module, critic: nn.Module, mb: Rollout, cfg) -> tuple[Tensor, dict]:
    """PPO loss on one minibatch (details 7-10), all math from fourfold.core."""
    obs = mb.context["obs"]
    logits = actor(obs)  # (n, A)
    logprobs = logprobs_from_logits(logits, mb.actions)  # (n,)
    entropy = masked_mean(entropy_from_logits(logits), mb.mask)
    advantages = masked_whiten(mb.advantages, mb.mask) if cfg.whiten_advantages else mb.advantages
    pg_loss, pg_stats = ppo_policy_loss(logprobs, mb.logprobs, advantages, mb.mask, clip_eps=cfg.clip_eps)
    v_loss, v_stats = value_loss(critic(obs), mb.values, mb.returns, mb.mask,
                                 clip_eps=cfg.vf_clip_eps)
    loss = pg_loss - cfg.entropy_coef * entropy + cfg.vf_coef * v_loss
    stats = {
        "policy/loss": pg_loss.detach(), "policy/entropy": entropy.detach(),
        "policy/approx_kl": pg_stats["approx_kl"], "policy/clipfrac": pg_stats["clipfrac"],
        "value/loss": v_loss.detach(), "value/clipfrac": v_stats["clipfrac"],
    }
    return loss, stats


def ppo_update(agent: nn.ModuleDict, optimizer: torch.optim.Optimizer, batch: Rollout, cfg,
               guard: NonFiniteGuard, num_minibatches: int) -> dict:
    """Details 6-12 on a flattened batch ``[N]``: ``cfg.ppo_epochs`` epochs of
    ``num_minibatches`` shuffled minibatches, each one clipped optimizer step (a step whose
    gradient is not finite is skipped and counted by ``guard``). Returns the mean stats of the
    last epoch run and ``policy/epochs``."""
    epochs_run, mean_stats = 0, {}
    for _ in range(cfg.ppo_epochs):
        epochs_run += 1
        epoch_stats: list[dict] = []
        for idx in torch.randperm(batch.batch_size).tensor_split(num_minibatches):
            loss, stats = _ppo_minibatch_loss(agent["actor"], agent["critic"], batch.select(idx), cfg)
            norm, taken = guarded_step(agent, optimizer, None, cfg.max_grad_norm, guard, "gym ppo minibatch",
                                       [(loss, {})])
            if taken:
                guard.good_step()
                epoch_stats.append({**stats, "policy/grad_norm": torch.tensor(norm)})
            guard.check_limit()
        if epoch_stats:
            mean_stats = {k: float(torch.stack([s[k] for s in epoch_stats]).mean()) for k in epoch_stats[0]}
        if mean_stats and cfg.target_kl is not None and mean_stats["policy/approx_kl"] > cfg.target_kl:
            break  # detail 12
    return {**mean_stats, "policy/epochs": epochs_run}


def reinforce_update(actor: nn.Module, optimizer: torch.optim.Optimizer, rollout: Rollout, cfg,
                     guard: NonFiniteGuard) -> dict:
    """One REINFORCE gradient step on a batch of complete episodes ``[E, T]``:
    loss = -mean_t log pi(a_t|s_t) * (G_t - b), G_t the discounted return from t to the episode's
    end (``core.discounted_returns``), b = the batch mean of G (``core.mean_baseline``) or 0."""
    returns = discounted_returns(rollout.rewards, rollout.mask, cfg.gamma, dones=rollout.context["dones"])
    baseline = mean_baseline(returns[rollout.mask.bool()]) if cfg.baseline == "mean" else None
    logits = actor(rollout.context["obs"])  # (E, T, A)
    logprobs = logprobs_from_logits(logits, rollout.actions)  # (E, T)
    loss, loss_stats = reinforce_loss(logprobs, returns, rollout.mask, baseline=baseline)
    norm, taken = guarded_step(actor, optimizer, None, cfg.max_grad_norm, guard, "gym reinforce step", [(loss, {})])
    if not taken:
        guard.check_limit()
        return {}
    guard.good_step()
    with torch.no_grad():
        entropy = masked_mean(entropy_from_logits(logits), rollout.mask)
    return {"policy/loss": float(loss.detach()), "policy/entropy": float(entropy), "policy/grad_norm": norm,
            "policy/advantage_mean": float(loss_stats["advantage_mean"])}


# ---- step 4: evaluation ----------------------------------------------------------------------


def solved_threshold(cfg: GymConfig) -> Optional[float]:
    """``env.solved_return``, else the env's registered reward_threshold (None when neither)."""
    if cfg.env.solved_return is not None:
        return cfg.env.solved_return
    return gym.spec(cfg.env.id).reward_threshold


@dataclass
class _Progress:
    """Run state that a checkpoint carries (everything else is rebuilt from the config)."""

    env_steps: int = 0
    iteration: int = 0
    evals: list = field(default_factory=list)  # [[env_steps, mean, std], ...]
    first_solved_step: Optional[int] = None


class _Evaluator:
    """Greedy evaluation each time env_steps crosses a multiple of ``eval.every_steps``."""

    def __init__(self, cfg: GymConfig, actor: nn.Module, threshold: Optional[float]) -> None:
        self.cfg, self.actor, self.threshold = cfg, actor, threshold
        self.envs = make_vec_env(cfg.env.id, cfg.eval.episodes, env_kwargs=cfg.env.kwargs)
        self.seed = cfg.run.seed + cfg.eval.seed_offset

    def due(self, prev_steps: int, steps: int) -> bool:
        every = self.cfg.eval.every_steps
        return every > 0 and steps // every > prev_steps // every

    def __call__(self, progress: _Progress) -> dict:
        returns = np.asarray(greedy_returns(self.envs, self.actor, self.seed))
        mean, std = float(returns.mean()), float(returns.std())
        progress.evals.append([progress.env_steps, mean, std])
        if progress.first_solved_step is None and self.threshold is not None and mean >= self.threshold:
            progress.first_solved_step = progress.env_steps
        return {"gym/eval_return": mean, "gym/eval_return_std": std}

    def close(self) -> None:
        self.envs.close()


# ---- the run ---------------------------------------------------------------------------------


def _device(name: str) -> torch.device:
    # 'auto' means CPU here: a 64-unit MLP stepped one env batch at a time is launch-bound on a GPU.
    return torch.device("cpu" if name == "auto" else name)


def _make_agent(cfg: GymConfig, envs) -> nn.ModuleDict:
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    if not isinstance(act_space, gym.spaces.Discrete) or not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(f"env.id: {cfg.env.id} has {act_space} actions and {obs_space} observations; "
                          "the gym trainer needs Discrete actions and a Box observation")
    obs_dim = int(np.prod(obs_space.shape))
    agent = nn.ModuleDict({"actor": build_actor(obs_dim, int(act_space.n), cfg.agent.hidden_sizes, cfg.agent.activation)})
    if cfg.algo == "ppo":
        agent["critic"] = build_critic(obs_dim, cfg.agent.hidden_sizes, cfg.agent.activation)
    return agent


def _ppo_iteration(runner: VecEnvRunner, agent: nn.ModuleDict, optimizer, cfg: GymConfig, progress: _Progress,
                   num_iterations: int, guard: NonFiniteGuard) -> tuple[dict, EpisodeStats]:
    """Steps 1-3 of one PPO iteration; returns (metrics, finished episodes)."""
    ppo = cfg.ppo
    if ppo.lr_schedule == "linear":  # detail 4: lr at the first iteration, lr/num_iterations at the last
        for group in optimizer.param_groups:
            group["lr"] = (1.0 - (progress.iteration - 1) / num_iterations) * ppo.lr
    t0 = time.perf_counter()
    # 1. collect: num_envs x num_steps transitions with the current (sampling) policy
    rollout, episodes = collect_steps(runner, agent["actor"], agent["critic"], ppo.num_steps, ppo.gamma)
    progress.env_steps += rollout.mask.numel()
    t1 = time.perf_counter()
    # 2. advantages: GAE along each env's row, then the valid steps flattened to [N]
    batch = flatten_valid(compute_advantages(rollout, ppo.gamma, ppo.lam))
    # 3. update: epochs x shuffled minibatches of the clipped PPO loss
    stats = ppo_update(agent, optimizer, batch, ppo, guard, cfg.num_minibatches)
    stats.update({
        "value/explained_variance": explained_variance(batch.values, batch.returns, batch.mask),
        "value/mean": float(batch.values.mean()), "policy/lr": optimizer.param_groups[0]["lr"],
        "time/rollout_s": t1 - t0, "time/train_s": time.perf_counter() - t1,
    })
    return stats, episodes


def _reinforce_iteration(runner: VecEnvRunner, agent: nn.ModuleDict, optimizer, cfg: GymConfig,
                         progress: _Progress, guard: NonFiniteGuard) -> tuple[dict, EpisodeStats]:
    """Steps 1-3 of one REINFORCE iteration; returns (metrics, finished episodes)."""
    t0 = time.perf_counter()
    # 1. collect: one complete episode per env with the current policy
    rollout, episodes = collect_episodes(runner, agent["actor"])
    progress.env_steps += int(rollout.mask.sum())
    t1 = time.perf_counter()
    # 2. advantages: Monte-Carlo returns (minus the mean baseline) and 3. update: one step
    stats = reinforce_update(agent["actor"], optimizer, rollout, cfg.reinforce, guard)
    stats.update({"time/rollout_s": t1 - t0, "time/train_s": time.perf_counter() - t1})
    return stats, episodes


def train(cfg: GymConfig) -> dict:
    """Train ``cfg.algo`` on ``cfg.env.id`` for the configured budget; write ``config.yaml``,
    ``metrics.jsonl``, ``learning_curve.png``, ``summary.json`` and checkpoints into
    ``run.output_dir``; print the summary as one JSON line and return it.

    Summary keys: ``algo``, ``env``, ``seed``, ``env_steps`` (total), ``eval_return_mean`` /
    ``eval_return_std`` (last evaluation), ``first_solved_step`` (env steps at the first
    evaluation whose mean reached the solved threshold, or null), ``solved_threshold``,
    ``wall_s``, ``run_dir``, ``evals`` ([[env_steps, mean, std], ...]).
    """
    t_start = time.perf_counter()
    if _device(cfg.run.device).type != "cpu":
        raise ConfigError("run.device: the gym trainer runs on the CPU (tiny MLPs); use 'cpu' or 'auto'")
    run = RunScaffold(cfg)  # seed, run directory, config.yaml, threads
    envs = make_vec_env(cfg.env.id, cfg.env.num_envs, autoreset_mode=cfg.env.autoreset_mode, env_kwargs=cfg.env.kwargs)
    try:
        agent = _make_agent(cfg, envs)
    except ConfigError:
        envs.close()
        raise
    algo_cfg = cfg.ppo if cfg.algo == "ppo" else cfg.reinforce
    optimizer = make_optimizer(agent.parameters(), lr=algo_cfg.lr, eps=algo_cfg.adam_eps)  # detail 3
    guard = run.guard
    progress = _Progress()
    run.track(modules={"agent": agent}, optimizers={"adam": optimizer}, state=lambda step: vars(progress))
    state = run.resume()
    if state is not None:  # weights, optimizer, counters and RNG continue; the envs restart with fresh episodes
        progress = _Progress(**state)
    runner = VecEnvRunner(envs, seed=cfg.run.seed + progress.iteration)
    threshold = solved_threshold(cfg)
    evaluate = _Evaluator(cfg, agent["actor"], threshold)
    num_iterations = cfg.ppo.total_timesteps // (cfg.env.num_envs * cfg.ppo.num_steps)

    def finished() -> bool:
        if cfg.algo == "ppo":
            return progress.iteration >= num_iterations
        return progress.env_steps >= cfg.reinforce.total_timesteps

    try:
        with run.loop(total=algo_cfg.total_timesteps, desc=f"{cfg.algo} {cfg.env.id}",
                      key_metrics=("gym/eval_return", "gym/episodic_return")) as logger:
            while not finished():
                t_iter = time.perf_counter()
                progress.iteration += 1
                prev_steps = progress.env_steps
                # steps 1. collect, 2. advantages, 3. update
                if cfg.algo == "ppo":
                    stats, episodes = _ppo_iteration(runner, agent, optimizer, cfg, progress, num_iterations, guard)
                else:
                    stats, episodes = _reinforce_iteration(runner, agent, optimizer, cfg, progress, guard)
                # 4. evaluate (greedy, at every multiple of eval.every_steps and at the end) / log
                metrics = {**stats, "iteration": progress.iteration, "train/nonfinite_skips": guard.total}
                if episodes.returns:
                    metrics["gym/episodic_return"] = float(np.mean(episodes.returns))
                    metrics["gym/episodic_length"] = float(np.mean(episodes.lengths))
                if evaluate.due(prev_steps, progress.env_steps) or finished():
                    metrics.update(evaluate(progress))
                elapsed = time.perf_counter() - t_iter
                metrics.update({"time/iteration_s": elapsed,
                                "time/env_steps_per_s": (progress.env_steps - prev_steps) / max(elapsed, 1e-9)})
                logger.log(progress.env_steps, metrics)
                run.checkpoint_if_due(progress.env_steps, count=progress.iteration)
                if cfg.stop_when_solved and progress.first_solved_step is not None:
                    break
            if not progress.evals or progress.evals[-1][0] != progress.env_steps:
                logger.log(progress.env_steps, evaluate(progress))  # e.g. resumed at the very end
            run.save(progress.env_steps)
    except NonFiniteError:
        run.save(progress.env_steps)  # skipped steps never touched the weights: this is the last good state
        raise
    finally:
        envs.close()
        evaluate.close()

    return _finish(run, cfg, progress, threshold, time.perf_counter() - t_start)


def _finish(run: RunScaffold, cfg: GymConfig, progress: _Progress, threshold: Optional[float], wall_s: float) -> dict:
    """The run's summary (see :func:`train`), also written as ``summary.json`` next to
    ``learning_curve.png`` and printed as one JSON line."""
    last_eval = progress.evals[-1]
    summary = {
        "algo": cfg.algo, "env": cfg.env.id, "seed": cfg.run.seed, "env_steps": progress.env_steps,
        "eval_return_mean": last_eval[1], "eval_return_std": last_eval[2],
        "first_solved_step": progress.first_solved_step, "solved_threshold": threshold,
        "wall_s": round(wall_s, 2), "run_dir": str(run.out), "evals": progress.evals,
    }
    run.write(plot_run, run.out, progress.evals, f"{cfg.algo} on {cfg.env.id}, seed {cfg.run.seed}", threshold)
    run.write((run.out / "summary.json").write_text, json.dumps(summary) + "\n", encoding="utf-8")
    run.finish(summary, summary=run.out / "summary.json", curve=run.out / "learning_curve.png")
    print(json.dumps(summary), flush=True)  # the last line: the summary as JSON
    return summary
