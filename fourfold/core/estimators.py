"""The advantage-estimator registry: one common signature, so a trainer picks an estimator by name
(``ppo.advantage``) and calls it without branching on which one it is.

    estimator = get_advantage_estimator(name)          # an Estimator record
    if estimator.needs_critic: ...load a critic...
    advantages, returns = estimator(AdvantageInputs(rewards, mask, values, group_size, gamma, lam))

Registered here: ``gae`` (needs a critic), ``grpo``, ``dr_grpo``, ``rloo``, ``reinforce_pp`` (no
critic). A new estimator is a pure function of :class:`AdvantageInputs` decorated with
:func:`register_advantage_estimator`; the registry holds an :class:`Estimator` record per name
(the function and whether it reads critic values), as verl's registry keys its functions by name.
The names ``ppo.advantage`` takes and which of them read a critic are written once, in
:mod:`fourfold.names` (ADVANTAGE_NAMES, CRITIC_ADVANTAGES); the built-in registry is checked
against them on import (a name without an estimator, or an estimator without a name, stops it).

Where the KL penalty goes is decided once, by the rewards the caller passes: ``rewards`` are the
token rewards of ``token_rewards`` (the score on the last valid token), with the KL penalty in
them when the KL is in the reward (``kl_in: reward``) and without it (``kl_coef = 0``) when the KL
is a loss term (``kl_in: loss``). Outcome estimators (grpo, dr_grpo, rloo) baseline the sequence
reward R_i = sum_t rewards[i, t]: the outcome score alone under ``kl_in: loss`` (GRPO's setting),
score - beta * sum_t KL_t under ``kl_in: reward`` (RLOO's and REINFORCE++'s setting). So no
estimator silently drops a KL penalty the caller put in the reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from torch import Tensor

from fourfold.core.advantages import gae, grpo_advantages, reinforce_pp_advantages, rloo_advantages
from fourfold.core.masks import masked_sum
from fourfold.names import ADVANTAGE_NAMES, CRITIC_ADVANTAGES, check_names

AdvantageEstimator = Callable[["AdvantageInputs"], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class AdvantageInputs:
    """Everything any registered estimator may read (each reads what it needs).

    ``rewards [B, T]``: token rewards (score on the last valid token; the KL penalty on every token
    when the KL is in the reward). ``mask [B, T]``: 1 = valid response token. ``values [B, T]``:
    critic values V_old, required by estimators with ``needs_critic`` and ignored by the others
    (None without a critic). ``group_size``: K, the samples per prompt on K consecutive rows
    (B = n_prompts * K; group estimators require K | B). ``gamma``, ``lam``: discount and GAE
    lambda (gamma is also REINFORCE++'s discount; outcome estimators use neither).

    Construction checks that ``rewards`` and ``values`` have ``mask``'s 2-d shape and K >= 1
    (ValueError naming the field).
    """

    rewards: Tensor
    mask: Tensor
    values: Optional[Tensor] = None
    group_size: int = 1
    gamma: float = 1.0
    lam: float = 0.95

    def __post_init__(self) -> None:
        shape = tuple(self.mask.shape)
        if len(shape) != 2:
            raise ValueError(f"AdvantageInputs.mask has shape {shape}: expected [B, T]")
        for name in ("rewards", "values"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != shape:
                raise ValueError(
                    f"AdvantageInputs.{name} has shape {tuple(value.shape)}: expected mask's shape {shape}")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"AdvantageInputs.group_size must be an integer >= 1, got {self.group_size!r}")


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator: ``name``, the pure function ``fn(inputs: AdvantageInputs)
    -> (advantages [B, T], returns [B, T])`` and ``needs_critic`` (True: it reads
    ``inputs.values``, so the trainer must load and train a critic on ``returns``; False: the
    trainer loads none). Calling the record calls ``fn``."""

    name: str
    fn: AdvantageEstimator
    needs_critic: bool = False

    def __call__(self, inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
        return self.fn(inputs)


ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {}


def register_advantage_estimator(
    name: str, *, needs_critic: Optional[bool] = None
) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: register ``fn(inputs: AdvantageInputs) -> (advantages [B, T], returns [B, T])``
    under ``name`` as an :class:`Estimator` record with ``needs_critic`` (None: as
    fourfold.names.CRITIC_ADVANTAGES says, so False for a name not listed there). Registering a
    name twice raises ValueError. Returns ``fn`` unchanged."""

    def register(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        critic = name in CRITIC_ADVANTAGES if needs_critic is None else needs_critic
        ADVANTAGE_ESTIMATORS[name] = Estimator(name, fn, critic)
        return fn

    return register


def get_advantage_estimator(name: str) -> Estimator:
    """The :class:`Estimator` registered under ``name``; ValueError listing the known names otherwise."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        known = ", ".join(sorted(ADVANTAGE_ESTIMATORS))
        raise ValueError(f"unknown advantage estimator {name!r}; known: {known}") from None


def _sequence_rewards(inputs: AdvantageInputs) -> Tensor:
    """R_i = sum_t rewards[i, t] over the valid tokens: the score plus the summed KL penalty
    carried by the token rewards (none under ``kl_in: loss``). ``[B]``."""
    return masked_sum(inputs.rewards.detach(), inputs.mask, dim=-1)


@register_advantage_estimator("gae")  # needs a critic: fourfold.names.CRITIC_ADVANTAGES
def gae_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GAE(gamma, lam) on the token rewards with the critic's values (:func:`gae`); needs a critic.
    ValueError when ``inputs.values`` is None."""
    if inputs.values is None:
        raise ValueError("the 'gae' advantage estimator needs critic values (AdvantageInputs.values is None)")
    return gae(inputs.rewards, inputs.values, inputs.mask, inputs.gamma, inputs.lam)


@register_advantage_estimator("grpo")
def grpo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """GRPO: (R_i - mean_g) / (std_g + eps) per group of ``group_size`` (:func:`grpo_advantages`),
    R_i the summed token rewards. No critic."""
    return grpo_advantages(_sequence_rewards(inputs), inputs.mask, inputs.group_size)


@register_advantage_estimator("dr_grpo")
def dr_grpo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """Dr. GRPO's advantage: R_i - mean_g, no std division (:func:`grpo_advantages` with
    ``scale_by_std=False``). The method's other half is the loss aggregation
    (``seq-mean-token-sum``, see ``aggregate_loss``), chosen separately. No critic."""
    return grpo_advantages(_sequence_rewards(inputs), inputs.mask, inputs.group_size, scale_by_std=False)


@register_advantage_estimator("rloo")
def rloo_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """RLOO: R_i - mean of the other K - 1 rewards of its group (:func:`rloo_advantages`), R_i the
    summed token rewards (score - beta * sum KL under ``kl_in: reward``, as in the RLOO paper).
    No critic."""
    return rloo_advantages(_sequence_rewards(inputs), inputs.mask, inputs.group_size)


@register_advantage_estimator("reinforce_pp")
def reinforce_pp_estimator(inputs: AdvantageInputs) -> tuple[Tensor, Tensor]:
    """REINFORCE++: discounted returns (gamma) of the token rewards, whitened over the batch's valid
    tokens (:func:`reinforce_pp_advantages`); ignores ``group_size``. No critic."""
    return reinforce_pp_advantages(inputs.rewards, inputs.mask, inputs.gamma)


check_names("fourfold.core.estimators.ADVANTAGE_ESTIMATORS", ADVANTAGE_NAMES, ADVANTAGE_ESTIMATORS)
