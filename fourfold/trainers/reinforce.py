"""Naive REINFORCE: the baseline PPO improves on.

Same rollout as PPO (same generation, same frozen reference and reward, the same per-token KL
penalty folded into the rewards), but: no critic, no clipping, no importance ratio, and exactly one
gradient step per batch. The loss is ``-mean_t(log pi(a_t|s_t) * (G_t - b))`` with ``G_t`` the
return-to-go of the token rewards and ``b`` = 0 or the batch-mean return.

1. sample prompts; 2-4. generate, score, per-token rewards (as PPO);
5. returns-to-go (gamma = 1), optional mean baseline;
6. one gradient step; 7. log, checkpoint.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from torch import Tensor

from fourfold import dist
from fourfold.config import ReinforceConfig
from fourfold.core import FixedKLController, Rollout, discounted_returns, masked_mean, reinforce_loss
from fourfold.dist import World
from fourfold.models.build import Roles, apply_levers, build_roles
from fourfold.models.levers import autocast_region
from fourfold.models.plan import plan_roles
from fourfold.models.roles import response_logprobs
from fourfold.rollout.engine import make_engine
from fourfold.rollout.noise import RowNoise
from fourfold.run.export import save_trained
from fourfold.run.optim import guarded_step, make_optimizer, make_schedule
from fourfold.run.parallel import check_world, loss_scale, place_roles
from fourfold.run.scaffold import RunScaffold
from fourfold.trainers.rollouts import KEY_METRICS, Probe, PromptStream, collect, sample_rows


def rank_loss(policy, r: Rollout, returns: Tensor, baseline: Optional[Tensor], temperature: float,
              world: World = dist.SINGLE) -> tuple[Tensor, Tensor]:
    """Step 6's loss on this rank's contiguous share of the batch ``r`` (the whole batch, the same
    on every rank): ``(to_backward, loss)``. ``loss`` is the batch's token-mean REINFORCE loss
    (summed over ranks, so the same on each); ``to_backward`` is this rank's part of it, scaled by
    :func:`~fourfold.run.parallel.loss_scale` for the ranks' averaged gradients."""
    rows = dist.shard(r.batch_size, world)
    mine = r.select(rows)
    ids, attn = mine.context["input_ids"], mine.context["attention_mask"]
    logprobs, _ = response_logprobs(policy, ids, attn, mine.mask.shape[1], temperature)
    local, _ = reinforce_loss(logprobs, returns[rows], mine.mask, baseline)
    share = float(mine.mask.sum()) / max(float(r.mask.sum()), 1.0)
    return local * loss_scale(share, world), dist.all_reduce_sum(local.detach() * share)


def _set_up(cfg: ReinforceConfig, run: RunScaffold, roles: Roles, prompts: Optional[Sequence[str]]):
    """Step 0 after the roles: the policy's optimiser and schedule and the prompt stream, named for
    the run's checkpoints and resumed from the latest one when asked. Returns (optimizer, schedule,
    stream, the iteration the loop continues after)."""
    algo = cfg.reinforce
    optimizer = make_optimizer(roles.policy.parameters(), algo.lr)
    schedule = make_schedule(optimizer, algo.iterations, algo.lr_schedule)
    stream = PromptStream(cfg.data, roles.tokenizer, algo.rollout_batch_size, cfg.run.seed, prompts=prompts,
                          batch_key="reinforce.rollout_batch_size")
    run.track(modules={"policy": roles.policy}, optimizers={"policy": optimizer}, schedulers={"policy": schedule},
              state=lambda it: {"iteration": it, "prompts": stream.state_dict(), "nonfinite_total": run.guard.total})
    state = run.resume()
    if state is None:
        return optimizer, schedule, stream, 0
    run.require_not_past(state["iteration"], algo.iterations, "reinforce.iterations", "iteration")
    stream.load_state_dict(state["prompts"])
    return optimizer, schedule, stream, state["iteration"]


