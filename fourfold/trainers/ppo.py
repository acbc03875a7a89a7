"""PPO with the four models in memory (policy, reference, reward model, critic).

One iteration, as numbered in :func:`train`:

1. sample prompts (rollout_batch_size / K of them, each repeated on K consecutive rows);
2. generate with the policy, keeping its log-probs as pi_old (the rollout engine of
   ``generation.engine``, given the policy's current weights by ``engine.sync`` first);
3. score: reference log-probs, critic values and the frozen reward model's score;
4. per-token rewards: -kl_coef * KL_t on every token, the score added on the last one;
   4b. DAPO's overlong punishment (``overlong_buffer``), the groups' zero spread logged;
5. advantages with the critic and GAE (gamma, lambda), whitened over the batch; returns = A + V
   (the value targets at ``critic_lam`` when set); 5b. ``mask_truncated`` drops no-EOS rows;
6. several epochs over shuffled minibatches: the clipped surrogate for the policy, the clipped
   value loss for the critic (each with its own AdamW, grad clipping and linear LR decay);
   6a first: pi_old recomputed by the trainer (``old_logprobs``), the engine-trainer mismatch
   measured (``mismatch/*``), the rollout correction's weights; the first ``critic_warmup``
   iterations train the critic only;
7. update the KL controller, log, checkpoint.

That is PPO's default (``ppo.advantage: gae``). Step 5 calls the estimator registered under
``ppo.advantage`` in :mod:`fourfold.core.estimators`; one that needs no critic (grpo, dr_grpo,
rloo, reinforce_pp) loads none, so step 3 has no critic pass and step 6 no value loss. With
``ppo.kl_in: loss`` step 4 leaves the KL out of the rewards and step 6 adds kl_coef * k3 KL to the
policy loss (GRPO's); ``ppo.loss_agg`` and ``ppo.clip_eps_low/high`` shape the surrogate.

Efficiency notes: reference/reward/critic passes run once per iteration (never inside the epochs);
minibatches are trimmed to their longest valid response; the LM head is applied only at response
positions; log-probs never materialise a float32 copy of the full-vocabulary log-softmax.

With ``model.lora`` the roles are adapters over one frozen base (the reference is the base itself,
the reward and, with ``critic_mode: adapter``, the critic can be adapters too; the role plan,
:mod:`fourfold.models.plan`, says which): the loop is the same, each role's parameters being its
adapter (and head) only.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable, Optional, Sequence

import torch

from fourfold.config import PPOAlgoConfig, PPOConfig
from fourfold.core import (
    AdaptiveKLController,
    AdvantageInputs,
    FixedKLController,
    Rollout,
    aggregate_loss,
    dense_logprobs,
    explained_variance,
    get_advantage_estimator,
    kl_loss,
    masked_mean,
    masked_var,
    masked_whiten,
    ppo_policy_loss,
    value_loss,
)
from fourfold.core.turns import policy_advantages
from fourfold.errors import ConfigError
from fourfold.models.build import Roles
from fourfold.models.roles import ScalarModel, response_logits, response_logprobs
from fourfold.run.optim import NonFiniteGuard, guarded_step, make_optimizer, make_schedule
from fourfold.run.parallel import global_sum, loss_scale, sum_over_ranks
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.batches import GradSNR, Minibatch, micro_batches, minibatches
from fourfold.trainers.groups import collect_groups
from fourfold.trainers.practice import (
    mask_truncated,
    practice_notes,
    prepare_old_logprobs,
    said_old_logprobs,
    shape_scores,
    truncation_notes,
    warm_start_critic,
)
from fourfold.trainers.prelude import stage_roles
from fourfold.trainers.rl import RLSteps, prepare_rewards
from fourfold.trainers.rollouts import Probe, score_quantity


def compute_advantages(rollout: Rollout, algo: PPOAlgoConfig, bootstrap: Optional[torch.Tensor] = None) -> Rollout:
    """Step 5: advantages and returns by the estimator registered under ``algo.estimator`` (GAE
    with the critic by default; ``use_critic: false`` is reinforce_pp, the whitened returns), over
    the policy's tokens (:func:`fourfold.core.turns.policy_advantages`: the rollout's ``mask``; on a
    single-turn batch, a left-aligned mask, that is the estimator on the tensors as they are), each
    row's last policy reward plus ``gamma * bootstrap`` when given (an environment run's cut
    trajectories, with a critic).

    ``whiten_rewards`` and ``whiten_advantages`` apply around an estimator that needs a critic
    (gae); the critic-free ones normalise their own advantages, and the K samples of a prompt are
    their ``samples_per_prompt`` consecutive rows. With ``critic_lam`` the returns (the critic's
    targets) are GAE(gamma, critic_lam)'s + V, the advantages keep ``lam``'s."""
    mask, rewards = rollout.mask, rollout.rewards
    if algo.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    estimator = get_advantage_estimator(algo.estimator)
    values = rollout.values if estimator.needs_critic else None
    boot = bootstrap if estimator.needs_critic else None
    advantages, returns = policy_advantages(
        estimator, AdvantageInputs(rewards, mask, values, algo.samples_per_prompt, algo.gamma, algo.lam), bootstrap=boot)
    if algo.whiten_advantages and estimator.needs_critic:
        advantages = masked_whiten(advantages, mask)
    if algo.critic_lam is not None and estimator.needs_critic:  # the value targets at their own lambda
        _, returns = policy_advantages(
            estimator, AdvantageInputs(rewards, mask, values, algo.samples_per_prompt, algo.gamma, algo.critic_lam),
            bootstrap=boot)
    rollout.advantages, rollout.returns = advantages, returns
    return rollout


def policy_loss(policy, part: Rollout, algo: PPOAlgoConfig, temperature: float, dense: bool = False
                ) -> tuple[torch.Tensor, dict]:
    """The policy's loss on one micro-batch and its statistics (tensors): the clipped surrogate
    (or ``policy_loss``'s; ``dual_clip``, ``ratio_level``; each token weighted by the rollout
    correction's ``is_weights`` when set), minus the entropy bonus, plus ``kl_coef`` x the k3 KL under ``kl_in: loss``, aggregated by
    ``loss_agg``. ``dense``: log-probs in plain tensor ops (:func:`fourfold.core.dense_logprobs`),
    which ``torch.compile`` traces into one graph with the model's forward (``model.compile``)."""
    ids, attn, T = part.context["input_ids"], part.context["attention_mask"], part.mask.shape[1]
    with_entropy = algo.entropy_coef > 0
    if dense:
        logprobs, entropy = dense_logprobs(response_logits(policy, ids, attn, T), ids[:, -T:], temperature,
                                           with_entropy)
    else:
        logprobs, entropy = response_logprobs(policy, ids, attn, T, temperature, with_entropy=with_entropy)
    newer = {k: v for k, v in (("dual_clip", algo.dual_clip), ("token_weights", part.is_weights)) if v is not None}
    newer.update({k: v for k, v, default in (("ratio_level", algo.ratio_level, "token"),
                                             ("kind", algo.policy_loss, "clip")) if v != default})
    loss, stats = ppo_policy_loss(logprobs, part.logprobs, part.advantages, part.mask, algo.clip_eps,
                                  clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, agg=algo.loss_agg,
                                  **newer)  # the newer losses' keys only when set
    if with_entropy:
        loss = loss - algo.entropy_coef * aggregate_loss(entropy, part.mask, algo.loss_agg)
    if algo.kl_in == "loss":
        kl, kl_stats = kl_loss(logprobs, part.ref_logprobs, part.mask, "k3", algo.loss_agg)
        loss = loss + algo.kl_coef * kl
        stats["kl_loss"] = kl_stats["kl"]
    return loss, stats


def critic_loss(critic, part: Rollout, algo: PPOAlgoConfig) -> tuple[torch.Tensor, dict]:
    """The critic's (clipped) value loss on one micro-batch, a token mean, and its statistics."""
    values = critic.response_values(part.context["input_ids"], part.context["attention_mask"], part.mask.shape[1])
    return value_loss(values, part.values, part.returns, part.mask, algo.vf_clip_eps)


@dataclass
class Optim:
    """The trained roles' optimizers and schedules, and the loss functions of their micro-batches
    (:func:`policy_loss`, :func:`critic_loss`; compiled with ``model.compile``)."""

    policy_opt: torch.optim.Optimizer
    policy_sched: object
    critic_opt: Optional[torch.optim.Optimizer]
    critic_sched: object
    policy_loss: Callable = policy_loss
    critic_loss: Callable = critic_loss

    def trained(self, roles: Roles) -> dict:
        """What the checkpoints hold of the trained roles: name -> (module, optimizer, schedule)."""
        out = {"policy": (roles.policy, self.policy_opt, self.policy_sched)}
        if roles.critic is not None:
            out["critic"] = (roles.critic, self.critic_opt, self.critic_sched)
        return out

    def lrs(self) -> dict:
        """The learning rates the next update starts with: policy/lr (and value/lr with a critic)."""
        lrs = {"policy/lr": self.policy_sched.get_last_lr()[0]}
        if self.critic_sched is not None:
            lrs["value/lr"] = self.critic_sched.get_last_lr()[0]
        return lrs


def make_optim(roles: Roles, algo: PPOAlgoConfig, compiled: bool = False) -> Optim:
    """AdamW and the linear schedule of the policy (and the critic); with ``compiled`` the loss of
    each micro-batch, forward included, runs through ``torch.compile`` with dynamic shapes (one
    graph for every trimmed width; compiled on first use)."""
    total = algo.iterations * algo.steps_per_iteration
    popt = make_optimizer(roles.policy.parameters(), algo.lr, algo.weight_decay)
    # the policy's schedule spans the iterations after the critic's warm-up
    psched = make_schedule(popt, (algo.iterations - algo.critic_warmup) * algo.steps_per_iteration, algo.lr_schedule)
    copt = csched = None
    if roles.critic is not None:
        copt = make_optimizer(roles.critic.parameters(), algo.critic_lr, algo.weight_decay)
        csched = make_schedule(copt, total, algo.lr_schedule)
    if not compiled:
        return Optim(popt, psched, copt, csched)
    return Optim(popt, psched, copt, csched, torch.compile(partial(policy_loss, dense=True), dynamic=True),
                 torch.compile(critic_loss, dynamic=True))


def policy_step(policy, mb: Minibatch, algo: PPOAlgoConfig, opt: Optim, temperature: float,
                guard: NonFiniteGuard, snr: Optional[GradSNR] = None) -> dict:
    """One optimizer step of the policy loss (:func:`policy_loss`) on a minibatch, accumulated over
    micro-batches, each aggregated by ``loss_agg`` over the whole minibatch (each part weighted by
    its share of the minibatch's units, scaled by :func:`~fourfold.run.parallel.loss_scale` for
    the ranks' averaged gradients). Returns this rank's share of the logged statistics (the loss as
    the minibatch's aggregate, the others as means over its valid tokens; summed over ranks by the
    caller) and the grad norm, the same on every rank. ``snr`` (``log_grad_snr``) sees the step's
    gradient before the clip."""
    stats_sum: dict[str, float] = {}
    total_tokens = max(mb.tokens, 1.0)

    def micro_losses():
        for part, weight in micro_batches(mb.rows, algo, algo.loss_agg, mb.units):
            loss, stats = opt.policy_loss(policy, part, algo, temperature)
            yield loss * loss_scale(weight), {"policy_loss": global_sum(loss.detach())}
            stats_sum["loss"] = stats_sum.get("loss", 0.0) + float(loss.detach()) * weight
            share = float(part.mask.sum()) / total_tokens  # = weight under token-mean
            for k, v in stats.items():
                stats_sum[k] = stats_sum.get(k, 0.0) + float(v) * share

    norm, _ = guarded_step(policy, opt.policy_opt, opt.policy_sched, algo.max_grad_norm, guard, mb.where,
                           micro_losses(), schedule_on_skip=False, on_grads=None if snr is None else snr.on_grads)
    if snr is not None:
        snr.commit(norm)
    if norm is None:
        return {"policy/loss": float("nan")}
    out = {"policy/loss": stats_sum["loss"], "policy/clipfrac": stats_sum["clipfrac"],
           "policy/approx_kl": stats_sum["approx_kl"], "policy/grad_norm": norm,
           "policy/ratio_abs_dev": stats_sum["ratio_abs_dev"], "policy/dual_clipfrac": stats_sum["dual_clipfrac"]}
    if "kl_loss" in stats_sum:
        out["policy/kl_loss"] = stats_sum["kl_loss"]
    return out


def critic_step(critic: ScalarModel, mb: Minibatch, algo: PPOAlgoConfig, opt: Optim, guard: NonFiniteGuard) -> dict:
    """One optimizer step of the (clipped) value loss to the returns (:func:`critic_loss`), a token
    mean over the whole minibatch (weighted and scaled as in :func:`policy_step`); this rank's share
    of the statistics."""
    stats_sum: dict[str, float] = {}

    def micro_losses():
        for part, weight in micro_batches(mb.rows, algo, "token-mean", mb.tokens):
            loss, stats = opt.critic_loss(critic, part, algo)
            yield loss * loss_scale(weight), {"value_loss": global_sum(loss.detach())}
            for k, v in {"loss": loss.detach(), "clipfrac": stats["clipfrac"]}.items():
                stats_sum[k] = stats_sum.get(k, 0.0) + float(v) * weight

    norm, _ = guarded_step(critic, opt.critic_opt, opt.critic_sched, algo.max_grad_norm, guard, mb.where,
                           micro_losses(), schedule_on_skip=False)
    if norm is None:
        return {"value/loss": float("nan")}
    return {"value/loss": stats_sum["loss"], "value/clipfrac": stats_sum["clipfrac"], "value/grad_norm": norm}


RANK_INDEPENDENT = ("policy/grad_norm", "value/grad_norm", "policy/grad_snr")
"""Update statistics that are already global on every rank (the norm of the all-reduced gradient);
the others are each rank's share, summed over ranks."""


def ppo_update(roles: Roles, rollout: Rollout, algo: PPOAlgoConfig, opt: Optim, temperature: float,
               guard: NonFiniteGuard, iteration: int, concurrent: bool = False, *, old_logprobs: str = "engine",
               measure: bool = False, train_policy: bool = True, ess: bool = False) -> dict:
    """Step 6: ``ppo_epochs`` passes over shuffled minibatches; returns mean statistics.

    The minibatch order of every epoch is drawn up front (the same on every rank: the same seed
    and draws), so the policy and the critic see the same minibatches. They share nothing else, so
    with ``concurrent`` the critic's epochs run in a second thread while the policy's run in this
    one (two cores busy with one torch thread each); the results are identical to the sequential
    order. Under torchrun each rank trains on its share of every minibatch (:func:`minibatches`).

    First (6a, :func:`prepare_old_logprobs`): pi_old recomputed (``old_logprobs`` 'recompute'),
    the mismatch measured (``measure``; ``ess``: with ``rollout/is_ess``), the correction's weights
    (in the critic's warm-up too).
    ``train_policy`` False (the warm-up): the critic's epochs only; the policy, its optimiser and
    schedule untouched.
    ``policy/first_ratio_abs_dev``: mean |r - 1| over the first minibatch's tokens, before any step;
    ``policy/grad_snr`` (``log_grad_snr``): :class:`~fourfold.trainers.batches.GradSNR`.
    """
    perms = [torch.randperm(rollout.batch_size) for _ in range(algo.ppo_epochs)]
    rollout, pre = prepare_old_logprobs(roles.policy, rollout, algo, perms[0], temperature, old_logprobs, measure, ess)
    mbs = minibatches(rollout, algo, perms, iteration)

    def mean_over(step_fn) -> dict:
        sums: dict[str, float] = {}
        for j, mb in enumerate(mbs):
            for k, v in step_fn(mb).items():
                if k == "policy/ratio_abs_dev":
                    if j == 0:
                        sums["policy/first_ratio_abs_dev"] = v * len(mbs)
                    continue
                sums[k] = sums.get(k, 0.0) + v
        return {k: v / len(mbs) for k, v in sums.items()}

    def policy_epochs() -> dict:
        if not train_policy:
            return {}
        snr = GradSNR(len(mbs) // algo.ppo_epochs) if algo.log_grad_snr else None
        stats = mean_over(lambda mb: policy_step(roles.policy, mb, algo, opt, temperature, guard, snr))
        return stats if snr is None else {**stats, **snr.metrics()}

    def critic_epochs() -> dict:
        return mean_over(lambda mb: critic_step(roles.critic, mb, algo, opt, guard))

    if roles.critic is None:
        stats = policy_epochs()
    elif concurrent:
        with ThreadPoolExecutor(max_workers=1) as pool:
            critic_future = pool.submit(critic_epochs)
            stats = policy_epochs()
            stats.update(critic_future.result())
    else:
        stats = {**policy_epochs(), **critic_epochs()}
    return {**sum_over_ranks(stats, [k for k in stats if k not in RANK_INDEPENDENT]), **pre}


def checked_roles(roles: Optional[Roles], algo: PPOAlgoConfig) -> Optional[Roles]:
    """``roles`` passed to :func:`train`, refused when they have a critic that the critic-free
    estimator of ``ppo.advantage`` would not train."""
    if roles is not None and roles.critic is not None and not get_advantage_estimator(algo.estimator).needs_critic:
        raise ConfigError(f"ppo.advantage: {algo.advantage} uses no critic, but the roles passed in have one")
    return roles


def finite_advantages(rollout: Rollout, algo: PPOAlgoConfig, guard: NonFiniteGuard, it: int,
                      scores_name: str = "reward_score", bootstrap: Optional[torch.Tensor] = None) -> Optional[Rollout]:
    """Step 5 of iteration ``it``: the rollout with its advantages and returns
    (:func:`compute_advantages`, with the batch's ``bootstrap``), or None when its scores or its
    advantages are not finite (the guard records which, the scores as ``scores_name``: the
    iteration is then skipped)."""
    if not guard.ok(scores_name, rollout.scores, f"iteration {it}"):
        return None
    rollout = compute_advantages(rollout, algo, bootstrap)
    return rollout if guard.ok("advantages", rollout.advantages, f"iteration {it}") else None


def monte_carlo_returns(rollout: Rollout, algo: PPOAlgoConfig, bootstrap: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The rollout's Monte Carlo returns ``[B, T]``: GAE(gamma, lambda = 1) + V over the policy's tokens,
    i.e. the discounted reward-to-go (plus ``gamma * bootstrap`` at a cut row's end), which does not
    depend on the critic's values (the targets at ``lam`` < 1 do: they bootstrap from V)."""
    rewards = masked_whiten(rollout.rewards, rollout.mask, shift_mean=False) if algo.whiten_rewards else rollout.rewards
    _, returns = policy_advantages(get_advantage_estimator("gae"), AdvantageInputs(
        rewards, rollout.mask, rollout.values, algo.samples_per_prompt, algo.gamma, 1.0), bootstrap=bootstrap)
    return returns


def value_metrics(rollout: Rollout, mc_returns: Optional[torch.Tensor] = None) -> dict:
    """The critic's statistics on a rollout, before its update: ``value/explained_variance`` (of the
    returns), ``value/mean``, ``value/error`` (mean (V - R)^2 over valid tokens), and the returns'
    ``value/returns_mean`` and ``value/returns_std`` (their spread, which explained variance divides);
    with ``mc_returns`` (:func:`monte_carlo_returns`) also ``value/explained_variance_mc``: the
    explained variance of the Monte Carlo returns, a target the values do not enter."""
    v, R, m = rollout.values, rollout.returns, rollout.mask
    out = {"value/explained_variance": float(explained_variance(v, R, m)),
           "value/mean": float(masked_mean(v, m)),
           "value/error": float(masked_mean((v - R) ** 2, m)),
           "value/returns_mean": float(masked_mean(R, m)),
           "value/returns_std": float(masked_var(R, m).clamp(min=0).sqrt()) if float(m.sum()) > 1 else 0.0}
    if mc_returns is not None:
        out["value/explained_variance_mc"] = float(explained_variance(v, mc_returns, m))
    return out


def train(cfg: PPOConfig, *, prompts: Optional[Sequence[str]] = None, probe: Optional[Probe] = None,
          roles: Optional[Roles] = None) -> dict:
    """Run PPO; returns a summary dict (final metrics, output paths).

    ``prompts``: the prompts to train on (else the ``data.prompts`` file); ``probe(prompts,
    responses) -> {name: value}``: extra measurements logged every iteration; ``roles``: models
    already loaded (else loaded from ``cfg.model``)."""
    algo, concurrent, stale = cfg.ppo, cfg.run.concurrent_roles, cfg.rollout.max_staleness > 0
    # 0. set-up: the reward functions against the prompts' columns (before anything is created), seed,
    #    run directory, roles (placed on the ranks), optimisers, KL controller, engine, prompt stream, resume
    rewards = prepare_rewards("ppo", cfg, prompts, roles)
    run = RunScaffold(cfg)
    device, guard = run.hf_device(), run.guard
    warm = None if algo.critic_from is None else (lambda r: warm_start_critic(r.critic, algo.critic_from))
    roles = stage_roles(run, "ppo", cfg, device, {"ppo.rollout_batch_size": algo.rollout_batch_size,
                                                  "ppo.minibatch_size": algo.minibatch_size},
                        roles=checked_roles(roles, algo), concurrent=concurrent, reward_functions=rewards.functions,
                        before_placing=warm)
    old_logprobs = said_old_logprobs(run, algo, cfg.model.precision, cfg.generation, cfg.rollout.max_staleness)
    opt = make_optim(roles, algo, compiled=cfg.model.compile)
    kl_ctl = (AdaptiveKLController(algo.kl_coef, algo.kl_target, algo.kl_horizon) if algo.adaptive_kl
              else FixedKLController(algo.kl_coef))
    rl = RLSteps(run, cfg, roles, device, section="ppo", n_prompts=algo.rollout_batch_size // algo.samples_per_prompt,
                 trained=opt.trained(roles), prompts=prompts, state={"kl_ctl": kl_ctl}, probe=probe,
                 notes=rewards.notes + practice_notes(algo)
                 + truncation_notes(cfg.generation, algo.rollout_correction, "ppo"))
    last: dict = {}
    with rl.loop("ppo") as logger:
        for it in rl.iterations():
            t_iter = time.perf_counter()
            # 1-4. sample prompts (each on samples_per_prompt consecutive rows), generate (pi_old) with
            # the engine given the policy's weights after the last update, score (reference, critic,
            # reward), per-token rewards
            col, shaped = collect_groups(rl, it, algo, kl_ctl, concurrent)
            # 4b. overlong shaping, the groups' zero spread
            rollout, more = shape_scores(col.rollout, algo, col.length_limit)
            shaped = {**more, **shaped}  # frac_zero_std: of the first rollout under filter_groups
            # 5. advantages and returns; when the scores or the advantages are not finite the iteration
            # is skipped: nothing touched the weights, so a stuck run keeps iteration it - 1's
            rollout = finite_advantages(rollout, algo, guard, it, score_quantity(col), col.bootstrap)
            if rollout is None:
                run.log_skips(it)
                run.stop_if_stuck(it - 1)
                continue
            if algo.mask_truncated:  # 5b. the truncated responses leave the losses
                rollout, masked = mask_truncated(rollout, col.samples.finished)
                shaped.update(masked)
            # 6. the PPO epochs (6a: pi_old recomputed and the mismatch measured; in the critic's warm-up
            # the critic's epochs only)
            t0, skips_before, lrs = time.perf_counter(), guard.total, opt.lrs()  # the rates this update starts with
            stats = ppo_update(roles, rollout, algo, opt, cfg.generation.temperature, guard, it, concurrent=concurrent,
                               old_logprobs=old_logprobs, measure=algo.measure_mismatch or stale,
                               train_policy=it > algo.critic_warmup, ess=stale)
            t_train = time.perf_counter() - t0
            if guard.total == skips_before:  # one good update: the whole iteration went through
                guard.good_step()
            run.log_skips(it)
            run.stop_if_stuck(it)
            # 7. KL controller, metrics, checkpoint
            kl_used = kl_ctl.value  # the coefficient this iteration's rewards used
            kl_ctl.update(col.metrics["kl/k1"], algo.rollout_batch_size)
            train_tokens = algo.ppo_epochs * col.metrics["rollout/tokens"]
            metrics = {
                "iteration": it, "samples": it * algo.rollout_batch_size, **col.metrics, **shaped, **stats, **lrs,
                "kl/coef": kl_used,
                "train/nonfinite_skips": guard.total,
                "time/train_s": t_train,
                "time/train_tokens_per_s": train_tokens / max(t_train, 1e-9),
                "time/iteration_s": time.perf_counter() - t_iter,
            }
            if roles.critic is not None:
                metrics.update(value_metrics(rollout, monte_carlo_returns(rollout, algo, col.bootstrap)))
            rl.log(logger, it, metrics, col)
            last = metrics
            run.checkpoint_if_due(it)
        rl.export(critic=roles.critic)
    return rl.finish(last)
