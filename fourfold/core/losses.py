"""Training losses: the PPO-family policy loss (one wrapper, :func:`ppo_policy_loss`, over a named
table of surrogate terms, ``SURROGATE_TERMS``), (clipped) value loss, REINFORCE, Bradley-Terry
reward-model loss, SFT cross-entropy, the KL-to-reference loss term, DPO (and IPO) on sequence
log-probs; how a per-token loss is aggregated over a batch (``aggregate_loss``). Each loss returns
``(loss, stats)``: ``loss`` a 0-d tensor to backpropagate, ``stats`` a dict of detached 0-d tensors
for logging (no host sync). The lists of names (policy losses, ratio levels, aggregations, DPO
losses) are :mod:`fourfold.names`'; each table here is checked against its list on import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from fourfold.core.kl import kl_estimate
from fourfold.core.logprobs import logprobs_from_logits
from fourfold.core.masks import as_bool_mask, masked_count, masked_mean, masked_sum
from fourfold.names import DPO_LOSSES, LOSS_AGG_MODES, POLICY_LOSSES, RATIO_LEVELS, check_names

Stats = dict[str, Tensor]


def _zero(x: Tensor) -> Tensor:
    return torch.zeros((), dtype=x.dtype, device=x.device)


def _check_agg(mode: str) -> None:
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {', '.join(LOSS_AGG_MODES)}")


def aggregate_loss(per_token_loss: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """Reduce a per-token loss ``l [B, T]`` over the valid tokens to a 0-d loss. With n_i the valid
    tokens of row i and S the rows with n_i > 0:

        token-mean:           sum_{i,t} m_it l_it / sum_i n_i
        seq-mean-token-mean:  1/|S| sum_{i in S} (1/n_i) sum_t m_it l_it
        seq-mean-token-sum:   1/|S| sum_{i in S}         sum_t m_it l_it

    token-mean (fourfold's PPO default, as in TRL's PPO; DAPO, Yu et al. 2025, argues for it) gives
    every token the same weight. seq-mean-token-mean is GRPO's formula (Shao et al. 2024): each response weighs the
    same whatever its length, so a token of a long response weighs 1/n_i less. Dr. GRPO (Liu et al.
    2025) names the length bias this creates: with a negative advantage a long response is
    penalised less per token than a short one (long wrong answers grow), with a positive one short
    responses are favoured. seq-mean-token-sum removes the 1/n_i; Dr. GRPO divides the sum by a
    constant (the generation budget) instead of by |S|, which only rescales the loss by a
    constant.

    Shapes: ``per_token_loss``, ``mask`` ``[B, T]`` (any ``[..., T]``: the last dim is the
    sequence; a 1-d input is one sequence). Rows without a valid token do not count; no valid token
    at all gives 0 (not NaN). Unknown ``mode`` raises ValueError naming the modes.
    """
    _check_agg(mode)
    if mode == "token-mean":
        return masked_mean(per_token_loss, mask)
    m = as_bool_mask(mask)
    per_seq = masked_sum(per_token_loss, m, dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / masked_count(per_token_loss, m, dim=-1).clamp(min=1)
    return masked_mean(per_seq, m.any(dim=-1))


def aggregation_units(mask: Tensor, mode: str = "token-mean") -> Tensor:
    """The denominator of :func:`aggregate_loss` for ``mode`` (0-d float): the valid tokens for
    token-mean, the rows with a valid token for the seq-mean modes.

    A trainer that splits a batch into row-wise micro-batches weights each micro-batch's aggregate
    by ``aggregation_units(part) / aggregation_units(batch)``; the weighted sum is then the
    aggregate of the whole batch (and so are the accumulated gradients)."""
    _check_agg(mode)
    m = as_bool_mask(mask)
    units = m if mode == "token-mean" else m.any(dim=-1)
    return units.float().sum()


@dataclass(frozen=True)
class ClipBounds:
    """The bounds a surrogate term reads: the ratio's clip range [1 - ``low``, 1 + ``high``] and
    the dual-clip constant ``dual`` (c > 1, or None: off)."""

    low: float
    high: float
    dual: Optional[float] = None


SurrogateTerm = Callable[[Tensor, Tensor, Tensor, ClipBounds], tuple[Tensor, Tensor]]
"""``term(ratio, advantages, logprobs, bounds) -> (objective, clipped)``: the per-token objective
to maximise and where the bounds acted (bool), all ``[B, T]``; the advantages and log-probs come 0
outside the mask (the ratio 1), so the objective is 0 there."""


def clip_term(ratio: Tensor, adv: Tensor, logprobs: Tensor, bounds: ClipBounds) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate (Schulman et al. 2017), ``ppo.policy_loss: clip``:

        term_t = min(r_t A_t, clip(r_t, 1 - low, 1 + high) A_t)       clipped where the second is smaller

    With ``bounds.dual`` = c (dual-clip PPO, Ye et al. 2020): where A_t < 0 the term is
    max(term_t, c A_t), and clipped counts there too. ``logprobs`` are not read (the ratio carries
    the gradient). The gradient is exactly 0 for a token clipped on the side its advantage pushes
    (A > 0 and r > 1 + high, or A < 0 and r < 1 - low)."""
    surr = ratio * adv
    surr_clipped = torch.clamp(ratio, 1.0 - bounds.low, 1.0 + bounds.high) * adv
    term, clipped = torch.minimum(surr, surr_clipped), surr_clipped < surr
    if bounds.dual is not None:
        bound = bounds.dual * adv
        dual = (adv < 0) & (term < bound)
        term, clipped = torch.where(dual, bound, term), clipped | dual
    return term, clipped


