"""Advantage estimation: GAE, discounted returns, REINFORCE baselines, the critic-free group
estimators (GRPO, RLOO) and REINFORCE++; critic diagnostics."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from fourfold.core.masks import as_bool_mask, masked_mean, masked_whiten


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    *,
    dones: Optional[Tensor] = None,
    last_values: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016), vectorised over rows.

    Shapes: ``rewards``, ``values``, ``mask``, ``dones`` ``[B, T]`` (any ``[..., T]``; the
    recursion runs along the last dim), ``last_values [B]`` (``[...]``). Returns
    ``(advantages [B, T], returns [B, T])`` with returns = advantages + values, both 0 outside the
    mask.

    With continuation factor c_t (1 = step t+1 continues the trajectory of step t):

        delta_t = r_t + gamma * c_t * V_{t+1} - V_t
        A_t     = delta_t + gamma * lam * c_t * A_{t+1}
        c_t     = m_{t+1} * (1 - dones_t),   with m_T = 1, V_T = last_values (0 if None), A_T = 0

    Language models (``dones=None``): c_t = m_{t+1}, so V and A are 0 past the last valid token of
    each row, and at t = T (V_T = 0 unless ``last_values`` is given).

    Vectorised environments (``[num_envs, T]`` rows holding several episodes): ``dones[b, t] = 1``
    when the episode ended at step t (nothing after t bootstraps into t), and ``last_values[b]``
    = V(s_T), the value of the observation after the last column, bootstraps the unfinished
    episode at the row's end. A *truncated* episode (time limit, not a terminal state) is handled by
    the caller: add ``gamma * V(final_obs)`` to the reward of the truncated step and mark it done.
    A masked (invalid) step also stops bootstrapping into the step before it.

    Python loop over T, none over rows. Masked entries of any input never influence the result.
    """
    m = as_bool_mask(mask)
    dtype = torch.promote_types(rewards.dtype, values.dtype)
    if not dtype.is_floating_point:
        dtype = torch.float32
    zero = torch.zeros((), dtype=dtype, device=rewards.device)
    r = torch.where(m, rewards.to(dtype), zero)
    v = torch.where(m, values.to(dtype), zero)
    T = r.shape[-1]
    lead = r.shape[:-1]
    # cont[..., t] = m_{t+1} * (1 - dones_t), m_T = 1
    next_valid = torch.cat([m[..., 1:], torch.ones_like(m[..., :1])], dim=-1)
    cont = next_valid if dones is None else next_valid & ~as_bool_mask(dones)
    next_value = torch.zeros(lead, dtype=dtype, device=r.device) if last_values is None else (
        last_values.to(dtype).expand(lead))
    next_adv = torch.zeros(lead, dtype=dtype, device=r.device)
    advs = []
    for t in reversed(range(T)):
        c = cont[..., t]
        boot = torch.where(c, next_value, zero)
        carry = torch.where(c, next_adv, zero)
        delta = r[..., t] + gamma * boot - v[..., t]
        a = torch.where(m[..., t], delta + gamma * lam * carry, zero)
        advs.append(a)
        next_adv = a
        next_value = v[..., t]
    advantages = torch.stack(advs[::-1], dim=-1) if advs else torch.zeros_like(r)
    returns = torch.where(m, advantages + v, zero)
    return advantages, returns


def discounted_returns(
    rewards: Tensor, mask: Tensor, gamma: float = 1.0, *, dones: Optional[Tensor] = None
) -> Tensor:
    """Reverse discounted cumulative sum within the mask:

        G_t = r_t + gamma * c_t * G_{t+1},   c_t = m_{t+1} * (1 - dones_t),  G_T = 0

    i.e. :func:`gae` with V = 0 and lam = 1. Shapes ``[B, T]`` (any ``[..., T]``) -> ``[B, T]``,
    0 outside the mask. For a row valid on a prefix, G_t = sum_{k >= t, valid} gamma^(k-t) r_k.
    """
    return gae(rewards, torch.zeros_like(rewards, dtype=torch.promote_types(rewards.dtype, torch.float32)),
               mask, gamma=gamma, lam=1.0, dones=dones)[1]


