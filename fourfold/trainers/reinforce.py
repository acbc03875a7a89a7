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

from fourfold.config import ReinforceConfig
from fourfold.core import FixedKLController, discounted_returns, masked_mean, reinforce_loss
from fourfold.models.roles import response_logprobs
from fourfold.trainers.common import (
    NonFiniteGuard,
    clip_and_step,
    install_stop_handler,
    log_skips,
    make_optimizer,
    make_schedule,
    restore_signal_handlers,
    save_hf,
    seed_everything,
    setup_run,
)
from fourfold.trainers.lm import Probe, PromptStream, Roles, collect, load_roles


def train(cfg: ReinforceConfig, *, prompts: Optional[Sequence[str]] = None, probe: Optional[Probe] = None,
          roles: Optional[Roles] = None) -> dict:
    """Run REINFORCE; returns a summary dict (final metrics, output paths). ``prompts``, ``probe``
    and ``roles`` as for :func:`fourfold.trainers.ppo.train`."""
    from fourfold.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
    from fourfold.reporting import MetricsLogger

    algo, gen, run = cfg.reinforce, cfg.generation, cfg.run
    # 0. set-up
    seed_everything(run.seed)
    out, device = setup_run(cfg, run)
    roles = roles or load_roles(cfg.model, device, with_critic=False)
    optimizer = make_optimizer(roles.policy.parameters(), algo.lr)
    schedule = make_schedule(optimizer, algo.iterations, algo.lr_schedule)
    stream = PromptStream(cfg.data, roles.tokenizer, algo.rollout_batch_size, run.seed, prompts=prompts)
    kl_ctl = FixedKLController(algo.kl_coef)
    guard = NonFiniteGuard(limit=run.max_consecutive_skips)
    start = 0
    ckpt = latest_checkpoint(out) if run.resume else None
    if ckpt is not None:
        state = load_checkpoint(ckpt, modules={"policy": roles.policy}, optimizers={"policy": optimizer},
                                schedulers={"policy": schedule})
        start = state["iteration"]
        stream.load_state_dict(state["prompts"])
        guard.total = state.get("nonfinite_total", 0)
    last: dict = {}
    flag, previous = install_stop_handler()
    try:
        with MetricsLogger(out, progress=run.progress, tensorboard=run.tensorboard, total=algo.iterations,
                           desc="reinforce", key_metrics=("reward/score_mean", "kl/k1"),
                           resume_step=start if ckpt is not None else None) as logger:
            for it in range(start + 1, algo.iterations + 1):
                t_iter = time.perf_counter()
                # 1. sample prompts
                texts, prompt_ids, prompt_mask = stream.next(device)
                # 2-4. generate, score, per-token rewards (KL penalty on every token, score on the last)
                col = collect(roles, texts, prompt_ids, prompt_mask, gen, kl_coef=kl_ctl.value,
                              kl_estimator=algo.kl_estimator, probe=probe)
                r = col.rollout
                # 5. returns-to-go and the optional baseline
                returns = discounted_returns(r.rewards, r.mask, 1.0)
                baseline = None
                if algo.baseline == "mean":
                    baseline = masked_mean(returns, r.mask)
                # 6. one gradient step of the policy-gradient loss
                t0 = time.perf_counter()
                ids, attn = r.context["input_ids"], r.context["attention_mask"]
                logprobs, _ = response_logprobs(roles.policy, ids, attn, r.mask.shape[1], gen.temperature)
                loss, stats = reinforce_loss(logprobs, returns, r.mask, baseline)
                lr = schedule.get_last_lr()[0]  # the rate this step uses
                where = f"iteration {it}"
                norm = float("nan")
                if guard.ok("reward_score", r.scores, where) and guard.ok("policy_loss", loss.detach(), where):
                    loss.backward()
                    skips = guard.total
                    norm = clip_and_step(roles.policy, optimizer, schedule, algo.max_grad_norm, guard, where)
                    if guard.total == skips:
                        guard.good_step()
                else:
                    optimizer.zero_grad(set_to_none=True)
                    schedule.step()
                log_skips(logger, guard, it)
                t_train = time.perf_counter() - t0
                # 7. log, checkpoint
                metrics = {
                    "iteration": it, "samples": it * algo.rollout_batch_size, **col.metrics,
                    "policy/loss": float(loss.detach()), "policy/grad_norm": norm,
                    "policy/lr": lr, "kl/coef": kl_ctl.value,
                    "train/nonfinite_skips": guard.total, "time/train_s": t_train,
                    "time/iteration_s": time.perf_counter() - t_iter,
                }
                logger.log(it, metrics)
                last = metrics
                stuck = guard.consecutive >= guard.limit  # skipped steps never touched the weights
                if (run.save_every and it % run.save_every == 0) or stuck or flag["stop"]:
                    save_checkpoint(out, it, modules={"policy": roles.policy}, optimizers={"policy": optimizer},
                                    schedulers={"policy": schedule},
                                    state={"iteration": it, "prompts": stream.state_dict(), "nonfinite_total": guard.total},
                                    keep=run.keep_checkpoints)
                guard.check_limit()
                if flag["stop"]:  # SIGTERM/SIGINT: checkpointed above, exit
                    raise KeyboardInterrupt
    finally:
        restore_signal_handlers(previous)
    save_hf(roles.policy, roles.tokenizer, out / "policy")
    return {"output_dir": str(out), "policy": str(out / "policy"), "final": last}