def cispo_term(ratio: Tensor, adv: Tensor, logprobs: Tensor, bounds: ClipBounds) -> tuple[Tensor, Tensor]:
    """CISPO's clipped-weight policy gradient (MiniMax-M1, 2025), ``ppo.policy_loss: cispo``:

        term_t = sg(min(r_t, 1 + high)) A_t logprobs_t                clipped where r_t > 1 + high

    The clipped ratio is a detached weight (no lower clip), so every token keeps a gradient (through
    ``logprobs``). ``bounds.low`` and ``bounds.dual`` are not read."""
    return torch.clamp(ratio, max=1.0 + bounds.high).detach() * adv * logprobs, ratio > 1.0 + bounds.high


SURROGATE_TERMS: dict[str, SurrogateTerm] = {"clip": clip_term, "cispo": cispo_term}
"""The surrogate terms by name (``ppo.policy_loss``; the names are fourfold.names.POLICY_LOSSES).
A new policy loss is a new pure term here and its name there; :func:`ppo_policy_loss` owns the
ratio level, the importance weights, the aggregation and the statistics for all of them."""
check_names("fourfold.core.losses.SURROGATE_TERMS", POLICY_LOSSES, SURROGATE_TERMS)


def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    *,
    clip_eps_low: Optional[float] = None,
    clip_eps_high: Optional[float] = None,
    agg: str = "token-mean",
    dual_clip: Optional[float] = None,
    ratio_level: str = "token",
    kind: str = "clip",
    token_weights: Optional[Tensor] = None,
) -> tuple[Tensor, Stats]:
    """The one wrapper of the PPO-family policy losses: it forms the ratio (``ratio_level``), applies
    the surrogate term ``SURROGATE_TERMS[kind]``, weights (``token_weights``), aggregates (``agg``)
    and measures (stats). By default PPO's clipped surrogate, a token-level mean over valid tokens:

        r_t  = exp(logprobs_t - old_logprobs_t)
        loss = -aggregate_loss( w_t * term(r_t, A_t, logprobs_t), agg )
        clip:  term = min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)

    eps_low = ``clip_eps_low`` and eps_high = ``clip_eps_high``, each ``clip_eps`` when None (the
    symmetric clip of PPO). A larger eps_high ("clip-higher", DAPO: Yu et al. 2025, 0.2 / 0.28)
    lets low-probability tokens with a positive advantage grow further. ``agg`` is one of
    ``aggregate_loss``'s modes (default token-mean: the plain masked mean).

    Options (each off by default, leaving the default computation unchanged):
    * ``dual_clip`` = c > 1 (Ye et al. 2020; :func:`clip_term`): a huge ratio on a negative
      advantage has a bounded loss (gradient 0 past r = c).
    * ``ratio_level`` 'sequence' (GSPO, Zheng et al. 2025): every token of response i uses
      s_i = exp(mean_t (logprobs_t - old_logprobs_t)), the geometric mean of its token ratios (a
      mean of the log-ratios, not a sum: the length does not enter), clipped as r_t.
    * ``kind`` 'cispo' (:func:`cispo_term`; any name of ``SURROGATE_TERMS``).
    * ``token_weights`` ``[B, T]`` (constants): each token's term times w_t before the aggregation
      (the rollout correction's, :func:`fourfold.core.correction.rollout_correction_weights`).

    Shapes: all ``[B, T]`` (or any shape, e.g. flattened ``[N]`` env steps with token-mean; 'sequence'
    needs ``[B, T]``). ``old_logprobs`` and ``advantages`` are constants (detached).

    stats (token-level means whatever ``agg``): ``clipfrac`` share of valid tokens where the clipped
    term is strictly smaller (clipped branch active; cispo: where the weight's cap cut it; with
    ``dual_clip`` where the dual bound acted too); ``approx_kl`` masked mean of (r - 1) - log r on
    the token ratios, the k3 estimate of KL(pi_old || pi); ``ratio_mean``; ``ratio_max`` (0 when no
    token is valid); ``ratio_abs_dev`` mean |r - 1| (exactly 0 when pi equals pi_old); all on the
    ratio the loss uses (the sequence ratio under 'sequence'); ``dual_clipfrac`` share of valid
    tokens where the dual-clip bound c A_t is the term (A_t < 0 and r_t > c: the bound is below
    min(r A, clip(r) A), so the token's gradient is 0; exactly 0 without ``dual_clip`` or under
    cispo, which does not read it; these tokens count in ``clipfrac`` too).
    """
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"unknown ratio level {ratio_level!r}; expected one of {', '.join(RATIO_LEVELS)}")
    if kind not in SURROGATE_TERMS:
        raise ValueError(f"unknown policy loss {kind!r}; expected one of {', '.join(POLICY_LOSSES)}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    eps_low = clip_eps if clip_eps_low is None else clip_eps_low
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    m = as_bool_mask(mask)
    zero = _zero(logprobs)
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), zero)
    token_log_ratio = log_ratio
    if ratio_level == "sequence":
        n = m.sum(-1, keepdim=True).clamp(min=1).to(log_ratio.dtype)
        log_ratio = torch.where(m, (log_ratio.sum(-1, keepdim=True) / n).expand_as(log_ratio), zero)
    ratio = torch.exp(log_ratio)
    adv = torch.where(m, advantages.detach().to(ratio.dtype), zero)
    bounds = ClipBounds(eps_low, eps_high, dual_clip)
    term, clipped = SURROGATE_TERMS[kind](ratio, adv, torch.where(m, logprobs, zero), bounds)
    if token_weights is not None:
        term = term * torch.where(m, token_weights.detach().to(term.dtype), zero)
    loss = -aggregate_loss(term, m, agg)
    return loss, _policy_stats(ratio, token_log_ratio, adv, clipped, m, dual_clip if kind == "clip" else None)