def mean_baseline(scores: Tensor) -> Tensor:
    """REINFORCE baseline b = mean over the batch of ``scores`` (any shape, typically ``[B]``),
    returned as a 0-d tensor that broadcasts against ``scores``. It includes each sample's own
    score, which scales the expected policy gradient by (1 - 1/B) (for i.i.d. samples): harmless
    for reasonable B. Detached: a baseline carries no gradient."""
    s = scores.detach()
    return (s if s.is_floating_point() else s.float()).mean()


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> float:
    """Critic diagnostic 1 - Var[R - V] / Var[R] over the valid entries (population variances).

    1 = perfect predictions, 0 = no better than a constant, < 0 = worse. Shapes ``[B, T]`` (any).
    Returns a Python float, never NaN: 0.0 when there is no valid entry or Var[R] is 0 (returns
    constant to float64 precision, where the ratio is undefined). Computed in float64.
    """
    m = as_bool_mask(mask)
    R = returns.detach().to(torch.float64)
    V = values.detach().to(torch.float64)
    zero = torch.zeros((), dtype=torch.float64, device=R.device)
    R = torch.where(m, R, zero)
    V = torch.where(m, V, zero)
    mean_r = masked_mean(R, m)
    var_r = masked_mean((R - mean_r) ** 2, m)
    diff = R - V
    var_d = masked_mean((diff - masked_mean(diff, m)) ** 2, m)
    scale = masked_mean(R * R, m)
    var_r, var_d, scale = float(var_r), float(var_d), float(scale)
    if not var_r > 1e-12 * scale or not math.isfinite(var_r) or not math.isfinite(var_d):
        return 0.0
    return 1.0 - var_d / var_r


