"""Naive REINFORCE: the baseline PPO improves on.

Same rollout as PPO (same generation, same frozen reference and reward, the same per-token KL
penalty folded into the rewards), but: no critic, no clipping, no importance ratio, and one
gradient step per batch by default. The loss is ``-mean_t(log pi(a_t|s_t) * (G_t - b))`` with ``G_t``
the return-to-go of the token rewards and ``b`` = 0, the batch-mean return or its leave-one-out mean
(``reinforce.baseline``). ``reinforce.batch_epochs`` x ``reinforce.minibatches`` steps per batch match
PPO's optimizer steps (the samples then go stale, with no ratio to say so); ``log_grad_snr`` measures
the minibatch gradients' signal-to-noise (``policy/grad_snr``).

1. sample prompts; 2-4. generate, score, per-token rewards (as PPO);
5. returns-to-go (gamma = 1) over the policy's tokens (an environment's observations read nothing),
   optional baseline (batch mean or leave-one-out);
6. the gradient steps (:func:`update`; the first one's forward against the engine's log-probs:
   ``mismatch/*``; each token weighted by ``rollout_correction``'s weights when set); 7. log, checkpoint.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

import torch
from torch import Tensor

from fourfold.config import ReinforceConfig
from fourfold.core import (
    FixedKLController,
    Rollout,
    leave_one_out_baseline,
    masked_mean,
    reinforce_loss,
)
from fourfold.core.turns import policy_returns
from fourfold.models.build import Roles
from fourfold.models.roles import response_logprobs
from fourfold.run.optim import NonFiniteGuard, guarded_step, make_optimizer, make_schedule
from fourfold.run.parallel import global_sum, loss_scale, rank_slice, several_ranks
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.batches import GradSNR
from fourfold.trainers.practice import mismatch_and_weights, truncation_notes
from fourfold.trainers.prelude import stage_roles
from fourfold.trainers.rl import RLSteps, prepare_rewards
from fourfold.trainers.rollouts import Probe, score_quantity


def rank_loss(policy, r: Rollout, returns: Tensor, baseline: Optional[Tensor], temperature: float,
              correction: str = "none", cap: float = 2.0, metrics: Optional[dict] = None,
              ess: bool = False) -> tuple[Tensor, Tensor]:
    """Step 6's loss on this rank's contiguous share of the batch ``r`` (the whole batch, the same
    on every rank; :func:`~fourfold.run.parallel.rank_slice`): ``(to_backward, loss)``. ``loss`` is
    the batch's token-mean REINFORCE loss (summed over ranks, so the same on each); ``to_backward``
    is this rank's part of it, scaled by :func:`~fourfold.run.parallel.loss_scale` for the ranks'
    averaged gradients. Each token's term is weighted by the rollout ``correction``'s weights (cap
    ``cap``; the loss's forward is pi_train); ``metrics``, when given, receives the ``mismatch/*``
    metrics of that forward (detached, gathered over ranks) against the engine's log-probs (with
    ``ess``, a sampler running ahead: ``rollout/is_ess`` of its weights pi_train / pi_engine)."""
    rows = rank_slice(r.batch_size)
    mine = r.select(rows)
    ids, attn = mine.context["input_ids"], mine.context["attention_mask"]
    logprobs, _ = response_logprobs(policy, ids, attn, mine.mask.shape[1], temperature)
    weights = None
    if metrics is not None or correction != "none":
        train_lp = torch.zeros_like(r.logprobs)
        train_lp[rows] = logprobs.detach().to(train_lp.dtype) * mine.mask
        train_lp = global_sum(train_lp) if several_ranks() else train_lp
        w, found = mismatch_and_weights(train_lp, r.logprobs, r.mask, correction, cap, ess)
        weights = None if w is None else w[rows]
        if metrics is not None:
            metrics.update(found)
    local, _ = reinforce_loss(logprobs, returns[rows], mine.mask, baseline, weights=weights)
    share = float(mine.mask.sum()) / max(float(r.mask.sum()), 1.0)
    return local * loss_scale(share), global_sum(local.detach() * share)


def baseline_of(baseline: str, returns: Tensor, mask: Tensor) -> Optional[Tensor]:
    """Step 5's baseline ``reinforce.baseline``: None ('none'), the batch's token-mean return (0-d,
    'mean') or each row's leave-one-out mean (``[B]``, 'loo')."""
    if baseline == "mean":
        return masked_mean(returns, mask)
    return leave_one_out_baseline(returns, mask) if baseline == "loo" else None


def update_rows(n: int, batch_epochs: int, minibatches: int, it: int) -> list[tuple[str, Optional[Tensor]]]:
    """``(where, rows)`` of each of step 6's optimizer steps: ``rows`` None is the whole batch (one
    step per pass, nothing shuffled: with the defaults the one step of before, ``where`` "iteration
    it"); with ``minibatches`` > 1 each pass shuffles the ``n`` rows (torch.randperm) into that many
    equal slices."""
    if minibatches == 1:
        return [(f"iteration {it}" if batch_epochs == 1 else f"iteration {it} epoch {e}", None)
                for e in range(batch_epochs)]
    size, out = n // minibatches, []
    for e in range(batch_epochs):
        perm = torch.randperm(n)
        out += [(f"iteration {it} epoch {e} minibatch {i}", perm[i * size:(i + 1) * size]) for i in range(minibatches)]
    return out


