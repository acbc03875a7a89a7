"""PPO as practised now, the trainer's half, used by PPO and REINFORCE alike (docs/correction.md):
pi_old from the engine or recomputed by the training forward (:func:`prepare_old_logprobs`), the
engine-trainer mismatch measured and the rollout correction's weights (:func:`mismatch_and_weights`),
the scores shaped before the advantages (DAPO's overlong punishment, :func:`shape_scores`) and the
truncated responses left out of the losses after them (:func:`mask_truncated`), the critic's warm
start (:func:`warm_start_critic`). DAPO's group filter is :mod:`fourfold.trainers.groups`."""

from __future__ import annotations

from typing import Optional

import torch

from fourfold.checkpoint.format import latest_checkpoint
from fourfold.checkpoint.plain import load_checkpoint
from fourfold.config import PPOAlgoConfig
from fourfold.config.ppo import resolve_old_logprobs
from fourfold.config.sampling import filters_said, truncates
from fourfold.core import (
    Rollout,
    effective_sample_size,
    frac_zero_std,
    last_valid_index,
    mismatch_stats,
    overlong_penalty,
    rollout_correction_weights,
)
from fourfold.errors import ConfigError
from fourfold.models.roles import response_logprobs
from fourfold.run.parallel import global_sum, rank_slice, several_ranks
from fourfold.trainers.batches import micro_groups, trim

SEQUENCE_CLIP_GUIDE = 0.01
"""The largest clip epsilon taken as a sequence-level one under ``ppo.ratio_level: sequence``:
GSPO's ratio is exp(mean_t log r_t), which moves about as little as one token's mean, so a
token-level epsilon (PPO's 0.2) clips next to nothing; GSPO (Zheng et al. 2025) uses 3e-4 and 4e-4,
TRL's GSPO recipe 3e-4 / 4e-4."""


def practice_notes(algo: PPOAlgoConfig) -> list[str]:
    """Warning lines on settings that run but likely do not do what their user meant, said once at
    the run's start: ``ratio_level: sequence`` with a token-level clip (> :data:`SEQUENCE_CLIP_GUIDE`)."""
    notes = []
    eps = [e for e in (algo.clip_eps_low if algo.clip_eps_low is not None else algo.clip_eps,
                       algo.clip_eps_high if algo.clip_eps_high is not None else algo.clip_eps)]
    if algo.ratio_level == "sequence" and max(eps) > SEQUENCE_CLIP_GUIDE:
        notes.append(f"ppo.ratio_level: sequence (GSPO) with a clip of {max(eps):g}, a token-level size: the sequence "
                     f"ratio exp(mean_t log r_t) rarely leaves [1 - {max(eps):g}, 1 + {max(eps):g}], so almost nothing is "
                     "clipped (policy/clipfrac near 0); GSPO uses about 3e-4 / 4e-4: set ppo.clip_eps (or clip_eps_low "
                     "and clip_eps_high)")
    return notes


def truncation_notes(gen, correction: str, section: str) -> list[str]:
    """The warning line of a truncating ``generation`` filter (``gen``: top_k, top_p, min_p) that
    runs without a rollout correction (``correction``, the ``section``'s: ppo or reinforce): the
    update then trains the policy's full softmax on samples of the truncated distribution, as if it
    had sampled them. Said once at the run's start; [] otherwise."""
    if not truncates(gen) or correction != "none":
        return []
    return [f"{filters_said(gen)}: the rollout samples a truncated distribution and the update treats the "
            f"samples as the full policy's (the gap per token: rollout/log_kept_mass, and mismatch/*); set "
            f"{section}.rollout_correction (e.g. token_tis) to weight each token by pi_train / pi_sampled"]