def _groups(scores: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """``scores [B]`` as float ``[B // K, K]`` rows of one group each; ValueError unless
    ``mask`` is ``[B, T]``, K >= 1 and K divides B."""
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an integer >= 1, got {group_size!r}")
    if scores.dim() != 1 or mask.dim() != 2 or mask.shape[0] != scores.shape[0]:
        raise ValueError(f"expected scores [B] and mask [B, T], got {tuple(scores.shape)} and {tuple(mask.shape)}")
    B = scores.shape[0]
    if B % group_size:
        raise ValueError(
            f"{B} sequences cannot be split into groups of group_size={group_size}: B must be a multiple "
            "of the group size (the K samples of a prompt are K consecutive rows)")
    s = scores.detach()
    s = s if s.is_floating_point() else s.float()
    return s.reshape(B // group_size, group_size)


def _centered(groups: Tensor) -> Tensor:
    """``[n, K]`` -> x - (mean of its group), exactly 0 in a group whose values are all equal (the
    mean of equal floats can differ from them by round-off)."""
    centered = groups - groups.mean(dim=1, keepdim=True)
    constant = groups.amax(dim=1, keepdim=True) == groups.amin(dim=1, keepdim=True)
    return torch.where(constant, torch.zeros((), dtype=groups.dtype, device=groups.device), centered)


def _per_token(per_seq: Tensor, mask: Tensor) -> Tensor:
    """``[B]`` -> ``[B, T]``: each row's value on its valid tokens, 0 on padding."""
    zero = torch.zeros((), dtype=per_seq.dtype, device=per_seq.device)
    return torch.where(as_bool_mask(mask), per_seq.unsqueeze(-1), zero)


def grpo_advantages(
    scores: Tensor,
    mask: Tensor,
    group_size: int,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """Group-normalised outcome advantage (GRPO, Shao et al. 2024, DeepSeekMath), per group of
    the K = ``group_size`` samples of one prompt:

        A_i = (R_i - mean_g R) / (std_g R + eps)      (scale_by_std=True: GRPO)
        A_i =  R_i - mean_g R                         (scale_by_std=False: Dr. GRPO, Liu et al. 2025)

    std_g is the unbiased (Bessel) standard deviation of the group, as in TRL and verl; the eps
    default is verl's (TRL uses 1e-4). Dr. GRPO drops the division because it is a difficulty bias:
    prompts whose scores barely vary (too easy or too hard for the policy) get their small
    differences blown up to unit scale and weigh as much as the informative ones.

    Shapes: ``scores [B]`` (R_i, one per sequence; B = n_prompts * K, the K samples of a prompt on
    K consecutive rows), ``mask [B, T]``. Returns ``(advantages [B, T], returns [B, T])``: A_i and
    R_i on every valid token of row i, 0 on padding (no critic regresses on ``returns``; they are
    for logging). Constants (detached).

    Edge cases: a group whose scores are all equal (including K = 1, where the sample is its own
    mean) has A = 0 exactly, never NaN: such a group carries no learning signal. B not a multiple of
    K raises ValueError.

    KL: R_i is what the caller passes. GRPO puts the KL term in the loss (see ``kl_loss``), so R_i
    is the outcome score alone; the registered ``"grpo"`` estimator sums the token rewards, which
    are exactly the scores when the trainer keeps the KL out of the reward (``kl_in: loss``).
    """
    groups = _groups(scores, mask, group_size)
    adv = _centered(groups)
    if scale_by_std:
        std = ((adv * adv).sum(dim=1, keepdim=True) / max(group_size - 1, 1)).sqrt()
        adv = adv / (std + eps)
    return _per_token(adv.reshape(-1), mask), _per_token(groups.reshape(-1), mask)


def rloo_advantages(scores: Tensor, mask: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Leave-one-out baseline (RLOO; Kool et al. 2019, Ahmadian et al. 2024 "Back to Basics"): each
    of the K = ``group_size`` samples of a prompt is compared with the mean of the other K - 1,

        A_i = R_i - 1/(K-1) * sum_{j != i} R_j  =  K/(K-1) * (R_i - mean_g R)      (K >= 2)
        A_i = R_i                                                                  (K = 1)

    The baseline does not depend on sample i, so the gradient stays unbiased (unlike a mean that
    includes R_i, which shrinks it by (K-1)/K). For K = 1 there is no other sample: the baseline is
    0 and the estimator is plain REINFORCE without a baseline (still unbiased, just noisier).
    The advantages of a group sum to 0 (K >= 2); equal scores give A = 0 exactly.

    Shapes: ``scores [B]`` (R_i; B = n_prompts * K, the K samples of a prompt on K consecutive
    rows), ``mask [B, T]``. Returns ``(advantages [B, T], returns [B, T])``: A_i and R_i on every
    valid token of row i, 0 on padding. B not a multiple of K raises ValueError.

    KL: as in the RLOO paper and TRL's RLOO trainer, R_i is the sequence reward with the KL penalty
    in it, R_i = score_i - beta * sum_t KL_t: the sum of the token rewards of ``token_rewards``,
    which is what the registered ``"rloo"`` estimator passes.
    """
    groups = _groups(scores, mask, group_size)
    adv = groups if group_size == 1 else _centered(groups) * (group_size / (group_size - 1))
    return _per_token(adv.reshape(-1), mask), _per_token(groups.reshape(-1), mask)


def reinforce_pp_advantages(
    rewards: Tensor, mask: Tensor, gamma: float = 1.0, eps: float = 1e-8
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (Hu 2025): per-token discounted returns of the token rewards, whitened over the
    valid tokens of the whole batch (a batch baseline instead of a critic or a group):

        G_t = sum_{k >= t, valid} gamma^(k-t) r_k                          (discounted_returns)
        A_t = (G_t - mean(G)) / sqrt(var(G) + eps)     mean, unbiased var over every valid token

    ``rewards`` are the per-token rewards of ``token_rewards``: the KL penalty -beta * KL_t on every
    token (REINFORCE++ folds the KL into the reward) and the score on the last valid one. (The
    same computation as whitened advantages from returns with no critic, PPO's no-critic
    ablation.) The statistics are those of the tensors passed in: a caller splitting one
    batch over several processes must gather G first.

    Shapes: ``rewards``, ``mask`` ``[B, T]``. Returns ``(advantages [B, T], returns [B, T])`` with
    returns = G; both 0 on padding. A single valid token (variance 0) gets A = 0.
    """
    returns = discounted_returns(rewards, mask, gamma)
    return masked_whiten(returns, mask, eps=eps), returns
