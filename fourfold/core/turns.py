"""Multi-turn trajectories: the three rules that keep an environment's tokens out of the policy's
credit (docs/environments.md).

A trajectory ``[B, T]`` interleaves the policy's sampled tokens with the environment's observation
tokens (and right padding). ``policy_mask [B, T]`` is 1 on a token the policy sampled, 0 on an
observation or padding; ``turn_ids [B, T]`` numbers the policy's turns (0, 1, ...) on its tokens
and is -1 elsewhere (:func:`turn_ids_from_mask` derives them when no two turns touch).

1. The loss, the KL penalty and the entropy count policy tokens only: pass ``policy_mask`` as the
   mask of the masked losses of :mod:`fourfold.core.losses` and of :func:`trajectory_rewards`.
2. GAE runs over the policy's tokens only (:func:`policy_gae`): the trajectory is read as the
   sequence of its policy tokens, so V at the next policy token bootstraps across an observation,
   and no reward, KL or value at an observation position is ever read. Any registered estimator
   runs this way (:func:`policy_advantages`). Inserting observation tokens between policy tokens
   leaves every advantage on a policy token unchanged (a property test checks it).
3. A turn's reward lands on that turn's last policy token (:func:`place_turn_rewards`).

Truncation: a trajectory cut by ``env.max_turns`` or ``env.max_tokens`` did not end. Under
``truncation: bootstrap`` its last policy token bootstraps with the critic's value of the state
after it, ``final_values`` (read at the trajectory's last position); under ``terminal`` with 0
(:func:`bootstrap_values`). A finished trajectory (the environment said done) always ends with 0.

Pure tensor math (torch + stdlib), shapes ``[B, T]`` per token and ``[B]`` per trajectory.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from fourfold.core.advantages import gae
from fourfold.core.estimators import AdvantageInputs, Estimator
from fourfold.core.kl import kl_estimate
from fourfold.core.masks import as_bool_mask
from fourfold.names import TRUNCATION_MODES  # env.truncation's values, written once there


def turn_ids_from_mask(policy_mask: Tensor) -> Tensor:
    """Turn numbers from a policy mask: each maximal run of consecutive policy tokens is one turn,
    numbered 0, 1, ... from the left; -1 on every other position. ``[B, T] -> [B, T]`` long.

    Two turns with no observation token between them read as one run: a trajectory builder that
    can produce those keeps its own ``turn_ids`` (:class:`fourfold.rollout.turns.Trajectory` does)."""
    m = as_bool_mask(policy_mask)
    prev = torch.cat([torch.zeros_like(m[..., :1]), m[..., :-1]], dim=-1)
    starts = m & ~prev
    ids = torch.cumsum(starts.long(), dim=-1) - 1
    return torch.where(m, ids, torch.full_like(ids, -1))


def turn_end_mask(turn_ids: Tensor) -> Tensor:
    """``[B, T]`` bool: True on the last policy token of each turn (a token whose turn id differs
    from the next position's, or the last column)."""
    nxt = torch.cat([turn_ids[..., 1:], torch.full_like(turn_ids[..., :1], -1)], dim=-1)
    return (turn_ids >= 0) & (nxt != turn_ids)


def place_turn_rewards(turn_rewards: Tensor, turn_ids: Tensor) -> Tensor:
    """Rule 3: ``turn_rewards[b, k]`` on the last policy token of turn k of row b, 0 everywhere else.

    Shapes: ``turn_rewards [B, N]`` (N >= the number of turns of the longest row; entries past a
    row's turns must be 0), ``turn_ids [B, T]``. Returns ``[B, T]`` float. A nonzero reward of a
    turn that has no token in ``turn_ids`` would be lost: ValueError naming the row and the turn,
    and so is a turn id >= N.
    """
    rewards = turn_rewards if turn_rewards.is_floating_point() else turn_rewards.float()
    B, N = rewards.shape
    ends = turn_end_mask(turn_ids)
    if bool((turn_ids >= N).any()):
        raise ValueError(f"turn_ids reach turn {int(turn_ids.max())} but turn_rewards has {N} turns per row")
    present = torch.zeros(B, N, dtype=torch.bool, device=rewards.device)
    rows, cols = ends.nonzero(as_tuple=True)
    present[rows, turn_ids[rows, cols]] = True
    lost = (rewards != 0) & ~present
    if bool(lost.any()):
        b, k = (int(x) for x in lost.nonzero()[0])
        raise ValueError(f"row {b}: turn {k} has reward {float(rewards[b, k])} but no policy token to carry it")
    safe = turn_ids.clamp(min=0)
    per_token = rewards.gather(-1, safe)
    return torch.where(ends, per_token, torch.zeros((), dtype=rewards.dtype, device=rewards.device))


def trajectory_rewards(
    turn_rewards: Tensor,
    turn_ids: Tensor,
    logprobs: Tensor,
    ref_logprobs: Tensor,
    kl_coef: Union[float, Tensor],
    kind: str = "k1",
) -> tuple[Tensor, Tensor]:
    """Per-token rewards of a multi-turn trajectory: the KL penalty on every policy token (rule 1)
    plus each turn's reward on its last policy token (rule 3):

        kl[b, t]      = p[b, t] * kl_estimate(logprobs, ref_logprobs, kind)[b, t],   p = turn_ids >= 0
        rewards[b, t] = -kl_coef * kl[b, t] + place_turn_rewards(turn_rewards, turn_ids)[b, t]

    With one turn per row this is :func:`fourfold.core.kl.token_rewards` (the score on the last
    valid token). Shapes: ``turn_rewards [B, N]``, the rest ``[B, T]``. Returns ``(rewards, kl)``,
    both 0 off the policy tokens whatever the log-probs hold there.
    """
    p = turn_ids >= 0
    est = kl_estimate(logprobs, ref_logprobs, kind)
    kl = torch.where(p, est, torch.zeros((), dtype=est.dtype, device=est.device))
    rewards = -kl_coef * kl + place_turn_rewards(turn_rewards, turn_ids).to(kl.dtype)
    return rewards, kl


def bootstrap_values(final_values: Optional[Tensor], truncated: Tensor, mode: str) -> Tensor:
    """The value each trajectory's last policy token bootstraps with: ``final_values[b]`` for a
    truncated row under ``mode = "bootstrap"``, 0 for a finished row and for every row under
    ``"terminal"``. ``final_values [B]`` (the critic's value of the state after the last token;
    None = no critic: all 0), ``truncated [B]`` bool. Returns ``[B]`` float. Unknown ``mode``:
    ValueError naming the modes."""
    if mode not in TRUNCATION_MODES:
        raise ValueError(f"unknown truncation mode {mode!r}; expected one of {', '.join(TRUNCATION_MODES)}")
    cut = as_bool_mask(truncated)
    if final_values is None or mode == "terminal":
        return torch.zeros(cut.shape, dtype=torch.float32, device=cut.device)
    v = final_values if final_values.is_floating_point() else final_values.float()
    return torch.where(cut, v, torch.zeros((), dtype=v.dtype, device=v.device))


def policy_order(policy_mask: Tensor) -> Tensor:
    """``[B, T]`` long: per row, the positions of its policy tokens in order, then the others (a
    stable sort). ``x.gather(-1, order)`` lines each row's policy tokens up on the left."""
    m = as_bool_mask(policy_mask)
    return torch.argsort((~m).to(torch.int8), dim=-1, stable=True)


def to_policy_steps(x: Tensor, policy_mask: Tensor) -> tuple[Tensor, Tensor]:
    """``x [B, T]`` as the sequence of its policy tokens: ``(steps [B, T], step_mask [B, T])``,
    row b's policy tokens on its first ``n_b`` columns in order (``step_mask`` 1 there), the other
    entries after them (masked)."""
    order = policy_order(policy_mask)
    return x.gather(-1, order), as_bool_mask(policy_mask).gather(-1, order)


def from_policy_steps(steps: Tensor, policy_mask: Tensor) -> Tensor:
    """The inverse of :func:`to_policy_steps`: ``steps [B, T]`` back to the trajectory's positions,
    exactly 0 off the policy tokens."""
    m = as_bool_mask(policy_mask)
    out = torch.zeros_like(steps).scatter(-1, policy_order(m), steps)
    return torch.where(m, out, torch.zeros((), dtype=out.dtype, device=out.device))


def _with_bootstrap(reward_steps: Tensor, step_mask: Tensor, bootstrap: Optional[Tensor], gamma: float) -> Tensor:
    """``reward_steps`` plus ``gamma * bootstrap[b]`` on row b's last policy step (none for a row
    with no policy token): a truncated step that bootstraps, then ends."""
    if bootstrap is None:
        return reward_steps
    n = step_mask.sum(-1)  # (B,)
    last = (n - 1).clamp(min=0)
    add = torch.where(n > 0, gamma * bootstrap.to(reward_steps.dtype), torch.zeros_like(bootstrap, dtype=reward_steps.dtype))
    return reward_steps.scatter_add(-1, last[:, None], add[:, None])


def policy_gae(
    rewards: Tensor,
    values: Tensor,
    policy_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 0.95,
    *,
    bootstrap: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """Rule 2: GAE over the policy's tokens only. With s the policy tokens of a row in order
    (s_1 < s_2 < ... < s_n positions), V_i = values[s_i], r_i = rewards[s_i]:

        delta_i = r_i + gamma * V_{i+1} - V_i,      V_{n+1} = bootstrap[b] (0 when None)
        A_i     = delta_i + gamma * lam * A_{i+1},  A_{n+1} = 0

    i.e. :func:`fourfold.core.advantages.gae` on the policy tokens lined up (observations and
    padding removed), written back to their positions. Nothing at a position where ``policy_mask``
    is 0 is read. ``bootstrap [B]``: :func:`bootstrap_values`. Shapes ``[B, T]``; returns
    ``(advantages, returns)`` with returns = advantages + values, both 0 off the policy tokens.
    """
    r, step_mask = to_policy_steps(rewards, policy_mask)
    v, _ = to_policy_steps(values, policy_mask)
    r = _with_bootstrap(r if r.is_floating_point() else r.float(), step_mask, bootstrap, gamma)
    adv, ret = gae(r, v, step_mask, gamma, lam)
    return from_policy_steps(adv, policy_mask), from_policy_steps(ret, policy_mask)


def policy_returns(rewards: Tensor, policy_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Returns-to-go over the policy's tokens: at each policy token the (``gamma``-discounted) sum of
    the rewards on it and on the later policy tokens of its row; observations and padding read
    nothing, 0 there. :func:`policy_gae` with V = 0 and lam = 1; on a left-aligned mask (a single
    turn) :func:`fourfold.core.advantages.discounted_returns`. Shapes ``[B, T]``."""
    return policy_gae(rewards, torch.zeros_like(rewards), policy_mask, gamma, 1.0)[1]


def policy_advantages(
    estimator: Estimator, inputs: AdvantageInputs, *, bootstrap: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """Any registered estimator over the policy's tokens only: ``inputs.mask`` is the policy mask;
    rewards, values and mask are lined up by :func:`to_policy_steps`, the estimator runs on them
    (with ``gamma * bootstrap`` added to each row's last policy reward, :func:`bootstrap_values`),
    and the results go back to their positions. For ``gae`` this is :func:`policy_gae`; the
    outcome estimators (grpo, rloo) and REINFORCE++ give what they give on the trajectory without
    its observations. Returns ``(advantages [B, T], returns [B, T])``, 0 off the policy tokens."""
    mask = inputs.mask
    r, step_mask = to_policy_steps(inputs.rewards, mask)
    r = _with_bootstrap(r if r.is_floating_point() else r.float(), step_mask, bootstrap, inputs.gamma)
    v = None if inputs.values is None else to_policy_steps(inputs.values, mask)[0]
    adv, ret = estimator(AdvantageInputs(r, step_mask.to(r.dtype), v, inputs.group_size, inputs.gamma, inputs.lam))
    return from_policy_steps(adv, mask), from_policy_steps(ret, mask)