def mismatch_and_weights(train_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor, correction: str,
                         cap: float, ess: bool = False) -> tuple[Optional[torch.Tensor], dict]:
    """The trainer half of the engine-trainer mismatch, for PPO and REINFORCE alike: the
    ``mismatch/*`` metrics of the training forward's log-probs ``train_lp [B, T]`` against the
    engine's ``engine_lp`` (:func:`fourfold.core.mismatch_stats`) and, with a ``correction`` mode
    other than 'none', its per-token weights ``[B, T]`` (cap ``cap``,
    :func:`fourfold.core.rollout_correction_weights`) and their ``mismatch/is_*`` statistics;
    ``(None, metrics)`` without one. ``ess`` (a sampler running ahead): ``rollout/is_ess`` too, the
    effective sample size of the token weights pi_train / pi_engine before any cap
    (:func:`fourfold.core.effective_sample_size`)."""
    metrics = {f"mismatch/{k}": float(v) for k, v in mismatch_stats(train_lp, engine_lp, mask).items()}
    if ess:
        metrics["rollout/is_ess"] = float(effective_sample_size(train_lp - engine_lp, mask))
    if correction == "none":
        return None, metrics
    weights, stats = rollout_correction_weights(train_lp, engine_lp, mask, correction, cap)
    metrics.update({f"mismatch/is_{k}": float(v) for k, v in stats.items()})
    return weights, metrics


def trainer_logprobs(policy, rollout: Rollout, algo: PPOAlgoConfig, perm: torch.Tensor, temperature: float
                     ) -> torch.Tensor:
    """Step 6a: the training forward's log-probs ``[B, T]`` of the rollout's tokens (no grad), over
    the very micro-batches of the first epoch (order ``perm``: this rank's share of each
    minibatch, :func:`micro_groups`, each trimmed, as :func:`policy_step` runs them), so that as
    pi_old they make the first minibatch's ratio exactly 1. Under torchrun each rank computes its
    rows and the sum over ranks gives every rank the whole batch."""
    out = torch.zeros_like(rollout.logprobs)
    with torch.no_grad():
        for i in range(0, len(perm), algo.minibatch_size):
            idx = perm[i : i + algo.minibatch_size]
            mine = idx[rank_slice(len(idx))]
            rows = rollout.select(mine)
            for group in micro_groups(rows, algo):
                part = trim(rows.select(group))
                ids, attn, T = part.context["input_ids"], part.context["attention_mask"], part.mask.shape[1]
                logprobs, _ = response_logprobs(policy, ids, attn, T, temperature)
                out[mine[group], :T] = logprobs.to(out.dtype)
    out = out * rollout.mask.to(out.dtype)
    return global_sum(out) if several_ranks() else out


def prepare_old_logprobs(policy, rollout: Rollout, algo: PPOAlgoConfig, perm: torch.Tensor, temperature: float,
                         old_logprobs: str, measure: bool, ess: bool = False) -> tuple[Rollout, dict]:
    """Step 6a: with ``old_logprobs`` 'recompute', ``measure`` or a ``rollout_correction``, the
    training forward's log-probs of the rollout (:func:`trainer_logprobs`) against the engine's:
    the ``mismatch/*`` metrics, the correction's weights (``rollout.is_weights``) and, under
    'recompute', pi_old replaced by them (the proximal policy of stale samples); ``ess``: their
    ``rollout/is_ess`` (:func:`mismatch_and_weights`). Returns the rollout (a copy when changed) and metrics."""
    correct = algo.rollout_correction != "none"
    if old_logprobs != "recompute" and not measure and not correct:
        return rollout, {}
    engine_lp = rollout.logprobs
    train_lp = trainer_logprobs(policy, rollout, algo, perm, temperature)
    weights, metrics = mismatch_and_weights(train_lp, engine_lp, rollout.mask, algo.rollout_correction,
                                            algo.correction_cap, ess)
    rollout = rollout.map(lambda x: x)
    if correct:
        rollout.is_weights = weights
    if old_logprobs == "recompute":
        rollout.logprobs = train_lp
    return rollout, metrics


def shape_scores(rollout: Rollout, algo: PPOAlgoConfig, max_new_tokens: int) -> tuple[Rollout, dict]:
    """Step 4b: DAPO's soft overlong punishment (``overlong_buffer``: the penalty added to each
    response's score and to its last valid token's reward) and the share of groups whose scores
    have zero spread (``reward/frac_zero_std``, group estimators: ``samples_per_prompt`` > 1).
    A copy of the rollout when changed."""
    metrics = {}
    if algo.overlong_buffer is not None:
        penalty = overlong_penalty(rollout.mask.sum(1), max_new_tokens, algo.overlong_buffer, algo.overlong_penalty)
        penalty = penalty.to(rollout.rewards.dtype)
        rollout = rollout.map(lambda x: x)
        rows = torch.arange(rollout.batch_size)
        last = last_valid_index(rollout.mask)
        rewards = rollout.rewards.clone()
        rewards[rows, last] += torch.where(rollout.mask.sum(1) > 0, penalty, torch.zeros_like(penalty))
        rollout.rewards, rollout.scores = rewards, rollout.scores + penalty.to(rollout.scores.dtype)
        metrics["reward/overlong_penalty_mean"] = float(penalty.mean())
    if algo.samples_per_prompt > 1:
        metrics["reward/frac_zero_std"] = frac_zero_std(rollout.scores, algo.samples_per_prompt)
    return rollout, metrics