def _policy_stats(ratio: Tensor, token_log_ratio: Tensor, adv: Tensor, clipped: Tensor, m: Tensor,
                  dual_clip: Optional[float]) -> Stats:
    """:func:`ppo_policy_loss`'s statistics (its docstring says each), detached."""
    zero = _zero(ratio)
    with torch.no_grad():
        token_ratio = torch.exp(token_log_ratio)
        stats = {
            "clipfrac": masked_mean(clipped.to(ratio.dtype), m),
            "approx_kl": masked_mean((token_ratio - 1.0) - token_log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
            "ratio_max": torch.where(m, ratio, zero).max() if ratio.numel() else zero,
            "ratio_abs_dev": masked_mean((ratio - 1.0).abs(), m),
            "dual_clipfrac": (zero if dual_clip is None
                              else masked_mean(((adv < 0) & (ratio > dual_clip)).to(ratio.dtype), m)),
        }
    return {k: v.detach() for k, v in stats.items()}


def kl_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    kind: str = "k3",
    agg: str = "token-mean",
) -> tuple[Tensor, Stats]:
    """KL(pi || pi_ref) as a loss term (GRPO, Shao et al. 2024: the KL leaves the reward and is
    added to the policy loss as ``beta * kl_loss``), with d_t = logprobs_t - ref_logprobs_t:

        loss = aggregate_loss( kl_estimate(d_t, kind), agg )        k3: exp(-d) - 1 + d  (GRPO's)

    k3 is >= 0 and unbiased for the KL of the sampled tokens; its gradient in logprobs is
    1 - exp(-d) per token, pulling log pi towards log pi_ref. ``kind`` is any of ``KL_KINDS``
    (k1's gradient is constant, so k1 is no useful loss; it is allowed for measurements).
    ``ref_logprobs`` is a constant (detached); ``logprobs`` carry the gradient.

    Shapes: all ``[B, T]`` (any ``[..., T]``). Masked entries never influence the loss or its
    gradient (replaced before the exponential). stats: ``kl`` the token-level mean of the estimate,
    whatever ``agg``.
    """
    m = as_bool_mask(mask)
    zero = _zero(logprobs)
    ref = torch.where(m, ref_logprobs.detach().to(logprobs.dtype), zero)
    per_token = kl_estimate(torch.where(m, logprobs, zero), ref, kind)
    loss = aggregate_loss(per_token, m, agg)
    return loss, {"kl": masked_mean(per_token.detach(), m)}


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
    clipping; V_clip is V itself where |V - V_old| <= eps, so float rounding never counts as
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
        delta = v - old
        # V itself where the clip is inactive: old + (v - old) can round away from v, and a
        # difference of rounding would count as clipping (and differ between batchings)
        v_clip = torch.where(delta.abs() > clip_eps, old + torch.clamp(delta, -clip_eps, clip_eps), v)
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
    weights: Optional[Tensor] = None,
) -> tuple[Tensor, Stats]:
    """REINFORCE (Williams 1992) with a baseline, token-level mean over valid tokens:

        loss = -masked_mean(logprobs * (returns - baseline))

    ``weights`` ``[B, T]`` (constants, None = 1): each token's term multiplied by w_t, the rollout
    correction's importance weights (:func:`fourfold.core.correction.rollout_correction_weights`).

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
    if weights is not None:
        lp = lp * torch.where(m, weights.detach().to(lp.dtype), _zero(lp))
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


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    kind: str = "sigmoid",
    chosen_tokens: Optional[Tensor] = None,
    rejected_tokens: Optional[Tensor] = None,
) -> tuple[Tensor, Stats]:
    """Direct preference optimisation on sequence log-probs (sums over each response's tokens,
    :func:`~fourfold.core.logprobs.sequence_logprobs`), with pc, pr the policy's and rc, rr the
    reference's log-probs of the chosen and the rejected response, nc, nr their numbers of response
    tokens (``chosen_tokens``, ``rejected_tokens``), and the log-ratio margin

        h = (pc - rc) - (pr - rr)

    kind 'sigmoid' (DPO, Rafailov et al. 2023; eps = ``label_smoothing``, the conservative DPO of
    Mitchell 2023: each label is taken to be flipped with probability eps):

        loss = mean( -(1 - eps) * log sigmoid(beta * h) - eps * log sigmoid(-beta * h) )

    kind 'ipo' (IPO, Azar et al. 2023: regresses the margin to a finite target instead of pushing
    it to infinity), on per-token mean log-ratios, as the IPO authors and TRL's ``loss_type='ipo'``
    compute it (the squared loss would otherwise grow with the responses' length):

        h_mean = (pc - rc) / nc - (pr - rr) / nr          (nc, nr clamped to >= 1)
        loss   = mean( (h_mean - 1 / (2 * beta))^2 )

    kind 'ipo_sum': the same on the summed margin, ``mean((h - 1 / (2 * beta))^2)`` (fourfold's
    'ipo' before it followed the authors). ``label_smoothing`` must be 0 for both IPO kinds; only
    'ipo' reads the token counts (it needs them: ValueError without), the others ignore them.

    The implicit rewards are r_c = beta * (pc - rc) and r_r = beta * (pr - rr) (DPO's reward of a
    response, up to the prompt's constant), summed over the tokens whatever the kind (as TRL's
    ``rewards/*``). ``ref_*`` are constants (detached); gradients flow into ``policy_*``. Shapes: all
    ``[B]`` (any matching shape). ``beta`` must be > 0; an unknown ``kind`` raises ValueError
    naming the kinds.

    stats (0-d, detached): ``reward_margin`` mean r_c - r_r (= beta * h); ``accuracy`` share of
    pairs with r_c > r_r strictly; ``chosen_reward``, ``rejected_reward`` means of r_c and r_r.
    """
    if kind not in DPO_LOSSES:
        raise ValueError(f"unknown DPO loss {kind!r}; expected one of {', '.join(DPO_LOSSES)}")
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    if kind != "sigmoid" and label_smoothing != 0:
        raise ValueError(f"label_smoothing applies to the sigmoid loss only; {kind} has none")
    if kind == "ipo" and (chosen_tokens is None or rejected_tokens is None):
        raise ValueError("the ipo loss averages over each response's tokens: pass chosen_tokens and rejected_tokens")
    chosen_ratio = policy_chosen_logps - ref_chosen_logps.detach()  # (B,) log pi/pi_ref of the chosen
    rejected_ratio = policy_rejected_logps - ref_rejected_logps.detach()  # (B,)
    h = chosen_ratio - rejected_ratio
    if kind == "sigmoid":
        per_pair = -(1.0 - label_smoothing) * F.logsigmoid(beta * h) - label_smoothing * F.logsigmoid(-beta * h)
    elif kind == "ipo":
        nc = chosen_tokens.detach().to(chosen_ratio.dtype).clamp(min=1.0)  # (B,)
        nr = rejected_tokens.detach().to(rejected_ratio.dtype).clamp(min=1.0)  # (B,)
        per_pair = (chosen_ratio / nc - rejected_ratio / nr - 1.0 / (2.0 * beta)) ** 2
    else:
        per_pair = (h - 1.0 / (2.0 * beta)) ** 2
    loss = per_pair.mean()
    with torch.no_grad():
        chosen_reward, rejected_reward = beta * chosen_ratio, beta * rejected_ratio
        stats = {
            "reward_margin": (chosen_reward - rejected_reward).mean(),
            "accuracy": (chosen_reward > rejected_reward).to(h.dtype).mean(),
            "chosen_reward": chosen_reward.mean(),
            "rejected_reward": rejected_reward.mean(),
        }
    return loss, {k: v.detach() for k, v in stats.items()}
