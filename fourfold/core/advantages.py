"""Advantage estimation (GAE), discounted returns, REINFORCE baselines, critic diagnostics."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from fourfold.core.masks import as_bool_mask, masked_mean


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