def train(cfg: ReinforceConfig, *, prompts: Optional[Sequence[str]] = None, probe: Optional[Probe] = None,
          roles: Optional[Roles] = None) -> dict:
    """Run REINFORCE; returns a summary dict (final metrics, output paths). ``prompts``, ``probe``
    and ``roles`` as for :func:`fourfold.trainers.ppo.train`."""
    algo, gen = cfg.reinforce, cfg.generation
    # 0. set-up: seed, run directory, roles (placed on the ranks), optimiser, prompt stream, resume
    run = RunScaffold(cfg)
    device, world, guard = run.hf_device(), run.world, run.guard
    check_world(world, False, {"reinforce.rollout_batch_size": algo.rollout_batch_size})
    plan = plan_roles("reinforce", cfg)
    roles = apply_levers(roles, plan, device) if roles is not None else build_roles(plan, device)
    place_roles(roles, plan, device)  # torchrun: FSDP2 (before the optimizer sees the parameters)
    engine = make_engine(gen, precision=cfg.model.precision, max_prompt_len=cfg.data.max_prompt_len)
    optimizer, schedule, stream, start = _set_up(cfg, run, roles, prompts)
    kl_ctl, last = FixedKLController(algo.kl_coef), {}
    with run.loop(total=algo.iterations, desc="reinforce", key_metrics=KEY_METRICS) as logger:
        run.warn_skipped(logger, stream.skipped, stream.notes)
        for it in range(start + 1, algo.iterations + 1):
            t_iter = time.perf_counter()
            # 1. sample prompts
            texts, prompt_ids, prompt_mask = stream.next(device)
            # 2-4. generate (the engine given the policy's weights after the last step), score,
            # per-token rewards (KL penalty on every token, score on the last)
            engine.sync(roles.policy)
            with autocast_region(cfg.model.precision, device.type):  # weights fixed: keep the cast cache
                col = collect(roles, texts, prompt_ids, prompt_mask, gen, kl_coef=kl_ctl.value, kl_estimator=algo.kl_estimator,
                              probe=probe, noise=RowNoise(cfg.run.seed, it), world=world, engine=engine)
            r = col.rollout
            # 5. returns-to-go and the optional baseline
            returns = discounted_returns(r.rewards, r.mask, 1.0)
            baseline = None
            if algo.baseline == "mean":
                baseline = masked_mean(returns, r.mask)
            # 6. one gradient step of the policy-gradient loss (skipped when the score, the loss or
            # the gradient norm is not finite)
            t0 = time.perf_counter()
            local_loss, loss = rank_loss(roles.policy, r, returns, baseline, gen.temperature, world)
            lr = schedule.get_last_lr()[0]  # the rate this step uses
            norm, taken = guarded_step(roles.policy, optimizer, schedule, algo.max_grad_norm, guard, f"iteration {it}",
                                       [(local_loss, {"reward_score": r.scores, "policy_loss": loss})])
            if taken:
                guard.good_step()
            run.log_skips(it)
            t_train = time.perf_counter() - t0
            # 7. log, checkpoint
            metrics = {
                "iteration": it, "samples": it * algo.rollout_batch_size, **col.metrics,
                "policy/loss": float(loss.detach()), "policy/grad_norm": float("nan") if norm is None else norm,
                "policy/lr": lr, "kl/coef": kl_ctl.value,
                "train/nonfinite_skips": guard.total, "time/train_s": t_train,
                "time/iteration_s": time.perf_counter() - t_iter,
            }
            logger.log(it, metrics)
            if run.samples_due(it, algo.iterations):  # a few completions, decoded only now
                logger.samples(it, sample_rows(col, roles.tokenizer, probe))
            last = metrics
            run.stop_if_stuck(it)  # skipped steps never touched the weights
            run.checkpoint_if_due(it)
        run.require_an_update(algo.iterations - start)
        written = save_trained(run, roles.policy, roles.tokenizer, run.out / "policy")
    return run.finish({"output_dir": str(run.out), "policy": written["model"], "final": last,
                       **({"policy_adapter": written["adapter"]} if "adapter" in written else {})},
                      model=run.out / "policy")
