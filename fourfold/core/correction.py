"""The rollout-training mismatch: how far the engine's log-probs (pi_engine, what sampled) are from
the training forward's on the same tokens (pi_train), and the importance weights that correct the
policy gradient for it (``ppo.rollout_correction``); DAPO's overlong shaping and the groups whose
rewards have no spread. docs/correction.md has the definitions and the peers' names.

With d_t = log pi_train(a_t) - log pi_engine(a_t) on the n_i valid tokens of response i:

    token ratio      rho_t   = exp(d_t)
    sequence ratio   rho_i   = exp(sum_t d_t)        the probability ratio of the whole response
    geometric ratio  g_i     = exp(mean_t d_t)       rho_i ** (1 / n_i): the per-token average

The sequence ratio is the unbiased importance weight of a response (TRL's sequence modes,
trl#5814: a sum of the log-ratios, not a mean); the geometric ratio does not grow with the length
and is what a per-token threshold compares (verl's geometric rejection; GSPO's sequence ratio of
the policy update, :func:`fourfold.core.losses.ppo_policy_loss`, is this mean too). Both sides are
log-probs under the sampling temperature: leaving it out of one side alone makes the ratio of
identical models exp((1/T - 1) * logit terms), far from 1 (trl#4159).
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch import Tensor

from fourfold.core.masks import as_bool_mask, masked_mean, masked_sum
from fourfold.names import CORRECTION_MODES, check_names  # ppo.rollout_correction's values, written once there


def _seq_log_ratios(d: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(sum_t d_t [B], mean_t d_t [B], rows with a valid token [B] bool)."""
    total = masked_sum(d, m, dim=-1)
    n = m.sum(-1)
    return total, total / n.clamp(min=1).to(total.dtype), n > 0