def update(policy, optimizer, schedule, r: Rollout, returns: Tensor, baseline: Optional[Tensor], cfg: ReinforceConfig,
           guard: NonFiniteGuard, it: int, checked: str) -> tuple[dict, bool]:
    """Step 6: ``batch_epochs`` x ``minibatches`` guarded steps of the REINFORCE loss
    (:func:`rank_loss`; the batch's scores checked as ``checked`` before each); ``(metrics, every
    step taken)``. ``policy/loss`` and ``policy/grad_norm`` are means over the steps (nan for a
    skipped one), ``mismatch/*`` the first step's forward (before any step), ``policy/lr`` the rate
    the first step uses; ``policy/grad_snr`` with ``log_grad_snr``."""
    algo = cfg.reinforce
    snr = GradSNR(algo.minibatches) if algo.log_grad_snr else None
    mismatch: dict = {}
    losses, norms, all_taken = [], [], True
    lr = schedule.get_last_lr()[0]  # the rate the first step uses
    for j, (where, rows) in enumerate(update_rows(r.batch_size, algo.batch_epochs, algo.minibatches, it)):
        part, ret, base = r, returns, baseline
        if rows is not None:
            part, ret = r.select(rows), returns[rows]
            base = baseline if baseline is None or baseline.dim() == 0 else baseline[rows]
        local_loss, loss = rank_loss(policy, part, ret, base, cfg.generation.temperature, algo.rollout_correction,
                                     algo.correction_cap, metrics=mismatch if j == 0 else None,
                                     ess=cfg.rollout.max_staleness > 0)
        norm, taken = guarded_step(policy, optimizer, schedule, algo.max_grad_norm, guard, where,
                                   [(local_loss, {checked: r.scores, "policy_loss": loss})],
                                   on_grads=None if snr is None else snr.on_grads)
        if snr is not None:
            snr.commit(norm)
        losses.append(float(loss.detach()))
        norms.append(float("nan") if norm is None else norm)
        all_taken = all_taken and taken
    metrics = {**mismatch, "policy/loss": sum(losses) / len(losses), "policy/grad_norm": sum(norms) / len(norms),
               "policy/lr": lr, **({} if snr is None else snr.metrics())}
    return metrics, all_taken


def train(cfg: ReinforceConfig, *, prompts: Optional[Sequence[str]] = None, probe: Optional[Probe] = None,
          roles: Optional[Roles] = None) -> dict:
    """Run REINFORCE; returns a summary dict (final metrics, output paths). ``prompts``, ``probe``
    and ``roles`` as for :func:`fourfold.trainers.ppo.train`."""
    algo = cfg.reinforce
    # 0. set-up: the reward functions against the prompts' columns (before anything is created), seed,
    #    run directory, roles (placed on the ranks), optimiser, engine, prompt stream, resume
    rewards = prepare_rewards("reinforce", cfg, prompts, roles)
    run = RunScaffold(cfg)
    device, guard = run.hf_device(), run.guard
    roles = stage_roles(run, "reinforce", cfg, device, {"reinforce.rollout_batch_size": algo.rollout_batch_size},
                        roles=roles, reward_functions=rewards.functions)
    optimizer = make_optimizer(roles.policy.parameters(), algo.lr)
    schedule = make_schedule(optimizer, algo.iterations * algo.steps_per_iteration, algo.lr_schedule)
    rl = RLSteps(run, cfg, roles, device, section="reinforce", n_prompts=algo.rollout_batch_size,
                 trained={"policy": (roles.policy, optimizer, schedule)}, prompts=prompts, probe=probe,
                 notes=rewards.notes + truncation_notes(cfg.generation, algo.rollout_correction, "reinforce"))
    kl_ctl, last = FixedKLController(algo.kl_coef), {}
    with rl.loop("reinforce") as logger:
        for it in rl.iterations():
            t_iter = time.perf_counter()
            # 1-4. sample prompts, generate (the engine given the policy's weights after the last step),
            # score, per-token rewards (KL penalty on every token, score on the last)
            col = rl.rollout(it, kl_coef=kl_ctl.value, kl_estimator=algo.kl_estimator)
            r = col.rollout
            # 5. returns-to-go and the optional baseline
            returns = policy_returns(r.rewards, r.mask)  # over the policy's tokens, single turns or not
            baseline = baseline_of(algo.baseline, returns, r.mask)
            # 6. the gradient steps of the policy-gradient loss (each skipped when the score, the loss or
            # the gradient norm is not finite)
            t0 = time.perf_counter()
            stats, taken = update(roles.policy, optimizer, schedule, r, returns, baseline, cfg, guard, it,
                                  score_quantity(col))
            if taken:
                guard.good_step()
            run.log_skips(it)
            t_train = time.perf_counter() - t0
            # 7. log, checkpoint
            metrics = {
                "iteration": it, "samples": it * algo.rollout_batch_size, **col.metrics, **stats,
                "kl/coef": kl_ctl.value,
                "train/nonfinite_skips": guard.total, "time/train_s": t_train,
                "time/iteration_s": time.perf_counter() - t_iter,
            }
            rl.log(logger, it, metrics, col)
            last = metrics
            run.stop_if_stuck(it)  # skipped steps never touched the weights
            run.checkpoint_if_due(it)
        rl.export()
    return rl.finish(last)