def mask_truncated(rollout: Rollout, finished: torch.Tensor) -> tuple[Rollout, dict]:
    """Step 5b (``mask_truncated``): the rows without EOS (``finished`` False) leave the losses
    (their mask 0 after the advantages, which saw the whole batch)."""
    keep = finished.to(rollout.mask.dtype)[:, None]
    out = rollout.map(lambda x: x)
    out.mask = rollout.mask * keep
    return out, {"rollout/masked_truncated_share": float(1.0 - keep.mean())}


def warm_start_critic(critic, path: str) -> None:
    """``ppo.critic_from``: the critic's weights (modules/critic) of a plain checkpoint directory,
    or of the newest checkpoint of a run directory; no optimiser, no schedule, no RNG state."""
    from pathlib import Path

    ckpt = Path(path)
    if (ckpt / "checkpoints").is_dir():
        found = latest_checkpoint(ckpt)
        if found is None:
            raise ConfigError(f"ppo.critic_from: {path} holds no complete checkpoint")
        ckpt = found
    if not ckpt.is_dir():
        raise ConfigError(f"ppo.critic_from: {path} is not a directory (a checkpoints/step-N one, or a run's)")
    load_checkpoint(ckpt, modules={"critic": critic}, restore_rng=False)


def said_old_logprobs(run, algo: PPOAlgoConfig, precision: str, gen=None, staleness: int = 0) -> str:
    """The run's pi_old (:func:`~fourfold.config.ppo.resolve_old_logprobs`, ``staleness``: the
    run's ``rollout.max_staleness``), said in its first lines (rank 0) when it is the trainer's
    recompute or the sampler runs ahead. In a synchronous run ``auto`` is also recompute under a
    truncating filter of the generation section ``gen`` (top_k, top_p, min_p): the engine's
    log-probs are then the truncated distribution's, which differ from the trainer's full softmax by
    the log of the kept mass, far beyond float rounding."""
    old_logprobs, why = resolve_old_logprobs(algo, precision, staleness)
    if (algo.old_logprobs == "auto" and old_logprobs == "engine" and not staleness and gen is not None
            and truncates(gen)):
        old_logprobs, why = "recompute", (f"ppo.old_logprobs: auto = recompute ({filters_said(gen)}: the engine's "
                                          "log-probs are the truncated distribution's, the trainer's the full softmax)")
    if (old_logprobs == "recompute" or staleness) and run.is_main:
        print(f"fourfold ppo: {why}", flush=True)
    return old_logprobs


def staleness_notes(cfg, section: str) -> list[str]:
    """The warning line of a sampler running ahead (``rollout.max_staleness`` >= 1) whose samples
    nothing corrects for their staleness: PPO with ``old_logprobs: recompute`` and no
    ``rollout_correction`` (the ratio pi / pi_proximal then ignores the updates between the
    sampler's policy and the trainer's, miles PR #1829's bug, kept runnable as a baseline), and
    REINFORCE without a ``rollout_correction`` (its gradient treats the sampler's tokens as the
    trainer's policy's). Said once at the run's start; [] otherwise."""
    k, algo = cfg.rollout.max_staleness, getattr(cfg, section)
    if k == 0 or algo.rollout_correction != "none":
        return []
    if section == "ppo" and algo.old_logprobs != "recompute":
        return []
    what = ("ppo.old_logprobs: recompute clips around the trainer's policy and nothing weights" if section == "ppo"
            else "the REINFORCE gradient is the trainer's policy's, and nothing weights")
    return [f"rollout.max_staleness {k} without {section}.rollout_correction: {what} the samples for the up to {k} "
            f"updates since the sampler's weights (the staleness is ignored; rollout/is_ess shows how far off); set "
            f"{section}.rollout_correction (e.g. token_tis: the decoupled objective)"]
