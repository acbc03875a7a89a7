"""fourfold.core: the pure math of RLHF (torch and the standard library only; no I/O, no state).

Conventions: per-token tensors are ``[B, T]``, per-sequence ``[B]``; ``mask`` is float or bool with
1 (True) = valid, 0 = padding / after EOS. Functions also accept other shapes where that makes sense
(e.g. losses on flattened ``[N]`` environment steps).

The lists of names the config keys take (estimators, policy losses, ratio levels, aggregations, KL
estimates, correction modes, DPO losses, truncation modes) are written once, in the torch-free
:mod:`fourfold.names` that fourfold.config reads too; the constants here are those same tuples, and
the registry and tables that implement them are checked against them on import.
"""

from fourfold.core.advantages import (
    discounted_returns,
    explained_variance,
    gae,
    grpo_advantages,
    mean_baseline,
    reinforce_pp_advantages,
    rloo_advantages,
)
from fourfold.core.correction import (
    CORRECTION_MODES,
    CORRECTION_WEIGHTS,
    effective_sample_size,
    frac_zero_std,
    group_keep,
    mismatch_stats,
    overlong_penalty,
    rollout_correction_weights,
    zero_std_groups,
)
from fourfold.core.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    Estimator,
    get_advantage_estimator,
    register_advantage_estimator,
)
from fourfold.core.gradients import GradMoments, flat_grad, grad_snr, leave_one_out_baseline, snr_from_moments
from fourfold.core.kl import KL_KINDS, AdaptiveKLController, FixedKLController, kl_estimate, token_rewards
from fourfold.core.logprobs import dense_logprobs, entropy_from_logits, logprobs_from_logits, sequence_logprobs
from fourfold.core.losses import (
    DPO_LOSSES,
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    RATIO_LEVELS,
    SURROGATE_TERMS,
    ClipBounds,
    aggregate_loss,
    aggregation_units,
    bradley_terry_loss,
    cispo_term,
    clip_term,
    dpo_loss,
    kl_loss,
    ppo_policy_loss,
    reinforce_loss,
    sft_loss,
    value_loss,
)
from fourfold.core.masks import (
    as_bool_mask,
    first_valid_index,
    last_valid_index,
    mask_from_lengths,
    mask_until_eos,
    masked_count,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from fourfold.core.types import Rollout

__all__ = [
    "Rollout",
    "as_bool_mask",
    "masked_sum",
    "masked_count",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "last_valid_index",
    "first_valid_index",
    "mask_from_lengths",
    "mask_until_eos",
    "logprobs_from_logits",
    "dense_logprobs",
    "entropy_from_logits",
    "sequence_logprobs",
    "KL_KINDS",
    "kl_estimate",
    "token_rewards",
    "FixedKLController",
    "AdaptiveKLController",
    "gae",
    "discounted_returns",
    "mean_baseline",
    "leave_one_out_baseline",
    "GradMoments",
    "flat_grad",
    "grad_snr",
    "snr_from_moments",
    "explained_variance",
    "grpo_advantages",
    "rloo_advantages",
    "reinforce_pp_advantages",
    "AdvantageInputs",
    "ADVANTAGE_ESTIMATORS",
    "Estimator",
    "register_advantage_estimator",
    "get_advantage_estimator",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "RATIO_LEVELS",
    "SURROGATE_TERMS",
    "ClipBounds",
    "clip_term",
    "cispo_term",
    "CORRECTION_MODES",
    "CORRECTION_WEIGHTS",
    "mismatch_stats",
    "rollout_correction_weights",
    "effective_sample_size",
    "overlong_penalty",
    "zero_std_groups",
    "frac_zero_std",
    "group_keep",
    "aggregate_loss",
    "aggregation_units",
    "ppo_policy_loss",
    "kl_loss",
    "value_loss",
    "reinforce_loss",
    "bradley_terry_loss",
    "sft_loss",
    "DPO_LOSSES",
    "dpo_loss",
]
