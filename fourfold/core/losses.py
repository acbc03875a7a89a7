"""Training losses: PPO clipped policy loss, (clipped) value loss, REINFORCE, Bradley-Terry
reward-model loss, SFT cross-entropy. Each returns ``(loss, stats)``: ``loss`` a 0-d tensor to
backpropagate, ``stats`` a dict of detached 0-d tensors for logging (no host sync)."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from fourfold.core.logprobs import logprobs_from_logits
from fourfold.core.masks import as_bool_mask, masked_mean

Stats = dict[str, Tensor]


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
) -> tuple[Tensor, Stats]:
    """PPO clipped surrogate (Schulman et al. 2017), token-level mean over all valid tokens:

        r_t  = exp(logprobs_t - old_logprobs_t)
        loss = -masked_mean( min(r_t * A_t, clip(r_t, 1 - eps, 1 + eps) * A_t) )

    Shapes: all ``[B, T]`` (or any shape, e.g. flattened ``[N]`` env steps). ``old_logprobs`` and
    ``advantages`` are constants (detached). Gradient is exactly 0 for a token clipped on the side
    its advantage pushes (A > 0 and r > 1 + eps, or A < 0 and r < 1 - eps).

    stats: ``clipfrac`` share of valid tokens where the clipped term is strictly smaller (clipped
    branch active); ``approx_kl`` masked mean of (r - 1) - log r, the k3 estimate of
    KL(pi_old || pi); ``ratio_mean``; ``ratio_max`` (0 when no token is valid).
    """
    m = as_bool_mask(mask)
    zero = _zero(logprobs)
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), zero)
    ratio = torch.exp(log_ratio)
    adv = torch.where(m, advantages.detach().to(ratio.dtype), zero)
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    loss = -masked_mean(torch.minimum(surr, surr_clipped), m)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((surr_clipped < surr).to(ratio.dtype), m),
            "approx_kl": masked_mean((ratio - 1.0) - log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": torch.where(m, ratio, zero).max() if ratio.numel() else zero,
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    clip_eps: Optional[float] = None,
) -> tuple[Tensor, Stats]:
    """Critic regression loss, token-level mean over valid tokens.

        clip_eps None: loss = 0.5 * masked_mean((V - R)^2)
        clip_eps:      loss = 0.5 * masked_mean(max((V - R)^2, (V_clip - R)^2)),
                       V_clip = V_old + clip(V - V_old, -eps, eps)

    Shapes: all ``[B, T]`` (or any shape). ``old_values`` and ``returns`` are constants (detached).
    stats: ``clipfrac`` share of valid tokens where the clipped term is strictly larger (0 without
    clipping); ``mse`` masked_mean((V - R)^2) of the unclipped values.
    """
    m = as_bool_mask(mask)
    zero = _zero(values)
    v = torch.where(m, values, zero)
    R = torch.where(m, returns.detach().to(v.dtype), zero)
    err2 = (v - R) ** 2
    if clip_eps is None:
        per_token = err2
        clipfrac = torch.zeros((), dtype=v.dtype, device=v.device)
    else:
        old = torch.where(m, old_values.detach().to(v.dtype), zero)
        v_clip = old + torch.clamp(v - old, -clip_eps, clip_eps)
        err2_clip = (v_clip - R) ** 2
        per_token = torch.maximum(err2, err2_clip)
        clipfrac = masked_mean((err2_clip > err2).to(v.dtype), m)
    loss = 0.5 * masked_mean(per_token, m)
    stats = {"clipfrac": clipfrac.detach(), "mse": masked_mean(err2, m).detach()}
    return loss, stats


def reinforce_loss(
    logprobs: Tensor,
    returns: Tensor,
    mask: Tensor,
    baseline: Optional[Union[float, Tensor]] = None,
) -> tuple[Tensor, Stats]:
    """REINFORCE (Williams 1992) with a baseline, token-level mean over valid tokens:

        loss = -masked_mean(logprobs * (returns - baseline))

    Shapes: ``logprobs``, ``mask`` ``[B, T]`` (or any shape, e.g. ``[N]``). ``returns`` and
    ``baseline`` each either match that shape, or have one dim less (``[B]``: a per-sequence value
    broadcast over T), or (baseline only) are a scalar; ``baseline=None`` means 0. The advantage
    ``returns - baseline`` is a constant (detached), so a learned baseline gets no gradient here.
    stats: ``advantage_mean`` masked mean of returns - baseline.
    """
    m = as_bool_mask(mask)

    def per_token(x: Union[float, Tensor]) -> Tensor:
        x = torch.as_tensor(x, dtype=logprobs.dtype, device=logprobs.device).detach()
        return x.unsqueeze(-1) if x.dim() == logprobs.dim() - 1 and x.dim() > 0 else x

    adv = per_token(returns) - (per_token(baseline) if baseline is not None else 0.0)
    adv = torch.where(m, adv, _zero(logprobs))
    lp = torch.where(m, logprobs, _zero(logprobs))
    loss = -masked_mean(lp * adv, m)
    return loss, {"advantage_mean": masked_mean(adv.expand_as(lp), m).detach()}


def bradley_terry_loss(
    chosen_scores: Tensor,
    rejected_scores: Tensor,
    margin: Optional[Union[float, Tensor]] = None,
) -> tuple[Tensor, Stats]:
    """Pairwise reward-model loss (Bradley-Terry; Ouyang et al. 2022, with optional margin as in
    Touvron et al. 2023):

        loss = -mean(logsigmoid(r_c - r_r - margin))      (margin None = 0)

    Shapes: ``chosen_scores``, ``rejected_scores`` ``[B]`` (any matching shape); ``margin`` scalar
    or ``[B]``. stats: ``accuracy`` share of pairs with r_c > r_r strictly; ``margin_mean`` mean of
    r_c - r_r.
    """
    diff = chosen_scores - rejected_scores
    logits = diff if margin is None else diff - margin
    loss = -F.logsigmoid(logits).mean()
    with torch.no_grad():
        stats = {"accuracy": (diff > 0).to(diff.dtype).mean(), "margin_mean": diff.mean()}
    return loss, {k: v.detach() for k, v in stats.items()}


def sft_loss(logits: Tensor, labels: Tensor, mask: Tensor) -> tuple[Tensor, Stats]:
    """Supervised fine-tuning cross-entropy, token-level mean over valid tokens:

        loss = masked_mean(-log softmax(logits[b, t])[labels[b, t]])

    ``logits[:, t]`` predicts ``labels[:, t]``: the caller aligns them (for a causal LM over
    ``input_ids``: ``logits[:, :-1]`` with ``labels = input_ids[:, 1:]`` and the matching mask).
    Shapes: ``logits [B, T, V]``, ``labels`` and ``mask`` ``[B, T]``. Labels where the mask is 0
    are ignored (any value, e.g. -100). Result float32; memory-lean (see logprobs_from_logits).
    stats: ``ppl`` = exp(loss); ``token_accuracy`` share of valid tokens where argmax == label.
    """
    m = as_bool_mask(mask)
    safe_labels = torch.where(m, labels, torch.zeros_like(labels))
    nll = -logprobs_from_logits(logits, safe_labels)
    loss = masked_mean(nll, m)
    with torch.no_grad():
        correct = (logits.argmax(dim=-1) == safe_labels).float()
        stats = {"ppl": torch.exp(loss.detach()), "token_accuracy": masked_mean(correct, m)}
    return loss, stats