def mismatch_stats(train_logprobs: Tensor, engine_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """The mismatch between the training forward's and the engine's log-probs of the same tokens
    (0-d float64 tensors, detached), d_t = train - engine over the valid tokens:

        token_abs_diff_mean / _max    mean and max over valid tokens of |d_t|
        seq_ratio_mean / _min / _max  of rho_i = exp(sum_t d_t) over rows with a valid token
        geo_ratio_mean / _min / _max  of g_i = exp(mean_t d_t) over those rows

    All 0 (ratios 1) when the two agree; no valid token gives |d| 0 and ratios 1. Shapes ``[B, T]``."""
    m = as_bool_mask(mask)
    d = torch.where(m, train_logprobs.detach().double() - engine_logprobs.detach().double(), 0.0)
    seq, geo, rows = _seq_log_ratios(d, m)
    out = {"token_abs_diff_mean": masked_mean(d.abs(), m),
           "token_abs_diff_max": d.abs().max() if d.numel() else d.new_zeros(())}
    for name, log_r in (("seq_ratio", seq), ("geo_ratio", geo)):
        r = torch.exp(log_r[rows]) if bool(rows.any()) else d.new_ones(1)
        out.update({f"{name}_mean": r.mean(), f"{name}_min": r.min(), f"{name}_max": r.max()})
    return out


WeightRule = Callable[[Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor, Tensor]]
"""``rule(d [B, T], seq [B], geo [B], cap) -> (w, truncated, masked)``, each ``[B, T]``: a mode's
weights and where its cap cut a weight or zeroed it, from the token log-ratios d (0 outside the
mask) and each response's summed and mean log-ratio (:func:`rollout_correction_weights` masks)."""


def _capped(rho: Tensor, cap: float, truncate: bool) -> tuple[Tensor, Tensor, Tensor]:
    """tis (``truncate``): min(rho, cap), truncated where rho > cap; mis: rho, or 0 where rho > cap."""
    over, none = rho > cap, torch.zeros_like(rho, dtype=torch.bool)
    if truncate:
        return torch.clamp(rho, max=cap), over, none
    return torch.where(over, torch.zeros_like(rho), rho), none, over


def _geo_mis(d: Tensor, seq: Tensor, geo: Tensor, cap: float) -> tuple[Tensor, Tensor, Tensor]:
    keep = (geo.abs() <= math.log(cap))[:, None].expand_as(d)
    return keep.to(d.dtype), torch.zeros_like(d, dtype=torch.bool), ~keep


CORRECTION_WEIGHTS: dict[str, WeightRule] = {
    "none": lambda d, seq, geo, cap: (torch.ones_like(d), *(torch.zeros_like(d, dtype=torch.bool),) * 2),
    "token_tis": lambda d, seq, geo, cap: _capped(torch.exp(d), cap, truncate=True),
    "token_mis": lambda d, seq, geo, cap: _capped(torch.exp(d), cap, truncate=False),
    "seq_tis": lambda d, seq, geo, cap: _capped(torch.exp(seq)[:, None].expand_as(d), cap, truncate=True),
    "seq_mis": lambda d, seq, geo, cap: _capped(torch.exp(seq)[:, None].expand_as(d), cap, truncate=False),
    "geo_mis": _geo_mis,
}
"""The weight rule of each ``ppo.rollout_correction`` mode (the names: fourfold.names.CORRECTION_MODES)."""
check_names("fourfold.core.correction.CORRECTION_WEIGHTS", CORRECTION_MODES, CORRECTION_WEIGHTS)


def rollout_correction_weights(
    train_logprobs: Tensor,
    engine_logprobs: Tensor,
    mask: Tensor,
    mode: str,
    cap: float = 2.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token importance weights ``w [B, T]`` (detached, 0 outside the mask) that correct a
    policy-gradient loss computed under pi_train for tokens sampled by pi_engine: each token's
    term of the loss is multiplied by w_t. With rho_t, rho_i, g_i as in the module docstring:

        none       w_t = 1
        token_tis  w_t = min(rho_t, cap)                  truncated IS per token (TRL token_truncate)
        token_mis  w_t = rho_t if rho_t <= cap else 0     masked IS per token (TRL token_mask)
        seq_tis    w_t = min(rho_i, cap)                  truncated IS per response (TRL sequence_truncate)
        seq_mis    w_t = rho_i if rho_i <= cap else 0     masked IS per response (TRL sequence_mask, its default)
        geo_mis    w_t = 1 if 1/cap <= g_i <= cap else 0  rejects a response whose per-token average
                                                          drifts either way (no reweighting)

    ``cap`` > 1 (TRL's default 3; a cap of 2 is verl's token TIS). ``mode`` must be one of
    :data:`CORRECTION_MODES` (ValueError otherwise). stats (0-d, detached): ``weight_mean`` mean
    w over valid tokens, ``masked_share`` share of valid tokens given weight 0 by a mask mode (0
    for the others), ``truncated_share`` share of valid tokens whose weight the cap cut (tis modes).
    """
    if mode not in CORRECTION_WEIGHTS:
        raise ValueError(f"unknown rollout correction {mode!r}; expected one of {', '.join(CORRECTION_MODES)}")
    if not cap > 1:
        raise ValueError(f"the rollout correction's cap must be > 1, got {cap}")
    m = as_bool_mask(mask)
    dtype = torch.promote_types(train_logprobs.dtype, torch.float32)
    d = torch.where(m, train_logprobs.detach().to(dtype) - engine_logprobs.detach().to(dtype), 0.0)
    seq, geo, _ = _seq_log_ratios(d, m)
    w, cut, dropped = CORRECTION_WEIGHTS[mode](d, seq, geo, cap)
    w = torch.where(m, w, torch.zeros_like(d))
    stats = {"weight_mean": masked_mean(w, m), "masked_share": masked_mean(dropped.to(dtype), m),
             "truncated_share": masked_mean(cut.to(dtype), m)}
    return w.detach(), {k: v.detach() for k, v in stats.items()}


def effective_sample_size(log_ratios: Tensor, mask: Tensor) -> Tensor:
    """The effective sample size of importance weights, as a fraction of their number: with
    w_t = exp(log_ratios_t) on the n valid tokens of ``mask`` (``[B, T]`` each),

        ess = (sum_t w_t)^2 / (n * sum_t w_t^2)

    in (0, 1]: 1 exactly when every weight is equal (on-policy samples, w = 1), 1/n when one
    weight dominates all others. The weights are shifted by their largest log-ratio before the
    exponent (the ratio does not change) so a large lag cannot overflow. 0-d float64, detached; 1
    without a valid token. The run-ahead sampler logs it as ``rollout/is_ess`` with log_ratios =
    log pi_train - log pi_behaviour (docs/correction.md, Stale samples)."""
    m = as_bool_mask(mask)
    d = log_ratios.detach().double()[m]
    if d.numel() == 0:
        return torch.ones((), dtype=torch.float64)
    w = torch.exp(d - d.max())
    return (w.sum() ** 2 / (d.numel() * (w * w).sum())).clamp(max=1.0)


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, factor: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), added to each response's score:
    with L = ``max_len`` (generation.max_new_tokens) and the buffer B = ``buffer``,

        0                               |y| <= L - B
        factor * ((L - B) - |y|) / B    L - B < |y| <= L     (from 0 down to -factor)
        -factor                         |y| > L

    ``lengths [B]`` (tokens per response, EOS included). ``buffer`` in [1, max_len] (ValueError
    otherwise). Returns float32 ``[B]``."""
    if not 1 <= buffer <= max_len:
        raise ValueError(f"the overlong buffer must be in [1, {max_len}], got {buffer}")
    n = lengths.to(torch.float32)
    start = float(max_len - buffer)
    return factor * torch.clamp((start - n) / buffer, min=-1.0, max=0.0)


def zero_std_groups(scores: Tensor, group_size: int) -> Tensor:
    """``[n]`` bool: the groups of ``group_size`` consecutive rows whose scores are all equal
    (exactly: a group estimator gives them advantage 0, nothing to learn from). ``scores [B]``,
    B a multiple of ``group_size`` (ValueError otherwise)."""
    if group_size < 1 or scores.shape[0] % group_size:
        raise ValueError(f"{scores.shape[0]} rows do not split into groups of {group_size}")
    g = scores.reshape(-1, group_size)
    return (g == g[:, :1]).all(dim=1)


def frac_zero_std(scores: Tensor, group_size: int) -> float:
    """Share of groups whose scores have zero spread (:func:`zero_std_groups`; TRL's
    ``frac_reward_zero_std``)."""
    return float(zero_std_groups(scores, group_size).float().mean())


def group_keep(scores: Tensor, group_size: int, need: Optional[int] = None) -> Tensor:
    """DAPO's dynamic sampling filter (Yu et al. 2025): ``[B]`` bool, the rows of the groups whose
    scores have some spread, at most ``need`` groups of them (the first ones; None: all)."""
    keep_groups = ~zero_std_groups(scores, group_size)
    if need is not None:
        keep_groups &= torch.cumsum(keep_groups.long(), 0) <= need
    return keep_groups.repeat_interleave(group_size)
